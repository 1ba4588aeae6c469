"""Parts of perfcast that need an optional extra, and the error that says which to install."""

from __future__ import annotations

import importlib.util

from perfcast.errors import PerfcastError

EXTRAS = {
    "torch": "gnn",
    "torch_geometric": "gnn",
    "fastapi": "serve",
    "uvicorn": "serve",
    "dask": "dask",
    "distributed": "dask",
}
"""The extra (``pip install 'perfcast[EXTRA]'``) that brings each optional module."""


def require(*modules: str, purpose: str) -> None:
    """Check that ``modules`` can be imported before ``purpose`` runs.

    Raises:
        PerfcastError: naming the missing module and the extra that installs it.
    """
    for module in modules:
        if importlib.util.find_spec(module) is None:
            extra = EXTRAS.get(module, "all")
            raise PerfcastError(f"{purpose} needs {module}: pip install 'perfcast[{extra}]'")
