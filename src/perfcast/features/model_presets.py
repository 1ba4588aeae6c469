"""The preset model catalog: ids of the shipped model specs and the lookup of a name among them.

Presets are package data (``features/catalog/models/<id>.json``); a name matches an id
ignoring case, spaces and ``_``, then ignoring punctuation. Reading an entry into a spec is
:meth:`perfcast.features.model.TransformerSpec.from_name`.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from importlib import resources

from perfcast.errors import UnknownEntryError

CATALOG_PACKAGE = "perfcast.features"
"""Package whose ``catalog/models`` folder holds the presets."""


def list_models() -> list[str]:
    """Ids of the preset models in the catalog, sorted."""
    return list(_preset_ids())


@lru_cache(maxsize=1)
def _preset_ids() -> tuple[str, ...]:
    root = resources.files(CATALOG_PACKAGE).joinpath("catalog").joinpath("models")
    names = (p.name for p in root.iterdir())
    return tuple(sorted(n.removesuffix(".json") for n in names if n.endswith(".json")))


def _normalize(name: str) -> str:
    return "-".join(str(name).strip().lower().replace("_", "-").split())


def _compact(name: str) -> str:
    return "".join(c for c in name if c.isalnum() or c == ".")


def resolve_preset_id(name: str) -> str:
    """Preset id of ``name``.

    Raises:
        UnknownEntryError: no preset matches; the message suggests close ids.
    """
    ids = _preset_ids()
    key = _normalize(name)
    if key in ids:
        return key
    compact = [i for i in ids if _compact(i) == _compact(key)]
    if len(compact) == 1:
        return compact[0]
    close = difflib.get_close_matches(key, ids, n=3, cutoff=0.5)
    hint = f"; did you mean: {', '.join(close)}?" if close else f"; known models: {', '.join(ids)}"
    raise UnknownEntryError(f"model={name!r} is not a known preset{hint}")
