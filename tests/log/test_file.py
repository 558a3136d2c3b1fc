"""The session log: exact bytes, torn-tail recovery at every offset, corruption, lock, fsync."""

from __future__ import annotations

import datetime as dt
import errno
import gc
import os
import struct
import subprocess
import sys
import textwrap
import weakref
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

import actors.log.file as logmod
from actors.base.errors import LogCorrupt, RecordError, SessionError, SessionLocked
from actors.log.file import HEADER, MAX_RECORD, SessionLog, frame, read_records
from actors.log.records import (
    Assistant,
    Baseline,
    CacheLoss,
    Record,
    ToolCall,
    ToolResult,
    Usage,
    User,
    encode,
)
from actors.tools.protocol.spec import ResultClass
from tests.support.watch import HANG_S

T0 = dt.datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)


def baseline(system: str = "be brief") -> Baseline:
    tool = {"type": "function", "function": {"name": "read_file", "parameters": {}}}
    return Baseline(system=system, tools=(tool,), model="m", created=T0, time=T0)


def every_kind() -> list[Record]:
    """One record of each kind (and the variants that matter), the baseline first."""
    return [
        baseline(),
        User(content="héllo ✓", time=T0),
        Assistant(
            content=None,
            reasoning="think",
            tool_calls=(ToolCall(id="a1", name="read_file", arguments='{"path": "x"}'),),
            time=T0,
        ),
        Usage(
            timings={"cache_n": 3, "prompt_ms": 1.5},
            reasoning_tokens=2,
            thinking_capped=False,
            prompt_tokens=10,
            completion_tokens=5,
            finish_reason="tool_calls",
            time=T0,
        ),
        ToolResult(
            call=1,
            tool_call_id="a1",
            content="file text",
            class_=ResultClass.INTERNAL,
            untrusted=True,
            truncated=False,
            time=T0,
        ),
        CacheLoss(expected=10, got=0, time=T0),
        Assistant(content="done", reasoning=None, time=T0),
    ]


def write_log(path: Path, records: list[Record]) -> bytes:
    """Write ``records`` through SessionLog and return the file's bytes."""
    first = records[0]
    assert isinstance(first, Baseline)
    log, report = SessionLog.open(path, baseline=first, fsync="never")
    with log:
        assert report.created
        for r in records[1:]:
            log.append(r)
    return path.read_bytes()


def frame_ends(records: list[Record]) -> list[int]:
    ends, pos = [], len(HEADER)
    for r in records:
        pos += len(frame(r))
        ends.append(pos)
    return ends


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions" / "s1" / "log.bin"


@pytest.fixture
def opened(log_path: Path) -> Iterator[SessionLog]:
    log, _ = SessionLog.open(log_path, baseline=baseline())
    try:
        yield log
    finally:
        log.close()


# --- bytes --------------------------------------------------------------------------------


def test_file_is_exactly_header_and_frames(log_path: Path) -> None:
    records = every_kind()
    data = write_log(log_path, records)
    assert data[:12] == b"loopdlog" + struct.pack("<I", 1)
    pos = 12
    for r in records:
        payload = encode(r)
        assert data[pos : pos + 8] == struct.pack("<II", len(payload), zlib.crc32(payload))
        assert data[pos + 8 : pos + 8 + len(payload)] == payload
        pos += 8 + len(payload)
    assert pos == len(data)


def test_create_makes_directories_and_reopen_replays(log_path: Path) -> None:
    records = every_kind()
    write_log(log_path, records)
    log, report = SessionLog.open(log_path)
    with log:
        assert report.records == len(records)
        assert report.cut_bytes == 0
        assert not report.created
        assert log.records == tuple(records)
        assert log.baseline == records[0]
        assert log.name == "s1"


def test_open_missing_without_baseline_is_refused(log_path: Path) -> None:
    with pytest.raises(SessionError, match=r"session s1 does not exist.*loopd sessions"):
        SessionLog.open(log_path)
    assert not log_path.exists()


def test_existing_baseline_wins_over_the_given_one(log_path: Path) -> None:
    write_log(log_path, [baseline("first")])
    log, report = SessionLog.open(log_path, baseline=baseline("second"))
    with log:
        assert log.baseline.system == "first"
        assert not report.created


# --- torn tails: every byte offset ----------------------------------------------------------


def test_truncation_at_every_offset_keeps_exactly_the_whole_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut a real log at every byte; reopen keeps the whole records before the cut.

    A cut before the end of the baseline frame (inside the header or the baseline) leaves
    no record: opening without a baseline is refused, opening with one starts afresh.
    (The bytes are what is tested here, so the disk flushes are skipped.)
    """
    monkeypatch.setattr(logmod, "_fdatasync", lambda fd: None)
    records = every_kind()
    data = write_log(tmp_path / "orig" / "log.bin", records)
    ends = frame_ends(records)
    assert ends[-1] == len(data)
    path = tmp_path / "cut" / "log.bin"
    path.parent.mkdir()
    extra = User(content="after the cut", time=T0)
    fresh = baseline("fresh")
    for k in range(len(data) + 1):
        path.write_bytes(data[:k])
        whole = sum(1 for e in ends if e <= k)
        if whole == 0:
            with pytest.raises(SessionError, match="no baseline record") as info:
                SessionLog.open(path, fsync="never")
            assert not isinstance(info.value, LogCorrupt), k
            log, report = SessionLog.open(path, baseline=fresh, fsync="never")
            expected: list[Record] = [fresh]
            assert report.created, k
            assert report.cut_bytes == k, k
        else:
            log, report = SessionLog.open(path, fsync="never")
            expected = records[:whole]
            assert not report.created, k
            assert report.cut_bytes == k - ends[whole - 1], k
        with log:
            assert log.records == tuple(expected), k
            assert report.records == len(expected), k
            assert path.stat().st_size == len(HEADER) + sum(len(frame(r)) for r in expected), k
            log.append(extra)
        log, report = SessionLog.open(path, fsync="never")
        with log:
            assert log.records == (*expected, extra), k
            assert report.cut_bytes == 0, k


@pytest.mark.parametrize("tail", [b"\0" * 40, b"\0" * 3, struct.pack("<II", 2**31, 0) + b"xy"])
def test_zero_filled_or_absurd_length_tail_is_cut(log_path: Path, tail: bytes) -> None:
    records = every_kind()
    data = write_log(log_path, records)
    log_path.write_bytes(data + tail)
    log, report = SessionLog.open(log_path)
    with log:
        assert log.records == tuple(records)
        assert report.cut_bytes == len(tail)
    assert log_path.read_bytes() == data


def test_last_record_with_bad_crc_is_a_torn_tail(log_path: Path) -> None:
    records = every_kind()
    data = bytearray(write_log(log_path, records))
    data[-1] ^= 0xFF
    log_path.write_bytes(bytes(data))
    log, report = SessionLog.open(log_path)
    with log:
        assert log.records == tuple(records[:-1])
        assert report.cut_bytes == len(frame(records[-1]))


# --- corruption in the middle ----------------------------------------------------------------


def middle_frames() -> list[tuple[int, int]]:
    """(record index, byte within its frame) to flip: length, crc and payload bytes."""
    records = every_kind()
    out = []
    for i in range(len(records) - 1):  # the last frame's corruption is a torn tail
        size = len(frame(records[i]))
        out += [(i, 0), (i, 3), (i, 5), (i, 8), (i, size // 2), (i, size - 1)]
    return out


@pytest.mark.parametrize(("index", "byte"), middle_frames())
def test_flipped_byte_in_the_middle_names_the_offset(log_path: Path, index: int, byte: int) -> None:
    records = every_kind()
    data = bytearray(write_log(log_path, records))
    start = len(HEADER) + sum(len(frame(r)) for r in records[:index])
    data[start + byte] ^= 0x40
    log_path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt, match=rf"session s1 .* corrupt at byte {start}\b") as info:
        SessionLog.open(log_path)
    assert info.value.offset == start
    assert log_path.read_bytes() == bytes(data)  # nothing was cut
    # the lock was released: the file can be opened again (and refused again)
    with pytest.raises(LogCorrupt):
        SessionLog.open(log_path)


def test_absurd_length_in_the_middle_is_corruption(log_path: Path) -> None:
    records = every_kind()
    data = bytearray(write_log(log_path, records))
    start = frame_ends(records)[1]
    data[start : start + 4] = struct.pack("<I", MAX_RECORD + 1)
    log_path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt) as info:
        SessionLog.open(log_path)
    assert info.value.offset == start


def test_whole_but_undecodable_record_is_refused_not_cut(log_path: Path) -> None:
    data = write_log(log_path, every_kind())
    payload = b"\x81\xa4kind\xa5alien"  # {"kind": "alien"}, with a valid CRC
    bad = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    log_path.write_bytes(data + bad)
    with pytest.raises(LogCorrupt, match="unknown record kind 'alien'") as info:
        SessionLog.open(log_path)
    assert info.value.offset == len(data)
    assert log_path.read_bytes() == data + bad


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"call": "1"}, "tool_result.call: expected int, got str"),
        ({"class": "top"}, "tool_result.class: expected one of"),
        ({"extra": 1}, "tool_result: unknown field(s) extra"),
    ],
)
def test_a_wrong_record_in_the_middle_is_refused_at_its_offset_naming_it(
    log_path: Path, change: dict[str, object], said: str
) -> None:
    records = every_kind()
    data = write_log(log_path, records)
    ends = frame_ends(records)
    at = records.index(next(r for r in records if isinstance(r, ToolResult)))
    start, end = ends[at - 1], ends[at]
    body = msgpack.unpackb(data[start + 8 : end], timestamp=3)
    payload = msgpack.packb({**body, **change}, datetime=True)
    bad = data[:start] + struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    log_path.write_bytes(bad + data[end:])
    with pytest.raises(LogCorrupt) as info:
        SessionLog.open(log_path)
    assert info.value.offset == start
    assert f"session s1 ({log_path}): the record at byte {start} is whole but unreadable" in str(
        info.value
    )
    assert said in str(info.value)
    assert log_path.read_bytes() == bad + data[end:]


def test_opening_leaves_the_cyclic_collector_as_it_found_it(log_path: Path) -> None:
    """The collector is paused while records are built (actors.log.file._long_lived): it
    runs again after, stays off for a caller who turned it off, and objects someone froze
    stay frozen; a log refused half-way leaves it so too."""
    write_log(log_path, every_kind())
    assert gc.isenabled()
    SessionLog.open(log_path)[0].close()
    assert gc.isenabled()
    gc.disable()
    try:
        SessionLog.open(log_path)[0].close()
        assert not gc.isenabled()
    finally:
        gc.enable()
    # Containers, so the collector tracks them; whether they are still frozen is whether
    # they stay out of its generations (not the frozen count: another thread of the test
    # process may free a frozen object meanwhile, as happened once in CI).
    kept = [[index] for index in range(3)]
    gc.freeze()
    try:
        assert gc.get_freeze_count()
        SessionLog.open(log_path)[0].close()
        walked = {id(obj) for obj in gc.get_objects()}
        assert not [obj for obj in kept if id(obj) in walked]
    finally:
        gc.unfreeze()
    data = log_path.read_bytes()
    payload = b"\x81\xa4kind\xa5alien"
    log_path.write_bytes(data + struct.pack("<II", len(payload), zlib.crc32(payload)) + payload)
    with pytest.raises(LogCorrupt):
        SessionLog.open(log_path)
    assert gc.isenabled() and kept


def test_opening_moves_no_other_objects_to_the_oldest_generation(log_path: Path) -> None:
    """Young objects of the process (another thread's garbage, in a daemon) stay where the
    collector's young collections find them when a log is opened: moved to the oldest
    generation uncounted, no full collection came for them and the daemon grew for ever."""
    write_log(log_path, every_kind())

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    gc.collect()
    cycle = Cycle()
    dead = weakref.ref(cycle)
    del cycle  # garbage now, for the collector's next young collection
    SessionLog.open(log_path)[0].close()
    oldest = {id(obj) for obj in gc.get_objects(generation=2)}
    assert dead() is None or id(dead()) not in oldest


def test_first_record_must_be_a_baseline(log_path: Path) -> None:
    log_path.parent.mkdir(parents=True)
    log_path.write_bytes(HEADER + frame(User(content="hi")))
    with pytest.raises(LogCorrupt, match="first record is a User, not a Baseline"):
        SessionLog.open(log_path, baseline=baseline())


@pytest.mark.parametrize("head", [b"notalog!\x01\0\0\0", b"x", b"loopdlo!"])
def test_foreign_header_is_refused(log_path: Path, head: bytes) -> None:
    log_path.parent.mkdir(parents=True)
    log_path.write_bytes(head)
    with pytest.raises(LogCorrupt, match="not a loopd log") as info:
        SessionLog.open(log_path, baseline=baseline())
    assert info.value.offset == 0
    assert log_path.read_bytes() == head


def test_newer_format_version_is_refused(log_path: Path) -> None:
    log_path.parent.mkdir(parents=True)
    log_path.write_bytes(b"loopdlog" + struct.pack("<I", 2) + frame(baseline()))
    with pytest.raises(SessionError, match="format version 2; this loopd reads version 1"):
        SessionLog.open(log_path)


# --- one writer -------------------------------------------------------------------------------


def test_second_open_in_this_process_is_refused(opened: SessionLog) -> None:
    expected = r"session s1 is open elsewhere \(pid \d+, this process"
    with pytest.raises(SessionLocked, match=expected):
        SessionLog.open(opened.path)
    opened.close()
    opened.close()  # idempotent
    log, _ = SessionLog.open(opened.path)
    log.close()


def test_second_open_from_another_process_names_its_pid(opened: SessionLog) -> None:
    path = opened.path
    opened.close()
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from actors.log.file import SessionLog
        log, _ = SessionLog.open(Path({str(path)!r}))
        print("ready", flush=True)
        sys.stdin.read()
        """
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        with pytest.raises(SessionLocked, match=rf"open elsewhere \(pid {proc.pid}\)"):
            SessionLog.open(path)
    finally:
        proc.kill()
        proc.wait(timeout=HANG_S)
    log, _ = SessionLog.open(path)  # the dead holder's lock is gone
    log.close()


# --- next_call ----------------------------------------------------------------------------------


def result(call: int) -> ToolResult:
    return ToolResult(
        call=call, tool_call_id=f"id{call}", content="", class_=ResultClass.PUBLIC,
        untrusted=False, truncated=False,
    )


def test_next_call_counts_and_continues_after_reopen(opened: SessionLog) -> None:
    assert [opened.next_call() for _ in range(3)] == [1, 2, 3]
    opened.append(result(2))
    assert opened.next_call() == 4  # numbers handed out are never handed out again
    opened.append(result(7))
    assert opened.next_call() == 8
    path = opened.path
    opened.close()
    log, _ = SessionLog.open(path)
    with log:
        assert log.next_call() == 8
        assert log.next_call() == 9


# --- appends, fsync policies and failures -------------------------------------------------------


def test_records_snapshot_follows_appends(opened: SessionLog) -> None:
    before = opened.records
    user = User(content="x")
    opened.append(user)
    assert before == (opened.baseline,)
    assert opened.records == (opened.baseline, user)


@pytest.mark.parametrize(
    ("policy", "per_append", "on_sync"), [("always", 1, 1), ("turn", 0, 1), ("never", 0, 1)]
)
def test_fsync_policy(
    log_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, per_append: int, on_sync: int
) -> None:
    write_log(log_path, [baseline()])
    calls: list[int] = []
    monkeypatch.setattr(logmod, "_fdatasync", calls.append)
    log, _ = SessionLog.open(log_path, fsync=policy)
    with log:
        assert calls == []
        log.append(User(content="a"))
        log.append(User(content="b"))
        assert len(calls) == 2 * per_append
        log.sync()
        assert len(calls) == 2 * per_append + on_sync
    log, _ = SessionLog.open(log_path)
    with log:
        assert [r.content for r in log.records[1:] if isinstance(r, User)] == ["a", "b"]


def test_records_appended_together_are_one_write_and_one_fsync(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn appends Assistant and Usage together: one fdatasync, not two."""
    write_log(log_path, [baseline()])
    syncs: list[int] = []
    writes: list[int] = []
    real_write = os.write
    monkeypatch.setattr(logmod, "_fdatasync", syncs.append)

    def write(fd: int, data: bytes) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    together = every_kind()[2:4]  # Assistant, Usage
    log, _ = SessionLog.open(log_path, fsync="always")
    with log:
        monkeypatch.setattr(logmod.os, "write", write)
        log.append(*together)
        monkeypatch.setattr(logmod.os, "write", real_write)
        assert len(syncs) == 1 and writes == [sum(len(frame(r)) for r in together)]
        assert log.records[1:] == tuple(together)
    log, _ = SessionLog.open(log_path)
    with log:
        assert log.records[1:] == tuple(together)


def test_a_bad_record_among_several_writes_none_of_them(opened: SessionLog) -> None:
    size = opened.path.stat().st_size
    with pytest.raises(RecordError):
        opened.append(User(content="fine"), User(content=b"not text"))  # type: ignore[arg-type]
    assert opened.path.stat().st_size == size and opened.records == (opened.baseline,)
    opened.append(User(content="still works"))


def test_unknown_fsync_policy_is_refused(log_path: Path) -> None:
    with pytest.raises(SessionError, match="fsync policy 'sometimes' unknown; use one of always"):
        SessionLog.open(log_path, fsync="sometimes", baseline=baseline())


def test_fsync_error_breaks_the_log(opened: SessionLog, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(logmod, "_fdatasync", fail)
    with pytest.raises(SessionError,
                       match=r"session s1: writing .*log.bin failed: I/O error; .*reopen the"):
        opened.append(User(content="a"))
    monkeypatch.undo()
    with pytest.raises(SessionError, match="refuses writes after an earlier failure"):
        opened.append(User(content="b"))
    with pytest.raises(SessionError, match="refuses writes"):
        opened.sync()


def test_short_write_then_error_leaves_no_half_record(
    opened: SessionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk that took 5 bytes of the record: they go again at once (a reader must
    not find them), and the session reopens with nothing to cut."""
    real_write = os.write
    fd = opened._fd
    size = opened.path.stat().st_size
    calls = 0

    def flaky(f: int, data: bytes | memoryview) -> int:
        nonlocal calls
        if f != fd:
            return real_write(f, data)
        calls += 1
        if calls == 1:
            return real_write(f, bytes(data)[:5])  # a short write
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", flaky)
    with pytest.raises(SessionError, match=r"writing .*log.bin failed: No space left"):
        opened.append(User(content="lost"))
    monkeypatch.undo()
    assert opened.records == (opened.baseline,)
    path = opened.path
    assert path.stat().st_size == size
    opened.close()
    log, report = SessionLog.open(path)
    with log:
        assert report.cut_bytes == 0
        assert log.records == (log.baseline,)


def test_short_writes_are_completed(opened: SessionLog, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    fd = opened._fd

    def one_byte(f: int, data: bytes | memoryview) -> int:
        return real_write(f, bytes(data)[:1]) if f == fd else real_write(f, data)

    monkeypatch.setattr(os, "write", one_byte)
    user = User(content="written one byte at a time")
    opened.append(user)
    monkeypatch.undo()
    path = opened.path
    opened.close()
    log, _ = SessionLog.open(path)
    with log:
        assert log.records[-1] == user


def test_bad_record_is_refused_without_breaking_the_log(opened: SessionLog) -> None:
    with pytest.raises(RecordError, match=r"user\.content"):
        opened.append(User(content=3))  # type: ignore[arg-type]
    opened.append(User(content="fine"))
    assert len(opened.records) == 2


def test_append_after_close_is_refused(opened: SessionLog) -> None:
    opened.close()
    with pytest.raises(SessionError, match="session s1: the log is closed"):
        opened.append(User(content="x"))


# --- read_records (readers, no lock) --------------------------------------------------------------


def test_read_records_works_while_open_and_leaves_a_torn_tail_alone(opened: SessionLog) -> None:
    user = User(content="hi")
    opened.append(user)
    with open(opened.path, "ab") as f:
        f.write(b"\x05\0\0")  # a record being appended right now
    assert read_records(opened.path) == (opened.baseline, user)
    assert opened.path.read_bytes().endswith(b"\x05\0\0")


def test_read_records_refuses_missing_and_corrupt(log_path: Path) -> None:
    with pytest.raises(SessionError, match="session s1 does not exist"):
        read_records(log_path)
    records = every_kind()
    data = bytearray(write_log(log_path, records))
    data[frame_ends(records)[0] + 9] ^= 1
    log_path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt) as info:
        read_records(log_path, name="mine")
    assert info.value.offset == frame_ends(records)[0]
    log_path.write_bytes(HEADER)
    with pytest.raises(SessionError, match="no baseline record"):
        read_records(log_path)


def test_unwritable_log_dir_is_a_session_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SessionError, match=r"session s: cannot open .*log\.dir"):
        SessionLog.open(blocker / "s" / "log.bin", baseline=baseline())


def test_scan_for_a_later_frame_is_not_fooled_by_length_like_bytes(log_path: Path) -> None:
    """A torn record full of bytes that read as small lengths is still a torn tail."""
    records = every_kind()
    data = write_log(log_path, records)
    torn = frame(User(content="\0\1\0\0" * 5000))[:-3]
    log_path.write_bytes(data + torn)
    log, report = SessionLog.open(log_path)
    with log:
        assert log.records == tuple(records)
        assert report.cut_bytes == len(torn)
