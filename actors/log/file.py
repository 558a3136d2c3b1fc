"""The session log: an append-only file of framed records, the truth of a session.

Bytes (docs/log.md#the-file): a 12-byte header, ``loopdlog`` + format version as u32 LE, then one
frame per record: ``length u32 LE | zlib.crc32(payload) u32 LE | payload`` where the
payload is :func:`actors.log.records.encode` of the record.

Recovery on open, and why:

- A crash mid-append leaves a *torn tail*: a short frame header, a short payload, a CRC
  mismatch, or zero bytes a file system left after a size change. When no valid frame
  follows the first bad frame, it is a torn tail: it is cut (``ftruncate`` + fsync) at the
  last whole record and the number of bytes cut is reported.
- A bad frame *followed by* a valid one is corruption in the middle: refused with
  :class:`LogCorrupt` naming the byte offset, never skipped. ("Valid" means a length
  between 1 and :data:`MAX_RECORD` that fits in the file and a matching CRC.)
- A frame whose CRC matches but whose record does not decode (a foreign writer or a newer
  loopd) is not a torn write, so it is refused at its offset instead of being cut: cutting
  it would lose a record that was written whole.
- A file whose first record is not a Baseline is refused.
- A file shorter than its header plus the baseline frame (a creation interrupted before
  the baseline was durable) holds no record: with a ``baseline`` it is started afresh
  (``created=True``, the old bytes reported as cut); without one it is refused with a
  :class:`SessionError` that says so. A header that is not loopd's is refused (offset 0).

One writer: the file is locked with ``flock(LOCK_EX | LOCK_NB)`` for the log's lifetime; a
second opener, in this process or another, gets :class:`SessionLocked`. An error from
``write`` or ``fsync`` is fatal for the log object (after a failed fsync Linux may drop
the dirty pages and report success later): it refuses every later append, and reopening
the session runs recovery.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from actors.base.durable import fsync_dir, lock, write_all
from actors.base.errors import LogCorrupt, RecordError, SessionError, SessionLocked, WireError
from actors.log.records import CODEC, Approval, Baseline, Record, ToolResult, encode
from actors.log.tailscan import next_valid_frame

__all__ = [
    "FSYNC_POLICIES",
    "HEADER",
    "MAGIC",
    "MAX_RECORD",
    "VERSION",
    "OpenReport",
    "SessionLog",
    "check_free",
    "frame",
    "read_frames",
    "read_log",
    "read_records",
]

MAGIC = b"loopdlog"
VERSION = 1
HEADER = MAGIC + struct.pack("<I", VERSION)
MAX_RECORD = 64 * 1024 * 1024  # a larger length is never allocated: torn or corrupt
FSYNC_POLICIES = ("always", "turn", "never")

_FRAME = struct.Struct("<II")
_fdatasync = getattr(os, "fdatasync", os.fsync)


@dataclasses.dataclass(frozen=True, slots=True)
class OpenReport:
    """What opening found: records replayed, bytes cut from a torn tail, file created."""

    records: int
    cut_bytes: int
    created: bool


def frame(record: Record) -> bytes:
    """The on-disk bytes of one record (its frame header and payload)."""
    payload = encode(record)
    if len(payload) > MAX_RECORD:
        raise RecordError(f"record of {len(payload)} bytes exceeds the log's limit of {MAX_RECORD}")
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


class SessionLog:
    """An open, locked session log; the records are kept in memory as they are replayed."""

    name: str
    path: Path

    def __init__(self, path: Path, fd: int, name: str, fsync: str, records: list[Record]) -> None:
        self.path = path
        self.name = name
        self._fd: int | None = fd
        self._fsync = fsync
        self._records = records
        self._snapshot: tuple[Record, ...] | None = None
        self._broken: str | None = None
        self._size = os.fstat(fd).st_size  # the file's length: the one writer keeps count
        calls = [r.call for r in records if type(r) is ToolResult or type(r) is Approval]
        self._next_call = max(calls, default=0) + 1

    # --- opening ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        fsync: str = "always",
        baseline: Baseline | None = None,
        name: str = "",
    ) -> tuple[SessionLog, OpenReport]:
        """Open (or create, given ``baseline``) the log at ``path``, lock it and replay it."""
        path = Path(path)
        name = name or path.parent.name
        if fsync not in FSYNC_POLICIES:
            raise SessionError(
                f"session {name}: fsync policy {fsync!r} unknown; use one of "
                f"{', '.join(FSYNC_POLICIES)}"
            )
        if baseline is not None and not isinstance(baseline, Baseline):
            raise SessionError(f"session {name}: baseline must be a Baseline record")
        fd, created = _open_locked(path, name, baseline)
        try:
            records, cut, created = _recover(fd, path, name, baseline, created)
        except BaseException:
            os.close(fd)
            raise
        log = cls(path, fd, name, fsync, records)
        return log, OpenReport(records=len(records), cut_bytes=cut, created=created)

    # --- reading ----------------------------------------------------------------------

    @property
    def baseline(self) -> Baseline:
        first = self._records[0]
        assert isinstance(first, Baseline)  # guaranteed by open
        return first

    @property
    def records(self) -> tuple[Record, ...]:
        """Every record, the baseline first, in log order (a snapshot)."""
        if self._snapshot is None:
            self._snapshot = tuple(self._records)
        return self._snapshot

    @property
    def closed(self) -> bool:
        return self._fd is None

    # --- writing ----------------------------------------------------------------------

    def append(self, *records: Record) -> None:
        """Write records in one ``write`` (and one fsync); on disk when this returns.

        Several records appended together are one write: a crash may still tear them, and
        the torn tail is cut at a frame boundary on open, leaving a prefix of them.
        """
        fd = self._writable()
        data = b"".join(frame(r) for r in records)  # a RecordError here writes nothing
        size = self._size  # counted, not asked of the file (an fstat per append)
        try:
            write_all(fd, data)
            self._size = size + len(data)
            if self._fsync == "always":
                _fdatasync(fd)
        except OSError as e:
            # a full disk may take part of the write: those bytes go again at once (a
            # reader must not find half a record), as the tail scan would cut them on open
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            self._break(f"writing {self.path} failed: {e.strerror or e}")
        self._records.extend(records)
        self._snapshot = None
        for record in records:
            if isinstance(record, ToolResult | Approval) and record.call >= self._next_call:
                self._next_call = record.call + 1

    def sync(self) -> None:
        """Flush every appended record to disk now (the end of a turn under fsync "turn")."""
        fd = self._writable()
        try:
            _fdatasync(fd)
        except OSError as e:
            self._break(f"fsync of {self.path} failed: {e.strerror or e}")

    def next_call(self) -> int:
        """The next tool-call number of the session (1, 2, ...); never the same one twice."""
        n = self._next_call
        self._next_call += 1
        return n

    def close(self) -> None:
        """Release the lock and the file; safe to call more than once."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only fd of the open file releases the flock

    def __enter__(self) -> SessionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _writable(self) -> int:
        if self._broken is not None:
            raise SessionError(
                f"session {self.name}: the log refuses writes after an earlier failure "
                f"({self._broken}); close and reopen the session to recover it"
            )
        if self._fd is None:
            raise SessionError(f"session {self.name}: the log is closed; reopen the session")
        return self._fd

    def _break(self, why: str) -> NoReturn:
        self._broken = why
        raise SessionError(
            f"session {self.name}: {why}; the log is closed for writing, reopen the session "
            f"to recover it (a torn last record is cut on open)"
        )


def read_records(path: Path, *, name: str = "") -> tuple[Record, ...]:
    """The whole records of a log, read without locking or cutting anything.

    For readers (``loopd log show``) that may run while the session is open elsewhere:
    a torn tail (or a record being appended right now) is left out, not cut.
    """
    return read_log(path, name=name)[0]


def read_log(path: Path, *, name: str = "") -> tuple[tuple[Record, ...], int]:
    """:func:`read_records`, and how many bytes follow the last whole record (a torn tail)."""
    data, records, ends = read_frames(path, name=name)
    return records, len(data) - ends[-1]


def read_frames(
    path: Path, *, name: str = ""
) -> tuple[bytes, tuple[Record, ...], tuple[int, ...]]:
    """The log's bytes as read, its whole records, and the byte offset after each of them:
    ``data[:ends[i]]`` is a valid log of the records up to ``i`` (a fork copies that)."""
    path = Path(path)
    name = name or path.parent.name
    where = f"session {name} ({path})"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SessionError(f"session {name} does not exist ({path})") from None
    _check_header(data, where)
    ends: list[int] = []
    records, _ = _replay(data, where, ends)
    if not records:
        raise SessionError(f"{where} has no baseline record (its creation was interrupted)")
    _check_first(records[0], where)
    return data, tuple(records), tuple(ends)


# --- open helpers ---------------------------------------------------------------------


def _open_locked(path: Path, name: str, baseline: Baseline | None) -> tuple[int, bool]:
    """An O_APPEND fd of the log, flock-ed; creates file and directory when missing."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    created = False
    try:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if baseline is None:
                raise SessionError(  # a person reads this (`loopd rewind nosuch`)
                    f"session {name} does not exist (no {path}); `loopd sessions` lists the "
                    "sessions there, and a message to a new name starts one"
                ) from None
            made = _mkdirs(path.parent)
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                created = True
            except FileExistsError:  # created by someone else just now: open theirs
                fd = os.open(path, flags)
            for d in {path.parent, *(m.parent for m in made)}:
                fsync_dir(d)
    except OSError as e:
        raise SessionError(
            f"session {name}: cannot open {path}: {e.strerror or e}; check that the log "
            f"directory (log.dir) is writable"
        ) from e
    try:
        if not lock(fd, wait=False):
            raise SessionLocked(
                f"session {name} is open elsewhere{_lock_holder(fd)} ({path}); close that "
                f"loopd first, or use another session name"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def check_free(path: Path, name: str) -> None:
    """SessionLocked when another writer holds session ``name``'s log (``path``); nothing
    when it is free or not made yet. A command checks it before it starts a model server
    and tool hosts for a session that it cannot open (`loopd run --local` on a session the
    daemon has: said after the server's start-up, before)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # not made yet (or unreadable: the open itself will say)
    try:
        if not lock(fd, wait=False):
            raise SessionLocked(
                f"session {name} is open elsewhere{_lock_holder(fd)} ({path}); close that "
                f"loopd first (a daemon: leave out --local to use it there), or use another "
                "session name"
            )
    finally:
        os.close(fd)  # the only fd of this open file: a lock taken here goes with it


def _mkdirs(d: Path) -> list[Path]:
    """Create ``d`` and missing parents; the ones created, outermost first."""
    missing = []
    while not d.exists():
        missing.append(d)
        d = d.parent
    for m in reversed(missing):
        with contextlib.suppress(FileExistsError):
            m.mkdir(mode=0o700)
    return list(reversed(missing))



def _lock_holder(fd: int) -> str:
    """' (pid N)' of the flock holder, from /proc/locks (Linux); '' when unknown."""
    try:
        ino = os.fstat(fd).st_ino
        with open("/proc/locks", encoding="ascii") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].endswith(f":{ino}"):
                    pid = int(parts[4])
                    return f" (pid {pid}, this process)" if pid == os.getpid() else f" (pid {pid})"
    except (OSError, ValueError):
        pass
    return ""


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _recover(
    fd: int, path: Path, name: str, baseline: Baseline | None, created: bool
) -> tuple[list[Record], int, bool]:
    """Replay the file; cut a torn tail; (re)write header and baseline when there are none."""
    data = _read_all(fd)
    where = f"session {name} ({path})"
    _check_header(data, where)
    records, end = _replay(data, where)
    cut = len(data) - end
    if not records:  # an empty file, or a creation interrupted before its baseline
        if baseline is None:
            raise SessionError(
                f"{where} has no baseline record (its creation was interrupted); open it "
                f"with a baseline to start it afresh, or delete {path}"
            )
        os.ftruncate(fd, 0)
        write_all(fd, HEADER + frame(baseline))
        _fdatasync(fd)
        return [baseline], len(data), True
    _check_first(records[0], where)
    if cut:
        os.ftruncate(fd, end)
        _fdatasync(fd)
    return records, cut, created


def _check_first(first: Record, where: str) -> None:
    if not isinstance(first, Baseline):
        raise LogCorrupt(
            f"{where}: the first record is a {type(first).__name__}, not a Baseline; "
            f"this is not a usable session log: move it aside",
            len(HEADER),
        )


def _check_header(data: bytes, where: str) -> None:
    head = data[: len(HEADER)]
    if len(head) < len(HEADER):
        if HEADER.startswith(head):
            return  # torn creation: no records
        raise LogCorrupt(f"{where} is not a loopd log (bad header); move it aside", 0)
    if head[: len(MAGIC)] != MAGIC:
        raise LogCorrupt(f"{where} is not a loopd log (bad header); move it aside", 0)
    (version,) = struct.unpack_from("<I", data, len(MAGIC))
    if version != VERSION:
        raise SessionError(
            f"{where} is log format version {version}; this loopd reads version {VERSION}: "
            f"use the loopd that wrote it"
        )


def _replay(
    data: bytes, where: str, ends: list[int] | None = None
) -> tuple[list[Record], int]:
    """The whole records of ``data`` and the offset after the last of them (and after each
    of them in ``ends``, when given)."""
    n = len(data)
    if n <= len(HEADER):
        return [], n
    view = memoryview(data)
    records: list[Record] = []
    add = records.append
    pos = len(HEADER)
    unpack = _FRAME.unpack_from
    crc32 = zlib.crc32
    decode_whole = CODEC.decode_whole
    with _long_lived():
        last = n - 8  # the last offset where a frame header fits
        while pos <= last:
            length, crc = unpack(data, pos)
            start = pos + 8
            end = start + length
            if not (0 < length <= MAX_RECORD and end <= n):
                break
            payload = view[start:end]
            if crc32(payload) != crc:
                break
            try:
                add(decode_whole(payload))
            except WireError as e:
                raise LogCorrupt(
                    f"{where}: the record at byte {pos} is whole but unreadable ({e}); it "
                    f"was written by another program or a newer loopd",
                    pos,
                ) from None
            if ends is not None:
                ends.append(end)
            pos = end
    if pos < n:  # a bad frame: a torn tail unless a valid frame follows somewhere after it
        later = _next_valid_frame(data, pos + 1)
        if later is not None:
            raise LogCorrupt(
                f"{where} is corrupt at byte {pos} (a valid record follows at byte {later}); "
                f"the {len(records)} records before it are intact: keep a copy, then "
                f"`truncate -s {pos}` the file to continue from them",
                pos,
            )
    return records, pos


@contextlib.contextmanager
def _long_lived() -> Iterator[None]:
    """Build objects that live long (a log's records) without the cyclic collector walking
    them as they come: it is paused meanwhile, and runs again after (off stays off for a
    caller who turned it off). Nothing is frozen (``gc.freeze``): in a process with other
    threads (the daemon) that would move every thread's young objects, garbage cycles
    included, to the oldest generation uncounted, where a full collection seldom comes:
    the daemon grew ~12 KiB an operation for ever (docs/proof.md#the-soak).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _next_valid_frame(data: bytes, start: int) -> int | None:
    """The first offset >= start where a plausible frame with a matching CRC begins
    (in linear time, whatever the bytes: :mod:`actors.log.tailscan`)."""
    return next_valid_frame(data, start, MAX_RECORD)
