"""The repository's docs describe every run-table input the parser reads."""

from __future__ import annotations

from pathlib import Path

from perfcast.features.run_config import RUN_INPUT_FIELDS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_run_table_input_is_documented() -> None:
    text = "".join(path.read_text(encoding="utf-8") for path in DOCS.glob("*.md"))
    missing = [name for name in RUN_INPUT_FIELDS if f"`{name}`" not in text]
    assert not missing, f"document these run-table columns in docs/: {missing}"
