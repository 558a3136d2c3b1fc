"""Attacks on the file tools through a real tool host: a hostile workspace, a hostile pattern.

Each test stands for one break found by the outside review and failed before its
fix: a FIFO (or a device, a socket) that blocked a worker forever, a host whose stuck
workers made it answer "busy" for ever while still answering pings, a directory swapped for
a symlink while the tools run (``renameat2(RENAME_EXCHANGE)`` in a loop), ``write_file``
making directories outside before its check, a hardlink to a file outside, and a regular
expression that backtracks for ever.
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import zmq

from actors.tools.port import PortSettings, ToolPort, start_port
from actors.tools.protocol import wire
from tests.tools.hostkit import short_dir, spawn_host

SECRET = "SECRET-outside-the-workspace"
FILE_TOOLS = ["read_file", "list_dir", "search_files", "write_file"]


class Rig(NamedTuple):
    port: ToolPort
    workspace: Path
    outside: Path


@pytest.fixture
def rig() -> Iterator[Rig]:
    """A files host (writes allowed, 3 s per call) on a fresh workspace and a secret outside."""
    with short_dir() as d:
        workspace, outside = d / "ws", d / "out"
        workspace.mkdir()
        outside.mkdir()
        (outside / "f.txt").write_text(f"{SECRET}\n")
        endpoint = f"ipc://{d}/files.sock"
        args = ["--tools", *FILE_TOOLS, "--workspace", str(workspace), "--timeout", "3"]
        args += ["--allow", "write_file", "--max-calls", "2"]
        with spawn_host(endpoint, *args, log=d / "host.log"):
            port = start_port(PortSettings("files", endpoint, 3.0, 0.5), context=zmq.Context())
            try:
                assert port.wait_ready(30)
                yield Rig(port, workspace, outside)
            finally:
                port.stop()


def _call(port: ToolPort, tool: str, **arguments: Any) -> wire.Answer:
    return port.call(session="s", call=1, tool=tool, arguments=arguments)


def _refusal(answer: wire.Answer) -> str:
    assert isinstance(answer, wire.Denied | wire.Failed), answer
    return answer.reason if isinstance(answer, wire.Denied) else answer.message


# --- FIFOs, devices, sockets ------------------------------------------------------------------


def _specials(workspace: Path) -> dict[str, str]:
    """Non-regular files in the workspace: name -> what the refusal calls it."""
    os.mkfifo(workspace / "pipe")
    made = {"pipe": "FIFO"}
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(workspace / "sock"))
    sock.close()
    made["sock"] = "socket"
    try:  # root only (CI and this machine run as root)
        os.mknod(workspace / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        made["null"] = "character device"
    except PermissionError:
        pass
    return made


def test_fifos_devices_and_sockets_are_refused_without_blocking(rig: Rig) -> None:
    port, workspace, _ = rig
    specials = _specials(workspace)
    (workspace / "ok.txt").write_text("needle\n")
    for name, kind in specials.items():
        for tool, args in [
            ("read_file", {"path": name}),
            ("write_file", {"path": name, "content": "x"}),
        ]:
            text = _refusal(_call(port, tool, **args))
            assert f"is a {kind}, not a regular file" in text, (tool, text)
    # the search goes past them (it used to block on the FIFO) and finds the real file
    answer = _call(port, "search_files", pattern="needle")
    assert answer == wire.Result(answer.id, "ok.txt:1: needle")
    listing = _call(port, "list_dir")
    assert isinstance(listing, wire.Result)
    assert "pipe  (FIFO)" in listing.content.splitlines()
    # more calls than the host has workers: none of the above left a worker stuck
    for _ in range(4):
        assert isinstance(_call(port, "read_file", path="ok.txt"), wire.Result)


# --- a directory swapped for a symlink while the tools run ----------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


def _swapper(a: Path, b: Path, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            _exchange(a, b)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_a_directory_swapped_for_a_symlink_leaks_nothing(rig: Rig) -> None:
    """``d`` and a symlink to the directory outside trade places thousands of times a second
    while the tools read, list, search and write through ``d``: nothing from outside comes
    back, and nothing is written or made outside. Before the fix about 1 call in 10 leaked."""
    port, workspace, outside = rig
    (workspace / "d").mkdir()
    (workspace / "d" / "f.txt").write_text("harmless\n")
    (workspace / "x").symlink_to(outside)
    stop = threading.Event()
    thread = _swapper(workspace / "d", workspace / "x", stop)
    answers: list[wire.Answer] = []
    try:
        for i in range(60):
            answers.append(_call(port, "read_file", path="d/f.txt"))
            answers.append(_call(port, "list_dir", path="d"))
            answers.append(_call(port, "search_files", pattern="SECRET|harmless", path="d"))
            answers.append(_call(port, "search_files", pattern="SECRET|harmless"))
            answers.append(_call(port, "write_file", path=f"d/made{i}/new.txt", content="written"))
    finally:
        stop.set()
        thread.join()
    texts = [_refusal(a) if not isinstance(a, wire.Result) else a.content for a in answers]
    leaked = [t for t in texts if SECRET in t]
    made = sorted(p.name for p in outside.iterdir() if p.name != "f.txt")
    assert not leaked and not made, (
        f"{len(leaked)} of {len(texts)} answers leaked ({leaked[:1]}); "
        f"{len(made)} made outside ({made[:3]})"
    )
    assert (outside / "f.txt").read_text() == f"{SECRET}\n"
    assert sum(isinstance(a, wire.Result) for a in answers) > 0  # the tools did run


def test_write_file_makes_no_directory_outside_before_it_refuses(rig: Rig) -> None:
    port, workspace, outside = rig
    (workspace / "dir_out").symlink_to(outside)
    text = _refusal(_call(port, "write_file", path="dir_out/made/deep/f.txt", content="x"))
    assert "outside the workspace" in text
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]  # no "made" out there


# --- hardlinks --------------------------------------------------------------------------------


def test_a_hardlink_to_a_file_outside_is_not_written(rig: Rig) -> None:
    port, workspace, outside = rig
    os.link(outside / "f.txt", workspace / "linked.txt")
    text = _refusal(_call(port, "write_file", path="linked.txt", content="overwritten"))
    assert "linked.txt has 2 hard links" in text
    assert (outside / "f.txt").read_text() == f"{SECRET}\n"
    # reading one is allowed (docs/configuration.md#what-the-tools-can-and-cannot-do):
    # whoever made the link could read the file already, and package stores (pnpm, ccache)
    # are full of them
    read = _call(port, "read_file", path="linked.txt")
    assert read == wire.Result(read.id, f"{SECRET}\n")


# --- a catastrophic pattern -------------------------------------------------------------------


def test_a_catastrophic_pattern_does_not_freeze_the_host(rig: Rig) -> None:
    """``(a+)+$`` against a long line of a's backtracks exponentially in Python's re: the
    search ran past its limit, the worker never came back and pings stopped for ~19 s.
    With a linear-time engine the search finishes and says what it found."""
    port, workspace, _ = rig
    (workspace / "a.txt").write_text("a" * 50_000 + "b\naaaa\n")
    answer = _call(port, "search_files", pattern="(a+)+$")
    assert answer == wire.Result(answer.id, "a.txt:2: aaaa")
    for _ in range(3):  # no worker left behind either
        again = _call(port, "search_files", pattern="(a+)+$")
        assert isinstance(again, wire.Result)


def test_patterns_the_linear_engine_cannot_run_fail_with_the_reason(rig: Rig) -> None:
    port, _, _ = rig
    text = _refusal(_call(port, "search_files", pattern=r"(a)\1"))
    assert "not a valid regular expression" in text
    assert "backreferences" in text
