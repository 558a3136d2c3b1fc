"""A real ``loopd serve`` process for the daemon tests, and the config its clients share.

:func:`daemon_config` writes a config file: the fake llama-server's URL, a log directory,
one local tool host with the file tools and ``run_command`` (allowed), and a short runtime
directory (ipc:// paths are short). :class:`Daemon` runs ``python -m actors.cli serve`` on
it and waits until its socket answers; leaving the block stops it (SIGTERM, then SIGKILL
as a last resort) and fails the test if it or anything it started is still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pexpect
import psutil

from actors.base import config as cfg
from actors.base.processes.trees import is_alive, kill_tree
from actors.daemon.client import Client, find_daemon
from tests.support.watch import HANG_S, wait_until

__all__ = ["ROOT", "Daemon", "chat", "cli", "client_gone_mid_turn", "daemon_config", "env"]

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("read_file", "list_dir", "write_file", "run_command")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH", "")) if p)
    return e


@contextlib.contextmanager
def chat(config_path: Path, session: str) -> Iterator[pexpect.spawn]:
    """``loopd chat`` on a terminal of its own (pexpect, 50 x 200, no colour) with the
    daemon's config; killed at the end of the block if it is still running."""
    child = pexpect.spawn(
        sys.executable, ["-m", "actors.cli", "chat", "--config", str(config_path),
                         "--session", session],
        cwd=str(ROOT), env={**env(), "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200"},
        encoding="utf-8", timeout=60, dimensions=(50, 200),
    )  # fmt: skip
    try:
        yield child
    finally:
        if child.isalive():
            child.kill(9)
            child.close(force=True)


def daemon_config(
    root: Path, run_dir: Path, url: str, *, workspace: Path | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
    allow: tuple[str, ...] = ("run_command", "write_file"),
    hosts: dict[str, tuple[str, ...]] | None = None, **daemon: Any,
) -> Path:  # fmt: skip
    """Write ``root/loopd.toml`` for the daemon and its clients; its path. ``workspace``:
    another config's (default ``root/ws``); ``sections``: more keys, by section; ``hosts``:
    local tool hosts by name (default one, ``tools``, with the file tools and run_command)."""
    workspace = workspace or root / "ws"
    root.mkdir(parents=True, exist_ok=True)
    workspace.mkdir(exist_ok=True)
    (workspace / "notes.txt").write_text("hello from the workspace\n")
    table: dict[str, dict[str, Any]] = {
        "inference": {"url": url, "retries": 1, "backoff_s": 0.01, "timeout_s": 30},
        "log": {"dir": str(root / "sessions"), "fsync": "always"},
        # Heartbeats of 1 s: a peer gone is seen within 3 s, and a healthy one starved for a
        # second on a busy machine is not taken for gone. Start-up limits are hang guards.
        "tools": {"standard": False, "workspace": str(workspace), "timeout_s": 30,
                  "heartbeat_s": 1.0, "start_timeout_s": 120, "allow": list(allow)},
        "daemon": {"runtime_dir": str(run_dir), "heartbeat_s": 1.0, **daemon},
    }  # fmt: skip
    for name, keys in (sections or {}).items():
        table[name] = {**table.get(name, {}), **keys}
    lines = []
    for name, keys in table.items():
        lines += [f"[{name}]", *(f"{k} = {json.dumps(v)}" for k, v in keys.items())]
    for name, tools in (hosts or {"tools": TOOLS}).items():
        lines += ["[[tools.hosts]]", f"name = {json.dumps(name)}", f"tools = {json.dumps(tools)}"]
    path = root / "loopd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cli(
    config: Path, *args: str, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``loopd ARGS --config CONFIG`` in its own process (``stdin``: its input, else none);
    its result (text)."""
    return subprocess.run(
        [sys.executable, "-m", "actors.cli", *args, "--config", str(config)],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout, input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
    )  # fmt: skip


class Daemon:
    """``loopd serve`` on ``config`` in its own process, up once its socket answers
    (``preexec_fn``: run in the child before it starts, e.g. to lower a limit)."""

    def __init__(
        self, config: Path, *, wait: bool = True, preexec_fn: Callable[[], None] | None = None
    ) -> None:
        self.config_path = config
        self.config = cfg.load(config)
        self.log = config.parent / "daemon.log"
        self._out = open(self.log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "actors.cli", "serve", "--config", str(config)],
            cwd=ROOT, env=env(), stdin=subprocess.DEVNULL, stdout=self._out,
            stderr=subprocess.STDOUT, preexec_fn=preexec_fn,
        )  # fmt: skip
        self.pid = self.proc.pid
        if wait:
            try:
                wait_until(self.answers, timeout=60, what="the daemon to answer")
            except BaseException as e:  # no `with` block will stop it: stop it here
                kill_tree(self.pid)
                self.proc.wait(HANG_S)
                self._out.close()
                raise AssertionError(f"{e}: {self.text()}") from None

    def answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"loopd serve exited with {self.proc.returncode}: {self.text()}")
        client = find_daemon(self.config)
        if client is None:
            return False
        client.close()
        return True

    def client(self) -> Client:
        return Client.from_config(self.config)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def children(self) -> list[psutil.Process]:
        try:
            return [c for c in psutil.Process(self.pid).children(recursive=True) if is_alive(c)]
        except psutil.Error:
            return []

    def commands(self) -> list[str]:
        """The command lines of the daemon's live descendants; one that ends while it is
        read (a zombie's command line cannot be read) is left out, not an error."""
        lines = []
        for c in self.children():
            with contextlib.suppress(psutil.Error):
                lines.append(" ".join(c.cmdline()))
        return lines

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, and its exit code (fails past ``timeout``)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        started = self.children()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:  # its own deadline (daemon.stop_grace_s) ends it first
                self.proc.wait(self.config.daemon.stop_grace_s + HANG_S)
            except subprocess.TimeoutExpired:
                kill_tree(self.pid)
                self.proc.wait(HANG_S)
                raise AssertionError(f"the daemon did not stop on SIGTERM: {self.text()}") from None
            if "did not stop within daemon.stop_grace_s" in self.text():
                raise AssertionError(f"the daemon's stop outlasted its grace: {self.text()}")
        self._out.close()
        wait_until(lambda: not any(is_alive(p) for p in started), timeout=30,
                   what="what the daemon started to exit")  # fmt: skip

    def __enter__(self) -> Daemon:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        finally:
            for p in self.children():
                kill_tree(p.pid)


@contextlib.contextmanager
def client_gone_mid_turn(
    daemon: Daemon, session: str, *args: str
) -> Iterator[subprocess.Popen[str]]:
    """A client process (``tests.daemon.turn_client``) running a turn of ``session``: the
    block waits for the moment to kill it; then it is killed, and the daemon must cancel
    the turn and give the session up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.daemon.turn_client", str(daemon.config_path), session,
         *args],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield proc
        proc.kill()
        proc.wait(HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()

    def released() -> bool:
        with daemon.client() as c:
            return not c.status().sessions

    wait_until(released, 30, "the daemon to cancel the turn and give the session up")
