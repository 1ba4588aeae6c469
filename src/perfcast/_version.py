"""The perfcast version, recorded in dataset cards and bundle manifests."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

SOURCE_TREE_SUFFIX = "+src"
"""Appended to the version read from the source tree's ``pyproject.toml`` (no installed metadata)."""


def perfcast_version() -> str:
    """Version of the installed perfcast distribution.

    Run from a bare source tree (``src/`` on ``PYTHONPATH``, as on a lent GPU machine), the
    version comes from the tree's ``pyproject.toml`` with :data:`SOURCE_TREE_SUFFIX`;
    ``unknown`` when neither exists.
    """
    try:
        return metadata.version("perfcast")
    except metadata.PackageNotFoundError:
        return _source_tree_version(Path(__file__).resolve().parents[2] / "pyproject.toml")


def _source_tree_version(pyproject: Path) -> str:
    """``<version>+src`` from a perfcast ``pyproject.toml``; ``unknown`` if it is missing or not perfcast's.

    Reads the ``[project]`` table's ``name`` and ``version`` lines (``tomllib`` needs Python 3.11).
    """
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    table = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, flags=re.M | re.S)
    body = table.group(1) if table else ""
    name = re.search(r'^name\s*=\s*"([^"]+)"', body, flags=re.M)
    version = re.search(r'^version\s*=\s*"([^"]+)"', body, flags=re.M)
    if not (name and version) or name.group(1) != "perfcast":
        return "unknown"
    return version.group(1) + SOURCE_TREE_SUFFIX
