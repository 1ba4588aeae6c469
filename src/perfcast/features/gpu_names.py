"""Device-name resolution: GPU names as torch, nvidia-smi or rocm-smi print them, to catalog ids.

Pure functions over catalog entries given by the caller (``id``, ``name``, ``aliases``,
``form_factor``, ``mem_type``, ``mem_gib``): lookup keys (:func:`normalize_device_name`),
the alias index (:func:`check_alias_index`), the part-family reading of a name and the
did-you-mean suggestions. :func:`perfcast.features.hardware_spec.resolve_gpu_name` applies
them to the loaded catalog.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from perfcast.errors import SpecError, UnknownEntryError

PartIndex = Mapping[str, list[tuple[str, frozenset[str], int, str | None]]]
"""Catalog entries by part family: ``(id, form factors, memory GiB rounded, memory type)``."""

# Leading words that device names carry but catalog keys do not.
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "amd", "instinct", "intel", "habana", "google", "cloud"})
_TRADEMARKS = re.compile(r"\((r|tm|c)\)")


def normalize_device_name(name: str) -> str:
    """Lookup key of a device name: lowercase alphanumerics, leading vendor words dropped.

    ``"NVIDIA A100-SXM4-80GB"``, ``"a100_sxm4_80gb"`` and ``"A100 SXM4 80GB"`` all give
    ``"a100sxm480gb"``; ``"Intel(R) Gaudi(R) 2"`` gives ``"gaudi2"``.
    """
    tokens = re.findall(r"[a-z0-9]+", _TRADEMARKS.sub(" ", str(name).lower()))
    while len(tokens) > 1 and tokens[0] in _VENDOR_WORDS:
        tokens.pop(0)
    return "".join(tokens)


def check_alias_index(specs: list[Any]) -> dict[str, str]:
    """Map every lookup key (id, name, aliases) of catalog entries to its id; fail when a key is ambiguous.

    Raises:
        SpecError: two entries share a lookup key, naming both and the strings.
    """
    index: dict[str, str] = {}
    origin: dict[str, str] = {}
    for spec in specs:
        for text in (spec.id, spec.name, *spec.aliases):
            key = normalize_device_name(text)
            if not key:
                raise SpecError(f"{spec.id}: alias {text!r} has no letters or digits")
            if index.get(key, spec.id) != spec.id:
                raise SpecError(
                    f"ambiguous device name: {text!r} ({spec.id}) and {origin[key]!r} "
                    f"({index[key]}) both normalize to {key!r}"
                )
            index[key] = spec.id
            origin.setdefault(key, text)
    return index


def resolve_device_name(
    name: str,
    alias_index: Callable[[], Mapping[str, str]],
    part_index: Callable[[], PartIndex],
    candidates: Callable[[], Mapping[str, str]],
) -> str:
    """Catalog id of a catalog id, alias or device name, e.g. ``"NVIDIA H100 80GB HBM3"``.

    The first rule that gives an entry:

    1. the lookup key (:func:`normalize_device_name`: case, spaces, punctuation and leading
       vendor words ignored) is an id, name or alias;
    2. a parenthesised description is dropped (``"H200 (WhiteFiber, 400Gb/s RDMA per
       GPU)"``); when the text outside the parentheses has only vendor, architecture and
       "GPU" words (``"NVIDIA Blackwell GPU (GB200)"``) the parenthesised text is used;
    3. the name is read as a part family (``h100``, ``mi300x``), a form factor (``SXM``,
       ``SXM5``, ``HGX``, ``PCIe``, ``NVL``, ``OAM``), a memory size (``80GB``, ``80 GB``,
       ``80G``) and a memory type (``HBM3``), vendor and architecture words ignored; the
       catalog entries of that family that agree with every stated token are kept. One
       left: that entry; several: the one the shortest stated key (family + form + memory,
       family + memory, family + form, family) is an alias of, when it is among them.

    A token the rules do not know (``"CTS"``, ``"500W"``) or a stated figure no entry has
    (``"H100 SXM 96GB"``) leaves the name unresolved: a part is never mapped to another
    part with other figures.

    The catalog comes as three callables, each called only when a rule needs it:
    ``alias_index`` gives the alias index (:func:`check_alias_index`), ``part_index`` the
    entries by part family (:func:`index_parts`) and ``candidates`` the did-you-mean
    strings (:func:`index_suggestions`).

    Raises:
        SpecError: ``name`` is not a non-empty string.
        UnknownEntryError: no entry matches; the message names the closest known part of
            the same family when there is one, else suggests up to 3 close ids.
    """
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"gpu={name!r} must be a non-empty device name or catalog id")
    key = normalize_device_name(name)
    index = alias_index()
    if key in index:
        return index[key]
    closest: tuple[str, str] | None = None
    for text in _name_readings(name):
        found = index.get(normalize_device_name(text))
        if found is None:
            found, near = match_part(text, part_index(), index)
            closest = closest or near
        if found is not None:
            return found
    if closest is not None:
        part, why = closest
        raise UnknownEntryError(
            f"gpu={name!r} is not in the hardware catalog: {why}; closest known part: {part} (not used "
            "in its place, its figures differ; add the part with HardwareSpec.from_file)"
        )
    raise UnknownEntryError(f"gpu={name!r} is not in the hardware catalog{suggest(key, name, candidates())}")


_PARENS = re.compile(r"\(([^()]*)\)")
_IGNORED_WORDS = _VENDOR_WORDS | {
    "gpu", "accelerator", "datacenter", "module", "blackwell", "ultra", "hopper", "ampere", "volta", "turing",
    "pascal", "ada", "lovelace", "cdna", "cdna2", "cdna3", "cdna4",
}  # fmt: skip
"""Words a device name may carry that do not tell catalog parts apart."""
_MEMORY_TOKEN = re.compile(r"(\d+)(?:g|gb|gib)")
_MEMORY_UNITS = frozenset({"g", "gb", "gib"})
_MEMORY_TYPE_TOKEN = re.compile(r"(hbm\d?e?|gddr\d+x?)")
_FORM_TOKEN = re.compile(r"sxm\d?|pcie|nvl|oam|hgx|dgx")


def _name_readings(name: str) -> list[str]:
    """Texts :func:`resolve_gpu_name` tries after the key: outside the parentheses, then inside
    them when the outside has only :data:`_IGNORED_WORDS`."""
    text = _TRADEMARKS.sub(" ", name.lower()).strip()
    outside = _PARENS.sub(" ", text)
    readings = [outside] if outside.strip() else []
    if text.startswith("standard_"):  # an Azure VM size
        readings.append(text.removeprefix("standard_"))
    if all(t in _IGNORED_WORDS for t in re.findall(r"[a-z0-9]+", outside)):
        readings += _PARENS.findall(text)
    return readings


def _part_tokens(text: str) -> dict[str, str] | None:
    """``family``, ``form``, ``memory`` (GB as stated) and ``memory_type`` tokens of a name,
    or ``None`` when it has an unknown word, no family or two of one kind."""
    tokens = [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in _IGNORED_WORDS]
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token, kind = tokens[i], ""
        if token.isdigit() and i + 1 < len(tokens) and tokens[i + 1] in _MEMORY_UNITS:
            kind, i = "memory", i + 1
        elif _MEMORY_TOKEN.fullmatch(token):
            kind, token = "memory", _MEMORY_TOKEN.fullmatch(token).group(1)
        elif _MEMORY_TYPE_TOKEN.fullmatch(token):
            kind = "memory_type"
        elif _FORM_TOKEN.fullmatch(token):
            kind = "form"
            token = "sxm" if token in ("hgx", "dgx") else token
        elif re.fullmatch(r"[a-z]+\d+[a-z]*", token):
            kind = "family"
        if not kind or kind in out:
            return None
        out[kind] = token
        i += 1
    return out if "family" in out else None


def _form_matches(stated: str, forms: frozenset[str]) -> bool:
    """A stated form factor agrees with an entry's: equal, or ``SXM`` of any generation, or an
    ``SXMn`` where the catalog does not give the generation."""
    if stated in forms:
        return True
    return stated.startswith("sxm") and "sxm" in forms and not any(f[3:] for f in forms if f.startswith("sxm"))


def match_part(text: str, part_index: PartIndex, index: Mapping[str, str]) -> tuple[str | None, tuple[str, str] | None]:
    """Rule 3 of :func:`resolve_device_name`: ``(id, None)``, or ``(None, (closest id, why))`` when the
    family is known but no entry has the stated figures, or ``(None, None)``."""
    parsed = _part_tokens(text)
    family_entries = part_index.get(parsed["family"], []) if parsed else []
    if not parsed or not family_entries:
        return None, None
    form, memory, memory_type = parsed.get("form"), parsed.get("memory"), parsed.get("memory_type")
    keep = [
        e for e in family_entries
        if (form is None or _form_matches(form, e[1]))
        and (memory is None or int(memory) == e[2])
        and (memory_type is None or memory_type == e[3])
    ]  # fmt: skip
    if len(keep) == 1:
        return keep[0][0], None
    ids = [e[0] for e in keep]
    for parts in ((form, memory), (memory,), (form,), ()):
        if all(parts):
            found = index.get(parsed["family"] + "".join(f"{p}gb" if p == memory else p for p in parts))
            if found in ids:
                return found, None
    if keep:
        return None, None
    default = index.get(parsed["family"])
    same_form = [e[0] for e in family_entries if form is None or _form_matches(form, e[1])]
    near = default if default in same_form else (same_form or [default or family_entries[0][0]])[0]
    stated = " ".join(
        v for v in (form and form.upper(), memory and f"{memory} GB", memory_type and memory_type.upper()) if v
    )
    known = ", ".join(f"{e[0]} ({e[2]} GiB)" for e in family_entries)
    return None, (near, f"no {parsed['family']} entry has {stated} (known: {known})")


def index_parts(specs: Iterable[Any]) -> PartIndex:
    """``specs`` by part family: ``(id, form factors, memory GiB rounded, memory type)``.

    The family is the first token of the id with letters and digits (``h100`` of
    ``h100-sxm5-80gb``); form factors come from the id and the ``form_factor`` text (plus
    ``sxm`` for any ``sxmN``); the memory type is ``mem_type``'s first word, lowercase.
    """
    out: dict[str, list[tuple[str, frozenset[str], int, str | None]]] = {}
    for spec in specs:
        first = spec.id.split("-")[0]
        if not re.fullmatch(r"[a-z]+\d+[a-z]*", first):
            continue
        words = re.findall(r"[a-z0-9]+", f"{spec.id} {(spec.form_factor or '').split('(')[0]}".lower())
        forms = {"sxm" if w in ("hgx", "dgx") else w for w in words if _FORM_TOKEN.fullmatch(w)}
        forms |= {"sxm"} if any(f.startswith("sxm") for f in forms) else set()
        mem_type = (spec.mem_type or "").lower().split(" ")[0] or None
        out.setdefault(first, []).append((spec.id, frozenset(forms), int(round(spec.mem_gib)), mem_type))
    return out


def suggest(key: str, name: str, candidates: Mapping[str, str]) -> str:
    """'; did you mean: ...?' with up to 3 ids whose id or alias is close to ``name``."""
    ids = close_ids([key, name.strip().lower()], candidates, cutoff=0.6)
    if not ids:
        return " (see `perfcast hardware list`, or load your own entry with HardwareSpec.from_file)"
    return f"; did you mean: {', '.join(ids[:3])}?"


def close_ids(queries: list[str], candidates: Mapping[str, str], *, cutoff: float, n: int = 3) -> list[str]:
    """Up to ``n`` ids whose candidate strings are close to a query.

    Candidates that start with a query come first (a truncated id), then those a query
    starts with, longest first (an id with extra characters), then
    :func:`difflib.get_close_matches` in order of similarity.
    """
    matches = [c for q in queries if q for c in sorted(candidates) if c.startswith(q)]
    matches += sorted((c for q in queries if q for c in candidates if len(c) > 1 and q.startswith(c)), key=len,
                      reverse=True)  # fmt: skip
    for query in queries:
        matches += difflib.get_close_matches(query, list(candidates), n=4 * n, cutoff=cutoff)
    ids: list[str] = []
    for match in matches:
        if candidates[match] not in ids:
            ids.append(candidates[match])
    return ids[:n]


def index_suggestions(specs: Iterable[Any]) -> dict[str, str]:
    """Lowercase ids, aliases and their normalized keys, each mapped to its id."""
    out: dict[str, str] = {}
    for spec in specs:
        for text in (spec.id, *spec.aliases):
            out.setdefault(text.lower(), spec.id)
            out.setdefault(normalize_device_name(text), spec.id)
    return out
