"""Opening a store from a URL: built-in schemes, plugins, and what to install."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import alpineagents.store
from alpineagents import FileStore, open_store


def test_a_folder_or_file_url_is_a_filestore(tmp_path: Path) -> None:
    assert open_store(str(tmp_path / "runs")) == FileStore(tmp_path / "runs")
    assert open_store(f"file://{tmp_path}/runs") == FileStore(tmp_path / "runs")
    synced = open_store(str(tmp_path), fsync=True)  # options go to the store
    assert isinstance(synced, FileStore) and synced.fsync is True


def test_a_missing_s3_plugin_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_plugins(**_: Any) -> list[Any]:
        return []

    monkeypatch.setattr(alpineagents.store, "entry_points", no_plugins)
    with pytest.raises(ValueError, match="scheme 's3'") as raised:
        open_store("s3://bucket/prefix")
    assert str(raised.value) == (
        "no store is registered for the scheme 's3' of 's3://bucket/prefix': install it with "
        "pip install alpineagents-s3 (from a checkout of this repository: "
        "pip install ./packaging/alpineagents-s3)"
    )
    assert "alpineagents[s3]" not in str(raised.value)


def test_an_unknown_scheme_is_refused_without_a_hint() -> None:
    with pytest.raises(ValueError, match=r"no store is registered for the scheme 'gopher'.*'$"):
        open_store("gopher://x/y")


def test_the_store_module_exports_only_the_store_contract() -> None:
    assert sorted(alpineagents.store.__all__) == ["Record", "SavedState", "Store", "open_store"]
