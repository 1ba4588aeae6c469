"""perfcast: predict the time of deep-learning operators and of distributed training steps.

The Python entry points (see :mod:`perfcast.serve.python_api`): :func:`predict_steps`,
:func:`predict_ops`, :func:`search` and :func:`load_predictor`. They are imported on first
use, so ``import perfcast`` stays light.
"""

from __future__ import annotations

from typing import Any

from perfcast._version import perfcast_version

__version__ = perfcast_version()
__all__ = ["__version__", "load_predictor", "predict_ops", "predict_steps", "search"]
_API = frozenset({"load_predictor", "predict_ops", "predict_steps", "search"})


def __getattr__(name: str) -> Any:
    if name in _API:
        from perfcast.serve import python_api

        return getattr(python_api, name)
    raise AttributeError(f"module 'perfcast' has no attribute {name!r}")
