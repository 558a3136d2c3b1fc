"""Running one command for ``run_command``: captured, capped, and killed with its tree.

The command line (``/bin/sh -c``, in bubblewrap or not: see
:mod:`actors.tools.providers.sandbox`) runs with the environment it is given, in a process
group of its own (inside the tool host's session, see :mod:`actors.base.processes.trees`). Its
output (stdout and stderr together) is read as it comes; past ``max_output`` bytes it is
still read, so the command never blocks on a full pipe, but only counted. On a timeout or
a cancel the whole group and every descendant is killed. When the command itself exits,
whatever it left running in the background is killed too: a command must not leave
processes behind in the tool host.
"""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from actors.base.processes.trees import kill_group
from actors.tools.protocol.provider import starting_process

__all__ = ["CommandOutcome", "run_shell"]

_DRAIN_AFTER_EXIT_S = 0.5  # an escaped background process may hold the pipe open


@dataclasses.dataclass(frozen=True, slots=True)
class CommandOutcome:
    exit_code: int | None  # None when it was stopped (timeout or cancel)
    output: bytes  # at most max_output bytes
    dropped: int  # output bytes read past max_output
    stopped: str = ""  # "timeout", "cancelled" or "refused" when it did not end by itself
    why: str = ""  # "refused": why it could not be started as asked


def run_shell(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    max_output: int,
    cancel: threading.Event | None = None,
    pass_fds: Sequence[int] = (),
    started: Callable[[], str] | None = None,
) -> CommandOutcome:
    """Run ``argv`` to its end, its timeout, or ``cancel``; never leaves a process.

    ``started`` is called once the process is started, before its output is read; when it
    says why the command must not go on, the command is killed at once (``"refused"``)."""
    with starting_process():  # on every CPU, not the tool host's worker's one
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    assert proc.stdout is not None
    output = _Output(max_output)
    stopped = why = ""
    deadline = time.monotonic() + timeout_s
    try:
        if started is not None and (why := started()):
            stopped = "refused"
        else:
            stopped = _follow(proc, proc.stdout.fileno(), output, deadline, cancel)
    finally:
        kill_group(proc.pid, also=proc.pid)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent above
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return CommandOutcome(
        exit_code=None if stopped else proc.returncode,
        output=bytes(output.kept),
        dropped=output.dropped,
        stopped=stopped,
        why=why,
    )


class _Output:
    """What a command wrote: the first ``limit`` bytes kept, the rest only counted."""

    def __init__(self, limit: int) -> None:
        self.limit, self.kept, self.dropped = limit, bytearray(), 0

    def take(self, chunk: bytes) -> None:
        keep = max(0, self.limit - len(self.kept))
        self.kept += chunk[:keep]
        self.dropped += max(0, len(chunk) - keep)


def _follow(proc: subprocess.Popen[bytes], fd: int, output: _Output, deadline: float,
            cancel: threading.Event | None) -> str:
    """Read the command's output until it ends ("") or is to be stopped ("timeout",
    "cancelled"); once it exits, its background leftovers are killed and the pipe is read
    for at most :data:`_DRAIN_AFTER_EXIT_S` more (an escaped process may hold it open)."""
    os.set_blocking(fd, False)
    exited_at: float | None = None
    while True:
        now = time.monotonic()
        if cancel is not None and cancel.is_set():
            return "cancelled"
        if now >= deadline:
            return "timeout"
        if exited_at is None and proc.poll() is not None:
            exited_at = now
            kill_group(proc.pid, wait_s=0.2)  # background leftovers
        if exited_at is not None and now - exited_at > _DRAIN_AFTER_EXIT_S:
            return ""
        ready, _, _ = select.select([fd], [], [], min(0.05, deadline - now))
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if not chunk:
            return ""
        output.take(chunk)
