"""run_command in bubblewrap, through a real tool host: each promise of the sandbox, attacked.

Before the sandbox (issue 13) a command wrote outside the workspace, reached the network,
saw the host's whole environment (secrets included), and a ``setsid`` child outlived the
host. Each test here failed on the host run with ``--sandbox none`` (which is the old way of
running commands). These need ``bwrap``; where it is missing they are skipped, except under
``LOOPD_REQUIRE_BWRAP=1`` (set by .ci/run, which installs it), where they fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from actors.tools.protocol import wire
from actors.tools.providers.sandbox import Sandbox
from tests.support.watch import living, wait_until
from tests.tools.hostkit import ask, raw_dealer, recv, short_dir, spawn_host

SECRET_VAR, SECRET = "LOOPD_TEST_API_KEY", "sk-do-not-leak-4a7f"


@pytest.fixture(scope="module", autouse=True)
def bwrap_works() -> None:
    with short_dir() as d:
        why = Sandbox().check(os.environ, d)
    if why:
        if os.environ.get("LOOPD_REQUIRE_BWRAP") == "1":
            pytest.fail(f"LOOPD_REQUIRE_BWRAP=1 but the sandbox cannot run: {why}")
        pytest.skip(f"bubblewrap cannot run here: {why}")


class Host(NamedTuple):
    endpoint: str
    pid: int
    workspace: Path
    outside: Path


@contextlib.contextmanager
def _shell_host(*extra: str, env: dict[str, str] | None = None) -> Iterator[Host]:
    with short_dir() as d:
        workspace, outside = d / "ws", d / "out"
        workspace.mkdir()
        outside.mkdir()
        endpoint = f"ipc://{d}/shell.sock"
        args = ["--tools", "run_command", "--workspace", str(workspace), "--timeout", "20"]
        args += ["--allow", "run_command", *extra]
        host_env = {SECRET_VAR: SECRET, **(env or {})}
        with spawn_host(endpoint, *args, log=d / "host.log", env=host_env) as proc:
            yield Host(endpoint, proc.pid, workspace, outside)


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    with _shell_host() as h:
        yield h


def _run(endpoint: str, command: str, call: int = 1) -> wire.Message | None:
    with raw_dealer(endpoint) as sock:
        return ask(sock, wire.ToolRequest(call, "s", call, "run_command", {"command": command}))


def _output(answer: Any) -> str:
    assert isinstance(answer, wire.Result), answer
    return str(answer.content)


def test_nothing_outside_the_workspace_can_be_written(host: Host) -> None:
    tag = f"loopd-sbx-{os.getpid()}"
    home = Path(os.path.expanduser("~"))
    command = (
        f"echo in > inside.txt; echo out > {host.outside}/x.txt; echo t > /tmp/{tag}; "
        f"touch {home}/{tag}; mkdir /usr/{tag}; "
        "cat /proc/sys/vm/swappiness > /proc/sys/vm/swappiness || echo sysctl refused; "
        "echo done"
    )  # the sysctl write puts its own value back: harmless even if it went through
    text = _output(_run(host.endpoint, command))
    assert "sysctl refused" in text  # as root too (CI): its /proc/sys is read-only
    assert text.startswith("exit code: 0\n")
    assert "Read-only file system" in text
    assert (host.workspace / "inside.txt").read_text() == "in\n"
    assert list(host.outside.iterdir()) == []
    assert not Path(f"/tmp/{tag}").exists()  # its /tmp was its own
    assert not (home / tag).exists()
    assert not Path(f"/usr/{tag}").exists()


def test_tmp_is_private_and_the_hosts_sockets_are_not_there(host: Host) -> None:
    """The workspace here is under /tmp, so the sandbox's /tmp holds the path to it and
    nothing else: not the host's socket and log beside the workspace, nor "out"."""
    d = host.workspace.parent
    text = _output(_run(host.endpoint, f"ls -A /tmp; echo --; ls -A {d}"))
    assert text == f"exit code: 0\n{d.name}\n--\nws\n"
    assert sorted(p.name for p in d.iterdir()) == ["host.log", "out", "shell.sock", "ws"]


class _Listener:
    """A TCP server on loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()

    def close(self) -> None:
        self.sock.close()


_CONNECT = (
    "import socket,sys\n"
    "try:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])), 5); print('connected')\n"
    "except OSError as e:\n print('no network:', e)\n"
)


def test_no_network_unless_the_config_gives_it(host: Host) -> None:
    listener = _Listener()
    try:
        # The interpreter itself, not the venv's link to it: a checkout under /tmp (a fresh
        # clone) has its venv hidden by the sandbox's private /tmp.
        python = os.path.realpath(sys.executable)
        command = f"{python} -c \"$(cat connect.py)\" {listener.port}"
        (host.workspace / "connect.py").write_text(_CONNECT)
        text = _output(_run(host.endpoint, command))
        assert "no network:" in text
        assert listener.accepted == 0
        with _shell_host("--network") as open_host:
            (open_host.workspace / "connect.py").write_text(_CONNECT)
            assert "connected" in _output(_run(open_host.endpoint, command))
        assert listener.accepted == 1
    finally:
        listener.close()


def test_the_environment_is_the_allow_list_not_the_hosts(host: Host) -> None:
    text = _output(_run(host.endpoint, "env"))
    names = {line.split("=", 1)[0] for line in text.splitlines()[1:] if "=" in line}
    assert SECRET not in text
    assert SECRET_VAR not in names
    assert "PATH" in names
    assert "PYTHONPATH" not in names  # the host has it; commands do not
    allowed = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TZ", "TMPDIR", "PWD"}
    assert names - allowed <= {n for n in names if n.startswith("LC_")} | {"SHLVL", "OLDPWD"}


def test_a_setsid_child_dies_with_its_command(host: Host) -> None:
    """The child leaves the command's session and group (it signals once it has), so only the
    pid namespace ending with the command can take it."""
    command = (
        "rm -f in-new-session; setsid sh -c 'touch in-new-session; exec sleep 4243.5' & "
        "while [ ! -e in-new-session ]; do :; done; echo started"
    )
    try:
        text = _output(_run(host.endpoint, command))
        assert text == "exit code: 0\nstarted\n"
        wait_until(lambda: not living(["sleep", "4243.5"]), what="the setsid child to be gone")
    finally:
        for p in living(["sleep", "4243.5"]):
            p.kill()


def test_nothing_survives_the_host_killed_mid_command() -> None:
    """SIGKILL, so no cleanup of the host runs: the sandbox's own kill (--die-with-parent, and
    the pid namespace ending with its first process) is all that is left."""
    with _shell_host() as h:
        try:
            with raw_dealer(h.endpoint) as sock:
                command = "setsid sleep 4244.5 & sleep 4244.6 & wait"
                sock.send(wire.encode(wire.ToolRequest(1, "s", 1, "run_command", {
                    "command": command})))  # fmt: skip
                wait_until(
                    lambda: living(["sleep", "4244.5"]) and living(["sleep", "4244.6"]),
                    what="the command's processes to start",
                )
                os.kill(h.pid, signal.SIGKILL)
                assert recv(sock, timeout=0.5) is None
            wait_until(
                lambda: not living(["sleep", "4244.5"]) and not living(["sleep", "4244.6"]),
                what="every process of the command to be gone after the host",
            )
        finally:  # a leak must not outlive the test either
            for argv in (["sleep", "4244.5"], ["sleep", "4244.6"]):
                for p in living(argv):
                    p.kill()


def test_without_bwrap_run_command_refuses_with_the_install_command() -> None:
    with short_dir() as empty, _shell_host(env={"PATH": str(empty)}) as h:
        answer = _run(h.endpoint, "echo should not run > ran.txt")
        assert isinstance(answer, wire.Failed), answer
        assert "bwrap is not on the PATH" in answer.message
        assert "apt-get install bubblewrap" in answer.message
        assert 'tools.shell.sandbox = "none"' in answer.message
        assert not (h.workspace / "ran.txt").exists()


def test_sandbox_none_runs_commands_unsandboxed_and_says_so_at_start() -> None:
    with short_dir() as empty, _shell_host("--sandbox", "none", env={"PATH": str(empty)}) as h:
        text = _output(_run(h.endpoint, "echo ran > ran.txt; echo ok"))
        assert text == "exit code: 0\nok\n"
        assert (h.workspace / "ran.txt").read_text() == "ran\n"
        log = (h.workspace.parent / "host.log").read_text()
        assert "run_command runs commands WITHOUT a sandbox" in log


def test_the_pid_namespace_shows_only_the_commands_processes(host: Host) -> None:
    text = _output(_run(host.endpoint, "ls /proc | grep -c '^[0-9]'"))
    assert int(text.splitlines()[1]) < 10  # the sandbox's init, sh, ls, grep: not the machine's

