"""actors/inference/slots/files.py on its own: the sessions' KV state files and their metadata.

The pure decisions (may this file be restored, which files go when the directory is over its
bound, a session's file name) and the store's file work on a real directory: the file the
server saved put in place with its size and crc32, the least recently used deleted first,
nothing of a directory loopd cannot reach touched but its own metadata.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import zlib
from pathlib import Path

import pytest

from actors.base.config import Config
from actors.inference.slots import files as slotfiles
from actors.inference.slots.files import SlotFile, SlotStore


def meta(key: str, *, used: float = 1.0, size: int = 0, crc: int = -1) -> SlotFile:
    return SlotFile(session=key, file=f"{key}.bin", tokens=10, fingerprint="f", server="u",
                    saved=used, used=used, bytes=size, crc32=crc)  # fmt: skip


def test_restore_problem_names_each_reason() -> None:
    meta = slotfiles.SlotFile(session="s", file="s.bin", tokens=10, fingerprint="f",
                              server="u", saved=1.0, used=1.0, bytes=100, crc32=7)
    assert slotfiles.restore_problem(None, "f", None, True) == slotfiles.NO_STATE
    assert slotfiles.restore_problem(meta, "g", (100, 7), True) == slotfiles.STALE
    assert slotfiles.restore_problem(meta, "f", (100, 7), True, n_ctx=9) == (
        slotfiles.TOO_LARGE_FOR_CONTEXT.format(tokens=10, n_ctx=9))
    assert slotfiles.restore_problem(meta, "f", (100, 7), True, n_ctx=10) == ""  # it fits
    assert slotfiles.restore_problem(meta, "f", None, True) == slotfiles.MISSING
    assert slotfiles.restore_problem(meta, "f", (100, 8), True) == slotfiles.CORRUPT
    assert slotfiles.restore_problem(meta, "f", (100, 7), True) == ""
    assert slotfiles.restore_problem(meta, "f", None, False) == ""  # the server checks it


def test_the_context_size_is_no_part_of_the_server_a_state_is_for() -> None:
    made = "model=/m.gguf:469;n_ctx=8192;build=b1"
    assert slotfiles.same_server(made, "model=/m.gguf:469;n_ctx=16384;build=b1")
    assert slotfiles.same_server(made, "model=/m.gguf:469;n_ctx=0;build=b1")
    assert not slotfiles.same_server(made, "model=/m.gguf:469;n_ctx=8192;build=b2")
    assert not slotfiles.same_server(made, "model=/other.gguf:9;n_ctx=8192;build=b1")


def test_lru_victims_go_oldest_first_until_the_rest_fits() -> None:
    def f(name: str, used: float, size: int) -> slotfiles.SlotFile:
        return slotfiles.SlotFile(session=name, file=name, tokens=1, fingerprint="f",
                                  server="u", saved=used, used=used, bytes=size)

    files = [f("new", 3, 40), f("old", 1, 40), f("mid", 2, 40)]
    assert [v.file for v in slotfiles.lru_victims(files, 80)] == ["old"]
    assert [v.file for v in slotfiles.lru_victims(files, 39)] == ["old", "mid", "new"]
    assert slotfiles.lru_victims(files, 120) == []


def test_two_log_directories_with_the_same_session_never_share_a_file(tmp_path: Path) -> None:
    a = slotfiles.slot_key(tmp_path / "a" / "work" / "log.bin")
    b = slotfiles.slot_key(tmp_path / "b" / "work" / "log.bin")
    assert a != b and a.startswith("work-") and b.startswith("work-")
    assert a == slotfiles.slot_key(tmp_path / "a" / "." / "work" / "log.bin")


def test_a_save_is_put_in_place_with_its_size_and_checksum(tmp_path: Path) -> None:
    store = SlotStore(tmp_path, reachable=True)
    assert store.save_name("s-1") == "s-1.new.bin"  # the server writes here, not the real name
    (tmp_path / "s-1.bin").write_bytes(b"old state")
    (tmp_path / "s-1.new.bin").write_bytes(b"new state!")
    kept = store.commit("s-1", meta("s-1"))
    assert (tmp_path / "s-1.bin").read_bytes() == b"new state!"
    assert not (tmp_path / "s-1.new.bin").exists()
    assert (kept.bytes, kept.crc32) == (10, zlib.crc32(b"new state!"))
    assert store.meta("s-1") == kept
    assert store.size_crc("s-1") == (kept.bytes, kept.crc32)
    assert slotfiles.restore_problem(store.meta("s-1"), "f", store.size_crc("s-1"), True) == ""


def test_a_file_changed_or_gone_after_its_save_is_not_restored(tmp_path: Path) -> None:
    store = SlotStore(tmp_path, reachable=True)
    (tmp_path / "s-1.new.bin").write_bytes(b"state")
    kept = store.commit("s-1", meta("s-1"))
    (tmp_path / "s-1.bin").write_bytes(b"stale")  # same size, other bytes
    assert slotfiles.restore_problem(kept, "f", store.size_crc("s-1"), True) == slotfiles.CORRUPT
    (tmp_path / "s-1.bin").unlink()
    assert store.size_crc("s-1") is None
    assert slotfiles.restore_problem(kept, "f", store.size_crc("s-1"), True) == slotfiles.MISSING


def test_an_empty_save_is_dropped_and_the_older_file_stays(tmp_path: Path) -> None:
    store = SlotStore(tmp_path, reachable=True)
    (tmp_path / "s-1.bin").write_bytes(b"older")
    (tmp_path / "s-1.new.bin").write_bytes(b"")
    store.discard_save("s-1")
    assert not (tmp_path / "s-1.new.bin").exists()
    assert (tmp_path / "s-1.bin").read_bytes() == b"older"
    store.discard_save("s-1")  # nothing to drop: no error


def test_unreadable_metadata_is_no_metadata(tmp_path: Path) -> None:
    store = SlotStore(tmp_path, reachable=True)
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "odd.json").write_text(json.dumps({"session": "x"}))  # fields missing
    assert store.meta("bad") is None and store.meta("odd") is None and store.meta("none") is None
    assert store.all() == []


def test_the_directory_is_bound_least_recently_used_first(tmp_path: Path) -> None:
    store = SlotStore(tmp_path, reachable=True)
    for key, used in (("a", 3.0), ("b", 1.0), ("c", 2.0)):
        (tmp_path / f"{key}.new.bin").write_bytes(b"x" * 100)
        store.commit(key, meta(key, used=used))
    assert store.bound(250) == ["b"]  # the oldest, until the rest fits
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "a.json", "c.bin", "c.json"]
    store.touch("c", store.meta("c"))  # restored just now: the most recently used
    assert store.bound(150) == ["a"]
    assert [k for k, _ in store.all()] == ["c"]


def test_a_directory_loopd_cannot_reach_keeps_only_metadata(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "meta", reachable=False)
    assert store.save_name("s-1") == store.file_name("s-1") == "s-1.bin"  # the server's own
    kept = store.commit("s-1", meta("s-1", size=5, crc=9))
    assert kept == meta("s-1", size=5, crc=9)  # nothing to measure
    assert slotfiles.restore_problem(kept, "f", None, False) == ""  # the server checks it
    assert store.bound(0) == []  # nothing it could delete
    store.remove("s-1")
    assert store.meta("s-1") is None


def test_deleting_a_session_deletes_its_files_everywhere(tmp_path: Path) -> None:
    config = Config().replace("embedded", data_dir=str(tmp_path / "data")).replace(
        "slots", save_dir=str(tmp_path / "named")
    )
    stores = slotfiles.slot_dirs(config)
    assert [(s.dir, s.reachable) for s in stores] == [
        (tmp_path / "data" / "slots", True), (tmp_path / "data" / "slots" / "meta", False),
        (tmp_path / "named", True),
    ]
    log = tmp_path / "sessions" / "work" / "log.bin"
    key = slotfiles.slot_key(log)
    for store in stores:
        store.dir.mkdir(parents=True, exist_ok=True)
        if store.reachable:
            (store.dir / store.save_name(key)).write_bytes(b"state")
        store.commit(key, meta(key))
    other = slotfiles.slot_key(tmp_path / "sessions" / "other" / "log.bin")
    (stores[0].dir / stores[0].save_name(other)).write_bytes(b"theirs")
    stores[0].commit(other, meta(other))
    slotfiles.remove_session_files(stores, log)
    assert all(s.meta(key) is None for s in stores)
    assert not any((s.dir / s.file_name(key)).exists() for s in stores)
    assert stores[0].meta(other) is not None  # another session's stays


# --- slot files and their metadata are not trusted ---------------------------------


def _good(key: str = "s-1") -> dict[str, object]:
    return dataclasses.asdict(meta(key, used=5.0, size=3, crc=7))


@pytest.mark.parametrize(("change", "why"), [
    ({"used": "yesterday"}, "used is not a time"),
    ({"saved": float("nan")}, "saved is not a time"),
    ({"bytes": -1}, "bytes is not a whole number of at least 0"),
    ({"tokens": True}, "tokens is not a whole number"),
    ({"crc32": 2**40}, "crc32 is not a crc32"),
    ({"session": 5}, "session is not a string"),
    ({"file": "../../etc/passwd"}, "it names another file"),
    ({"file": "other-2.bin"}, "it names another file"),
])
def test_metadata_of_the_wrong_type_or_range_is_refused_with_why(
    change: dict[str, object], why: str
) -> None:
    assert slotfiles.parse_meta(_good(), "s-1") == meta("s-1", used=5.0, size=3, crc=7)
    assert why in str(slotfiles.parse_meta({**_good(), **change}, "s-1"))
    missing = _good()
    del missing["fingerprint"]
    assert slotfiles.parse_meta(missing, "s-1") == "fingerprint is not a string"
    assert slotfiles.parse_meta([1], "s-1") == "it is not a JSON object"


def test_bad_metadata_is_skipped_with_a_logged_reason_and_the_bound_still_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """"used": "yesterday" made the LRU order raise TypeError (the daemon's saver died with
    it); a negative bytes turned the disk bound off."""
    store = SlotStore(tmp_path, reachable=True)
    for key in ("a", "b"):
        (tmp_path / f"{key}.new.bin").write_bytes(b"x" * 100)
        store.commit(key, meta(key, used=1.0 if key == "a" else 2.0))
    (tmp_path / "c.json").write_text(json.dumps({**_good("c"), "used": "yesterday"}))
    (tmp_path / "d.json").write_text(json.dumps({**_good("d"), "bytes": -10**12}))
    (tmp_path / "e.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="loopd.slots"):
        assert store.bound(150) == ["a"]  # no TypeError; d's -1 TB did not make room
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "c.json: used is not a time" in said and "d.json: bytes is not" in said
    assert "e.json: it is not JSON" in said
    assert [k for k, _ in store.all()] == ["b"]


@pytest.mark.timeout(60)
def test_a_state_file_swapped_for_a_symlink_or_grown_is_not_read_through(
    tmp_path: Path,
) -> None:
    """A state file replaced by a symlink to /dev/zero made the size check read for ever
    (loopd run spun and ignored SIGTERM). No symlink is followed, only a regular file is
    read, and no more of it than the recorded size and one byte."""
    store = SlotStore(tmp_path, reachable=True)
    (tmp_path / "s-1.new.bin").write_bytes(b"state")
    kept = store.commit("s-1", meta("s-1"))
    (tmp_path / "s-1.bin").unlink()
    os.symlink("/dev/zero", tmp_path / "s-1.bin")
    assert store.size_crc("s-1", kept.bytes) is None
    assert slotfiles.restore_problem(kept, "f", None, True) == slotfiles.MISSING
    (tmp_path / "s-1.bin").unlink()
    os.mkfifo(tmp_path / "s-1.bin")  # nothing writes it: a read would block for ever
    assert store.size_crc("s-1", kept.bytes) is None
    (tmp_path / "s-1.bin").unlink()
    (tmp_path / "s-1.bin").write_bytes(b"state" + b"\0" * 10_000_000)
    assert store.size_crc("s-1", kept.bytes) == (6, zlib.crc32(b"state\0"))  # changed
    (tmp_path / "m.json").symlink_to(tmp_path / "s-1.json")
    assert store.meta("m") is None  # metadata is not read through a symlink either


def test_state_and_metadata_files_are_private(tmp_path: Path) -> None:
    """KV state (a conversation, as the model read it) was 0644 in a 0755 directory."""
    store = SlotStore(tmp_path / "slots", reachable=True)
    store._write_meta("x", meta("x"))  # makes the directory
    (tmp_path / "slots" / "s-1.new.bin").write_bytes(b"state")
    os.chmod(tmp_path / "slots" / "s-1.new.bin", 0o644)  # as a server with umask 022 saves
    store.commit("s-1", meta("s-1"))
    assert stat.S_IMODE((tmp_path / "slots").stat().st_mode) == 0o700
    for name in ("s-1.bin", "s-1.json", "x.json"):
        assert stat.S_IMODE((tmp_path / "slots" / name).stat().st_mode) == 0o600, name
