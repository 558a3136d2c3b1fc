"""actors/base/durable.py: every byte written, a new directory entry made durable, file locks.

What the system does is real (files, a pipe, directories); where a test needs the system to
misbehave (a short write, a write that takes nothing, a failing fsync) ``os`` is wrapped.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.durable import fsync_dir, lock, locked, replace_file, write_all
from tests.support.watch import HANG_S


def _open_paths() -> set[str]:
    """What this process has open, by path (other threads' sockets do not match a tmp dir)."""
    paths = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own, closed by now
            paths.add(os.readlink(f"/proc/self/fd/{fd}"))
    return paths


@pytest.fixture
def no_leaked_fds(tmp_path: Path) -> Iterator[None]:
    yield
    assert not {p for p in _open_paths() if p.startswith(str(tmp_path))}


# --- write_all -----------------------------------------------------------------------------


def test_write_all_writes_every_byte_to_a_file(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        write_all(fd, b"first ")
        write_all(fd, b"")  # nothing to write is not an error
        write_all(fd, bytes(range(256)) * 100)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"first " + bytes(range(256)) * 100


def test_write_all_fills_a_pipe_past_its_buffer_while_a_reader_drains_it() -> None:
    data = os.urandom(1 << 20)  # well past a pipe's 64 KiB
    r, w = os.pipe()
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(r, 65536):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        write_all(w, data)
    finally:
        os.close(w)
        reader.join()
        os.close(r)
    assert bytes(got) == data


@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=64))
def test_short_writes_are_continued_until_all_is_written(data: bytes, most: int) -> None:
    """The system may take fewer bytes than asked: write_all goes on from where it stopped."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    calls: list[int] = []

    def short_write(fd: int, view: bytes | memoryview) -> int:
        calls.append(len(view))
        return real_write(fd, bytes(view[:most]))

    real_write = os.write
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "write", short_write)
            write_all(w, data)
        written = b""
        while len(written) < len(data):
            written += os.read(r, 65536)
    finally:
        os.close(r)
        os.close(w)
    assert written == data
    assert len(calls) == -(-len(data) // most)  # one call per short write, none after the end


def test_a_write_that_takes_nothing_raises_instead_of_looping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    monkeypatch.setattr(os, "write", lambda _fd, _data: 0)
    try:
        with pytest.raises(OSError, match="write wrote nothing"):
            write_all(fd, b"abc")
    finally:
        os.close(fd)


def test_a_failing_write_raises_its_own_error(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as caught:
            write_all(fd, b"abc")  # a descriptor open for reading only
    finally:
        os.close(fd)
    assert caught.value.errno is not None


# --- fsync_dir -----------------------------------------------------------------------------


def test_fsync_dir_syncs_the_directory_itself_and_closes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaked_fds: None
) -> None:
    synced: list[os.stat_result] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    (tmp_path / "new").write_bytes(b"x")
    fsync_dir(tmp_path)
    [st_] = synced
    assert stat.S_ISDIR(st_.st_mode)
    assert (st_.st_dev, st_.st_ino) == (tmp_path.stat().st_dev, tmp_path.stat().st_ino)


def test_fsync_dir_closes_the_directory_when_the_fsync_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaked_fds: None
) -> None:
    def fsync(_fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        fsync_dir(tmp_path)


def test_fsync_dir_refuses_a_file_and_a_missing_path(tmp_path: Path, no_leaked_fds: None) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "file")
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "missing")


# --- locks ---------------------------------------------------------------------------------


def test_a_lock_held_by_another_open_file_is_refused_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.touch()
    first, second = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        assert lock(first, wait=False)
        assert not lock(second, wait=False)  # flock is per open file: this one is another
        os.close(first)  # closing the holder lets go
        first = -1
        assert lock(second, wait=False)
    finally:
        for fd in (first, second):
            if fd >= 0:
                os.close(fd)


def test_locked_waits_for_the_holder_and_leaves_nothing_open(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def first() -> None:
        with locked(path):
            order.append("first in")
            inside.set()
            release.wait(10)
            order.append("first out")

    def second() -> None:
        with locked(path):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert inside.wait(HANG_S)
    threads[1].start()  # waits in flock until the first block ends
    with locked(path.with_name("other.lock")):  # another file's lock does not wait
        fd = os.open(path, os.O_RDWR)
        try:
            assert not lock(fd, wait=False)  # held by the first block
        finally:
            os.close(fd)
    release.set()
    for t in threads:
        t.join(HANG_S)
    assert order == ["first in", "first out", "second in"]
    assert str(path) not in _open_paths()


def test_replace_file_puts_the_whole_new_content_in_place(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text("old")
    replace_file(path, b"new content\n")
    assert path.read_bytes() == b"new content\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rules.toml"]  # no temporary left


def test_replace_file_never_writes_through_a_link_left_in_its_way(tmp_path: Path) -> None:
    """A leftover (or planted) symlink at the temporary name is removed, not followed."""
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    path = tmp_path / "state"
    (tmp_path / f".state.{os.getpid()}.tmp").symlink_to(victim)
    replace_file(path, b"mine")
    assert victim.read_text() == "keep me"
    assert path.read_bytes() == b"mine" and not path.is_symlink()


def test_replace_file_fails_whole_and_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "state"  # its folder does not exist
    with pytest.raises(OSError):
        replace_file(path, b"x")
    assert not path.exists()
