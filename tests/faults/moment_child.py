"""One run of loopd's durable work, stopped at its K-th step of I/O to be SIGKILLed there
(tests/faults/test_kill_moments.py).

    python -m tests.faults.moment_child ROOT K WHEN     (K = -1: run to the end, count)

The run (:func:`script`), in a fresh ROOT, with the fake llama-server (the agent script,
slot saves to ROOT/save) and one local tool host: session ``a``'s turns with tool calls
(the slot keeper saving the KV state after each), a compaction by hand, a fork of ``a``
into ``b``, a rewind of ``b`` and a turn on it, a turn of ``a`` past the context (an auto
compaction), three clients' turns at once on sessions ``c0``-``c2``, a turn of ``e`` that
hands two tasks to agents (``e.a1`` fresh, ``e.a2`` forked), and a ``loopd serve``
of its own (in this process) with three clients of it at once on ``d0``-``d2``.

A *step* is one call of ``os.write``, ``fsync``, ``fdatasync``, ``ftruncate``, ``rename``,
``replace``, ``unlink`` or ``mkdir`` on a file under ROOT, from any thread. At step K the
child prints ``moment K WHEN OP PHASE`` and every thread that reaches a step after it
waits for ever: nothing more is written before the test's SIGKILL. WHEN is ``before``
(the step not done), ``after`` (done), or ``half`` (a write of half its bytes: a torn
write). Without a moment (K = -1) the run prints ``trace OP PATH ...`` for each step
(:func:`_trace`) and ``phase NAME STEP`` as each phase starts, and ends with
``finished STEPS``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PHASES", "config", "message", "script"]

PHASES = ("turns", "compact", "fork", "rewind", "auto-compact", "clients", "agents", "daemon")
N_CTX = 2048  # the fake's context: turn 3 of a (its file read kept) goes past compact_at
_OPS = ("write", "fsync", "fdatasync", "ftruncate", "rename", "replace", "unlink", "mkdir")


class _Moment:
    """Counts steps under ``root``; at step ``k`` says so and stops every later step."""

    def __init__(self, root: str, k: int, when: str) -> None:
        self.root = os.path.realpath(root) + os.sep
        self.k, self.when = k, when
        self.steps = 0
        self.phase = "start"
        self.lock = threading.Lock()
        self.stopped = False

    def _inside(self, target: Any) -> bool:
        if isinstance(target, int):
            try:
                target = os.readlink(f"/proc/self/fd/{target}")
            except OSError:
                return False
        try:
            return os.path.abspath(os.fsdecode(target)).startswith(self.root)
        except TypeError:
            return False

    def wrap(self, op: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            if not args or not self._inside(args[0]):
                return real(*args, **kwargs)
            with self.lock:
                if self.stopped:
                    _wait()
                n, self.steps = self.steps, self.steps + 1
                if n == self.k:
                    self.stopped = True
            if n != self.k:
                if self.k < 0:  # the clean run: the trace of its steps, for their order
                    with self.lock:  # whole lines, in the order of the steps
                        print(_trace(op, args), flush=True)
                        return real(*args, **kwargs)
                return real(*args, **kwargs)
            when = self.when if op == "write" or self.when != "half" else "after"
            try:  # a step that fails (mkdir of a directory there) is a moment too
                if when == "half":
                    data = bytes(args[1])
                    real(args[0], data[: max(1, len(data) // 2)])
                elif when == "after":
                    real(*args, **kwargs)
            except OSError:
                pass
            print(f"moment {n} {when} {op} {self.phase}", flush=True)
            _wait()
        return step


def _trace(op: str, args: tuple[Any, ...]) -> str:
    """``trace OP PATH [TO]``: the file (an fd's, read from /proc), where a rename puts it,
    and ``dir`` when a directory is renamed."""
    where = args[0]
    if isinstance(where, int):
        where = os.readlink(f"/proc/self/fd/{where}")
    words = ["trace", op, os.fsdecode(where)]
    if op in ("rename", "replace"):
        words += [os.fsdecode(args[1]), "dir" if os.path.isdir(args[0]) else "file"]
    return " ".join(words)


def _wait() -> Any:
    while True:
        time.sleep(3600)


def install(root: str, k: int, when: str) -> _Moment:
    """Wrap the os functions (before loopd is imported: some keep a reference to them)."""
    moment = _Moment(root, k, when)
    for op in _OPS:
        setattr(os, op, moment.wrap(op, getattr(os, op)))
    return moment


def message(n: int, tag: str = "turn") -> str:
    """Turn ``n``'s message: one tool call of the three kinds in turn, then the answer."""
    steps = ('run_command {"command": "echo hello"}', 'read_file {"path": "notes.txt"}',
             'list_dir {"path": "."}')
    return f"{tag} {n:06d} :: {steps[(n - 1) % len(steps)]}"


def agents_message() -> str:
    """Session e's turn: two agent calls, a fresh child and a forked one (their tasks hold no
    ``::``: the parent's orders are split on it, so a child answers without tools)."""
    first = {"task": "kid1 reads"}
    second = {"task": "kid2 lists", "context": "fork"}
    return f"agents 000001 :: agent {json.dumps(first)} :: agent {json.dumps(second)}"


def config(root: Path, url: str) -> Any:
    from actors.base.config import parse

    return parse({
        "daemon": {"runtime_dir": str(root / "run"), "heartbeat_s": 1.0},
        "inference": {"url": url, "retries": 2, "backoff_s": 0.01, "timeout_s": 30},
        "log": {"dir": str(root / "sessions"), "fsync": "always"},
        "agents": {"enabled": True},
        "slots": {"save_dir": str(root / "save")},
        "session": {"compaction": "elide"},
        "tools": {
            "standard": False, "workspace": str(root / "ws"), "allow": ["run_command"],
            "heartbeat_s": 1.0, "start_timeout_s": 120,
            "hosts": [{"name": "tools", "tools": ["run_command", "read_file", "list_dir"]}],
        },
    })  # fmt: skip


def _ignore(_event: object) -> None:
    pass


def script(root: Path, url: str, phase: Callable[[str], None]) -> None:
    """The run: every phase of :data:`PHASES`, in order (see the module docstring)."""
    from actors.session.world import start_world

    (root / "ws").mkdir(parents=True, exist_ok=True)
    (root / "ws" / "notes.txt").write_text("hello from the workspace\n" * 160)
    with start_world(config(root, url)) as world:
        phase("turns")
        a = world.session("a")
        for n in (1, 2):
            a.turn(world.runtime, message(n), _ignore).get(timeout=120)
        phase("compact")
        a.compact(world.runtime, _ignore).get(timeout=120)
        phase("fork")
        world.fork("a", "b")
        phase("rewind")
        b = world.session("b")
        b.rewind(1).get(timeout=120)
        b.turn(world.runtime, message(3, "fork"), _ignore).get(timeout=120)
        phase("auto-compact")
        a.turn(world.runtime, message(5), _ignore).get(timeout=120)
        phase("clients")
        failures: list[BaseException] = []

        def client(c: int) -> None:
            try:
                s = world.session(f"c{c}")
                for n in (1, 2):
                    s.turn(world.runtime, message(n, f"client{c}"), _ignore).get(timeout=120)
            except BaseException as e:
                failures.append(e)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise failures[0]
        phase("agents")
        world.session("e").turn(world.runtime, agents_message(), _ignore).get(timeout=120)
    phase("daemon")
    daemon(config(root, url))


def daemon(cfg: Any) -> None:
    """``loopd serve`` in this process (its main thread) and three clients of it at once,
    each its own connection, running two turns on sessions ``d0``-``d2``; then it stops."""
    from actors.daemon.client import Client, find_daemon
    from actors.daemon.server.main import serve
    from tests.support.watch import wait_until

    failures: list[BaseException] = []

    def client(c: int) -> None:
        try:
            with Client.from_config(cfg) as each:
                for n in (1, 2):
                    each.turn(f"d{c}", message(n, f"daemon{c}")).run(_ignore)
        except BaseException as e:
            failures.append(e)

    def clients() -> None:
        try:
            probes: list[Any] = []
            wait_until(lambda: probes.append(find_daemon(cfg)) or probes[-1] is not None,
                       what="the daemon to listen")  # a poll with the suite's hang guard
            probes[-1].close()
            threads = [threading.Thread(target=client, args=(c,)) for c in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            with Client.from_config(cfg) as stopper:
                stopper.stop()

    driver = threading.Thread(target=clients)
    driver.start()
    serve(cfg, _ignore)
    driver.join()
    if failures:
        raise failures[0]


def main(root: str, k: str, when: str) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(40, exit=False)  # a hang says where, on stderr
    moment = install(root, int(k), when)

    def phase(name: str) -> None:
        moment.phase = name
        if moment.k < 0:  # the clean run says where each phase starts
            print(f"phase {name} {moment.steps}", flush=True)

    from tests.support.fake_llama import FakeLlama
    from tests.support.scripted_llama import agent

    save = Path(root) / "save"
    save.mkdir(parents=True, exist_ok=True)
    with FakeLlama(agent(), save_dir=save, props={"n_ctx": N_CTX}) as fake:
        script(Path(root), fake.url, phase)
    print(f"finished {moment.steps}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
