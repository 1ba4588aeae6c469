"""The installed perfcast version, recorded in dataset cards and bundle manifests."""

from __future__ import annotations

from importlib import metadata


def perfcast_version() -> str:
    """Version of the installed perfcast distribution (``unknown`` when run from a bare tree)."""
    try:
        return metadata.version("perfcast")
    except metadata.PackageNotFoundError:
        return "unknown"
