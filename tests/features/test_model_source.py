"""perfcast.features.model_source: which model references a caller may resolve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfcast.errors import SpecError, UnknownEntryError
from perfcast.features.model import TransformerSpec
from perfcast.features.model_source import MAX_CONFIG_BYTES, ModelSource, model_key

SMALL = {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000}
HF = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
      "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 2048}  # fmt: skip


def test_a_local_source_reads_any_path_and_presets(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF))
    source = ModelSource()
    assert source.resolve(str(path)).num_layers == 2
    assert source.resolve("llama2-7b") == TransformerSpec.from_name("llama2-7b")


def test_inline_configs_of_both_kinds_resolve_under_any_policy() -> None:
    for source in (ModelSource(), ModelSource.restricted_to()):
        assert source.resolve(SMALL).hidden_size == 256
        assert source.resolve(HF).num_layers == 2
    with pytest.raises(SpecError, match="num_layers"):
        ModelSource.restricted_to().resolve({**SMALL, "num_layers": 0})


def test_a_restricted_source_opens_no_file_outside_its_folders_and_never_quotes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secrets.json").write_text('{"api_key": "S3CRET"}')
    allowed = tmp_path / "models"
    allowed.mkdir()
    (allowed / "tiny.json").write_text(json.dumps(SMALL))
    (allowed / "bad.json").write_text('{"api_key": "S3CRET"}')
    (allowed / "escape.json").symlink_to(tmp_path / "secrets.json")
    source = ModelSource.restricted_to([allowed])
    assert source.resolve("tiny.json").hidden_size == 256
    messages = []
    for ref in ("secrets.json", "../secrets.json", str(tmp_path / "secrets.json"), "escape.json", "missing.json"):
        with pytest.raises(SpecError) as info:
            source.resolve(ref)
        messages.append(str(info.value).replace(repr(ref), "REF"))
    assert len(set(messages)) == 1, messages  # the same words whether or not the file exists
    with pytest.raises(SpecError) as info:
        source.resolve("bad.json")
    assert "S3CRET" not in str(info.value) and "api_key" not in str(info.value)
    with pytest.raises(UnknownEntryError, match="llama"):
        ModelSource.restricted_to().resolve("llama-2-7")


def test_a_restricted_source_refuses_large_files_and_caches_by_content(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_text(" " * (MAX_CONFIG_BYTES + 1) + json.dumps(SMALL))
    (tmp_path / "a.json").write_text(json.dumps(SMALL))
    (tmp_path / "b.json").write_text(json.dumps(SMALL))
    source = ModelSource.restricted_to([tmp_path])
    with pytest.raises(SpecError, match="larger than"):
        source.resolve("big.json")
    assert source.resolve("a.json") is source.resolve("b.json")  # one spec per content


def test_model_key_is_canonical() -> None:
    assert model_key({"b": 1, "a": 2}) == model_key({"a": 2, "b": 1})
    assert model_key(" llama2-7b ") == "llama2-7b"


def test_a_name_too_long_for_a_path_is_an_unknown_preset_under_either_policy(tmp_path: Path) -> None:
    for source in (ModelSource(), ModelSource.restricted_to([tmp_path])):
        with pytest.raises(UnknownEntryError):
            source.resolve("x" * 5000)
