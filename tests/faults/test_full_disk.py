"""A full disk (ENOSPC) during each durable write: a clear error naming the path, nothing
lost or half-written, and loopd working again once space is freed.

Each test mounts a small tmpfs of its own (this needs root, or CAP_SYS_ADMIN), puts the
session, the KV states or the rules file on it, fills it to the last byte, and tries: an
append, a compaction's record, a fork's copy, a KV state's metadata, a rules-file save.
Without the right to mount the tests are skipped, saying so; where the run must prove
them (``LOOPD_REQUIRE_BWRAP=1``, or CI as root) they fail instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.approval.rulesfile import load_rules, save_rule
from actors.base.config import parse
from actors.base.errors import RulesError, SessionError
from actors.base.rules import parse_rule
from actors.inference.slots.files import SlotFile, SlotStore
from actors.inference.types import Completion
from actors.log.file import SessionLog, read_records
from actors.log.records import Assistant, Compaction, User
from actors.session import compactor
from actors.session.fork import fork_session
from tests.faults.compact_child import Model
from tests.faults.fork_child import config_at
from tests.support.fork_source import source, states
from tests.support.turn_rig import baseline

SIZE = "4m"
NO_SPACE = "No space left on device"


def _must_prove() -> bool:
    return os.environ.get("LOOPD_REQUIRE_BWRAP") == "1" or (
        bool(os.environ.get("CI")) and os.geteuid() == 0)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of SIZE at tmp_path/disk, unmounted at the end whatever happens."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs",
                           str(where)], capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        why = f"cannot mount a tmpfs to fill ({done.stderr.strip() or done.returncode})"
        if _must_prove():
            pytest.fail(f"{why}: this run must prove the full-disk cases (run as root)")
        pytest.skip(why)
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)


@contextlib.contextmanager
def full(disk: Path) -> Iterator[None]:
    """``disk`` filled to its last byte for the block, then the space freed again."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            chunk = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as no_room:
        (disk / "probe").write_bytes(b"x" * 8192)
    assert no_room.value.errno == errno.ENOSPC
    try:
        yield
    finally:
        filler.unlink()
        with contextlib.suppress(FileNotFoundError):
            (disk / "probe").unlink()


def leftovers(d: Path) -> list[str]:
    """Temporary files a failed write left behind (each takes space of a full disk)."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")
                  if p.name.endswith(".tmp") or p.name.startswith(".fork-"))


def test_an_append_on_a_full_disk(disk: Path) -> None:
    path = disk / "sessions" / "s" / "log.bin"
    log, _ = SessionLog.open(path, baseline=baseline(), name="s")
    log.append(User(content="before"), Assistant(content="kept", reasoning=None))
    before, records = path.read_bytes(), log.records
    with full(disk):
        with pytest.raises(SessionError, match=rf"session s: writing {path} failed: {NO_SPACE}"):
            log.append(User(content="x" * 20_000))
        assert path.read_bytes() == before  # nothing half-written, even before a reopen
        with pytest.raises(SessionError, match="refuses writes after an earlier failure"):
            log.append(User(content="y"))
        log.close()
    log, report = SessionLog.open(path, name="s")  # space freed: the session goes on
    with log:
        assert report.cut_bytes == 0 and log.records == records
        log.append(User(content="after"))
    assert read_records(path)[-1] == User(content="after", time=read_records(path)[-1].time)


class LongModel(Model):
    """A summary larger than a page: the record cannot fit the log's last page."""

    def complete(self, *args: Any) -> Completion:
        return dataclasses.replace(super().complete(*args), content=LONG_SUMMARY)


LONG_SUMMARY = "They asked about five things, at length. " * 200


def test_a_compaction_record_on_a_full_disk(disk: Path) -> None:
    path = disk / "sessions" / "s" / "log.bin"
    config = parse({"log": {"dir": str(disk / "sessions")},
                    "session": {"compaction": "summary"}})
    log, _ = SessionLog.open(path, baseline=baseline(), name="s")
    for n in range(5):
        log.append(User(content=f"question {n}" + " more" * 80),
                   Assistant(content=f"answer {n}", reasoning=None))
    before = path.read_bytes()
    with full(disk):
        with pytest.raises(SessionError, match=rf"writing {path} failed: {NO_SPACE}"):
            compactor.compact_session(log, config, LongModel(), lambda _: None)
        assert path.read_bytes() == before
        log.close()
    log, _ = SessionLog.open(path, name="s")
    with log:
        compactor.compact_session(log, config, LongModel(), lambda _: None)
        assert isinstance(log.records[-1], Compaction)
    assert path.read_bytes().startswith(before)


def test_a_forks_copy_on_a_full_disk(disk: Path) -> None:
    config = config_at(disk)
    src = source(config)  # 40 long turns and a saved KV state
    before, kv = src.read_bytes(), sorted(states(config))
    with full(disk):
        with pytest.raises(SessionError,
                           match=rf"session new: the fork could not be written in "
                                 rf"{config.log_dir}: {NO_SPACE}"):  # fmt: skip
            fork_session(config, "src", "new")
        assert not (config.log_dir / "new").exists()  # absent, not half
        assert src.read_bytes() == before and sorted(states(config)) == kv
        assert leftovers(disk) == []
    fork_session(config, "src", "new")
    assert read_records(config.log_dir / "new" / "log.bin")[:-1] == read_records(src)
    assert sorted(states(config)) == ["new", "src"]


def test_a_kv_states_metadata_on_a_full_disk(disk: Path) -> None:
    store = SlotStore(disk / "save", reachable=True)
    store.dir.mkdir()
    first = SlotFile(session="s", file=store.file_name("k"), tokens=10, fingerprint="model=m",
                     server="http://127.0.0.1:1", saved=time.time(), used=time.time(), bytes=0)
    (store.dir / store.save_name("k")).write_bytes(b"kv" * 100)
    first = store.commit("k", first)
    # a fork's hard link holds the older file, so the rename below frees no room
    os.link(store.dir / store.file_name("k"), disk / "forked.bin")
    (store.dir / store.save_name("k")).write_bytes(b"KV" * 100)  # the server's next save
    with full(disk):
        with pytest.raises(OSError, match=rf"{NO_SPACE}: '{store.dir}/.*json'"):
            store.commit("k", SlotFile(**{**_fields(first), "tokens": 20}))
        assert store.meta("k") == first  # the older metadata, whole (and the size and crc
        assert leftovers(disk) == []      # it records refuse the newer file: re-processed)
    (store.dir / store.save_name("k")).write_bytes(b"KV" * 100)  # saved again, room now
    again = store.commit("k", SlotFile(**{**_fields(first), "tokens": 30}))
    assert store.meta("k") == again and again.tokens == 30


def _fields(meta: SlotFile) -> dict[str, object]:
    return {f: getattr(meta, f) for f in SlotFile.__dataclass_fields__}


def test_a_rules_file_save_on_a_full_disk(disk: Path) -> None:
    path = disk / "config" / "rules.toml"
    save_rule(path, parse_rule("run_command: git status"))
    before = path.read_bytes()
    with full(disk):
        with pytest.raises(RulesError, match=rf"rules file {path}: cannot save the rule "
                                             rf"'read_file: docs': .*{NO_SPACE}"):  # fmt: skip
            save_rule(path, parse_rule("read_file: docs"))
        assert path.read_bytes() == before
        assert leftovers(disk) == [] and sorted(p.name for p in path.parent.iterdir()) == [
            "rules.toml", "rules.toml.lock"]
    save_rule(path, parse_rule("read_file: docs"))
    assert [str(r) for r in load_rules(path).allow] == ["run_command: git status",
                                                        "read_file: docs"]
