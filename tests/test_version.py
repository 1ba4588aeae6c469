"""The version recorded in cards and manifests."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from perfcast import _version
from perfcast._version import SOURCE_TREE_SUFFIX, _source_tree_version, perfcast_version


def test_installed_version_or_source_tree_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    assert perfcast_version() == metadata.version("perfcast")

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_version.metadata, "version", missing)
    assert perfcast_version() == metadata.distribution("perfcast").version + SOURCE_TREE_SUFFIX


def test_source_tree_version_rejects_other_projects(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "1.0"\n')
    assert _source_tree_version(tmp_path / "pyproject.toml") == "unknown"
    assert _source_tree_version(tmp_path / "absent.toml") == "unknown"
    (tmp_path / "bad.toml").write_text("[project\n")
    assert _source_tree_version(tmp_path / "bad.toml") == "unknown"
    (tmp_path / "ok.toml").write_text('[project]\nname = "perfcast"\nversion = "9.9"\n')
    assert _source_tree_version(tmp_path / "ok.toml") == "9.9+src"
