"""Shared helpers of the spec modules: reading JSON files and turning pydantic errors into SpecError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfcast.errors import SpecError


def read_json(path: Path) -> Any:
    """Parse a JSON file; SpecError names the path and what went wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: invalid JSON: {exc}") from None


def to_spec_error(exc: ValidationError, where: str) -> SpecError:
    """One clause per pydantic error, ``field=value: message``, prefixed by ``where``."""
    parts = []
    for err in exc.errors():
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        loc = ".".join(str(p) for p in err.get("loc", ()))
        if loc and err.get("type") == "extra_forbidden":
            parts.append(f"{loc}: unknown field (typo?)")
        elif loc:
            parts.append(f"{loc}={err.get('input')!r}: {msg}")
        else:
            parts.append(msg)
    return SpecError(f"{where}: " + "; ".join(parts))
