"""Helpers for tests that start real tool hosts: short socket paths, processes that are
always cleaned up, a raw DEALER for speaking the wire protocol by hand, and process checks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import zmq

from actors.base.processes.trees import is_alive, kill_session, kill_tree
from actors.tools.protocol import wire
from tests.support.watch import HANG_S, wait_until

__all__ = [
    "FAKE",
    "ROOT",
    "HandHost",
    "ask",
    "descendants",
    "host_processes",
    "raw_dealer",
    "recv",
    "short_dir",
    "spawn_host",
    "wait_until",
]

ROOT = Path(__file__).resolve().parents[2]
FAKE = "tests.tools.fake_tools:provider"


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """A fresh directory with a short path (ipc:// paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="lt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def host_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def spawn_host(
    endpoint: str, *args: str, log: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A tool host process (its own session); killed with everything it started on exit.
    ``env`` is added to (or, for a key already there, replaces) the host's environment."""
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "actors.tools.host", "--bind", endpoint,
         "--parent-pid", str(os.getpid()), *args],
        cwd=ROOT, env={**host_env(), **(env or {})}, stdin=subprocess.DEVNULL,
        stdout=out, stderr=out,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        kill_tree(proc.pid)
        proc.wait()
        kill_session(proc.pid)
        if not isinstance(out, int):
            out.close()


class HandHost:
    """A host's ROUTER that the test plays by hand (answers, silence, nonsense when it
    wants); each message with the routing id of the socket it came from."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str) -> None:
        self.sock: zmq.Socket[Any] = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)

    def receive(self, timeout: float = HANG_S) -> tuple[bytes, wire.Message]:
        assert self.sock.poll(int(timeout * 1000)), "the port sent nothing"
        peer, frame = self.sock.recv_multipart()
        return peer, wire.decode(frame)

    def expect(self, kind: type[wire.Message], not_from: bytes = b"") -> bytes:
        """Skip to the next message of ``kind`` (Hello is retried, pings keep coming), from
        a peer other than ``not_from`` (what an old socket sent may still be queued)."""
        while True:
            peer, msg = self.receive()
            if isinstance(msg, kind) and peer != not_from:
                return peer

    def send(self, peer: bytes, msg: wire.Message | bytes) -> None:
        self.sock.send_multipart([peer, msg if isinstance(msg, bytes) else wire.encode(msg)])

    def close(self) -> None:
        self.sock.close(linger=0)


@contextlib.contextmanager
def raw_dealer(endpoint: str, **options: Any) -> Iterator[zmq.Socket[Any]]:
    """A DEALER connected to ``endpoint`` (its own context), closed on exit."""
    ctx: zmq.Context[Any] = zmq.Context()
    sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        setattr(sock, name, value)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close(linger=0)
        ctx.term()


def recv(sock: zmq.Socket[Any], timeout: float = HANG_S) -> wire.Message | None:
    """The next message on ``sock``, or None after ``timeout`` (by default a hang guard; a
    test that shows nothing comes passes a short one)."""
    if not sock.poll(int(timeout * 1000)):
        return None
    return wire.decode(sock.recv())


def ask(
    sock: zmq.Socket[Any], msg: wire.Message, timeout: float = HANG_S
) -> wire.Message | None:
    sock.send(wire.encode(msg))
    return recv(sock, timeout)


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """Living descendants of ``pid`` (default: this test process)."""
    try:
        procs = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in procs if is_alive(p)]


def host_processes() -> list[psutil.Process]:
    """Living tool host processes started by this test process (any depth)."""
    me = str(os.getpid())
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "actors.tools.host" in cmd and me in cmd and is_alive(p):
            found.append(p)
    return found
