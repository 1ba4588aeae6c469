"""Where a run row's ``model`` may come from: presets, inline configs, and files a policy allows.

A local user (the CLI, the Python API) may name any ``config.json`` on their machine. A
service must not: a request that names a server path would make the server read files the
operator never meant to expose. :class:`ModelSource` resolves a ``model`` reference under
one of these two policies:

* ``ModelSource()``: a preset id, an inline config (a mapping) or any file path, as
  :meth:`TransformerSpec.load <perfcast.features.model.TransformerSpec.load>` reads them.
* ``ModelSource.restricted(dirs)``: a preset id, an inline config, or a file *inside* one
  of ``dirs`` (after resolving links), of at most :data:`MAX_CONFIG_BYTES`. Files are read
  once and their specs cached by content hash. Errors never quote a file's contents, and a
  path outside ``dirs`` gets the same message whether or not it exists.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perfcast.errors import PerfcastError, SpecError
from perfcast.features.model import TransformerSpec, looks_like_hf_config, looks_like_path

MAX_CONFIG_BYTES = 1 << 20
"""Largest model config file a restricted source reads, bytes (configs are a few KB)."""
_CACHE_ENTRIES = 256


class ModelSource:
    """Resolves ``model`` references (a preset id, a path, or an inline mapping) to specs.

    Args:
        allowed_dirs: with ``restricted=True``, the folders whose files may be read.
        restricted: read files only inside ``allowed_dirs`` (none when it is empty).
    """

    def __init__(self, allowed_dirs: Sequence[str | Path] = (), *, restricted: bool = False) -> None:
        self.restricted = restricted
        self.allowed_dirs = tuple(Path(d).resolve() for d in allowed_dirs)
        self._by_content: OrderedDict[str, TransformerSpec] = OrderedDict()
        self._lock = threading.Lock()  # a service resolves from several prediction threads

    @classmethod
    def restricted_to(cls, allowed_dirs: Sequence[str | Path] = ()) -> ModelSource:
        """A source that reads files only inside ``allowed_dirs`` (no file at all when empty)."""
        return cls(allowed_dirs, restricted=True)

    def resolve(self, ref: str | Mapping[str, Any]) -> TransformerSpec:
        """The spec of ``ref``: an inline config mapping (perfcast fields or a Hugging Face
        ``config.json``'s), a preset id, or a config file the policy allows.

        Raises:
            SpecError: an invalid inline config, a file the policy does not allow, or a
                file that is not a model config.
            UnknownEntryError: neither a preset nor an allowed file; suggests presets.
        """
        if isinstance(ref, Mapping):
            return inline_model(ref)
        text = str(ref).strip()
        if not self.restricted:
            return TransformerSpec.load(text)
        path = self._allowed_file(text)
        if path is not None:
            return self._read_allowed(text, path)
        if looks_like_path(text) or text.startswith("."):
            where = "model configs only from its --model-dir folders" if self.allowed_dirs else "no model files"
            raise SpecError(
                f"model={text!r}: this service reads {where}; "
                "give a preset id (GET /v1/models) or the config itself as a JSON object"
            )
        return TransformerSpec.from_name(text)

    def _allowed_file(self, text: str) -> Path | None:
        """The config file ``text`` names inside an allowed folder, or None."""
        for folder in self.allowed_dirs:
            try:
                candidate = (folder / text).resolve()
                if not candidate.is_relative_to(folder):
                    continue
                if candidate.is_dir():
                    candidate = candidate / "config.json"
                if candidate.is_file():
                    return candidate
            except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte, a name too long
                continue
        return None

    def _read_allowed(self, text: str, path: Path) -> TransformerSpec:
        """Read an allowed config file once per content; errors name the reference, never the contents."""
        invalid = SpecError(f"model={text!r}: not a valid perfcast or Hugging Face model config "
                            "(check it with `perfcast models show`)")  # fmt: skip
        try:
            if path.stat().st_size > MAX_CONFIG_BYTES:
                raise SpecError(f"model={text!r}: the config file is larger than {MAX_CONFIG_BYTES} bytes")
            raw = path.read_bytes()
        except OSError:
            raise invalid from None
        digest = hashlib.sha256(raw).hexdigest()
        with self._lock:
            spec = self._by_content.get(digest)
        if spec is None:
            try:
                spec = inline_model(json.loads(raw))
            except (PerfcastError, ValueError, RecursionError):
                raise invalid from None
            with self._lock:
                self._by_content[digest] = spec
                if len(self._by_content) > _CACHE_ENTRIES:
                    self._by_content.popitem(last=False)
        return spec


def inline_model(config: Any) -> TransformerSpec:
    """A spec from a parsed config: a Hugging Face ``config.json`` (has ``model_type`` or
    ``architectures``) or perfcast's own model fields.

    Raises:
        SpecError: not a mapping, or invalid fields (named).
    """
    if not isinstance(config, Mapping):
        raise SpecError(f"model: an inline config must be a JSON object, got {type(config).__name__}")
    if looks_like_hf_config(config):
        return TransformerSpec.from_hf_config(config)
    return TransformerSpec.from_dict(config, where="model")


def model_key(ref: str | Mapping[str, Any]) -> str:
    """A hashable key of a ``model`` reference: the text, or an inline config's canonical JSON."""
    if isinstance(ref, Mapping):
        return json.dumps(ref, sort_keys=True, default=str)
    return str(ref).strip()
