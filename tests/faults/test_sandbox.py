"""run_command in bubblewrap, through a real tool host: each promise of the sandbox, attacked.

Before the sandbox a command wrote outside the workspace, reached the network,
saw the host's whole environment (secrets included), and a ``setsid`` child outlived the
host. Each test here failed on the host run with ``--sandbox none`` (which is the old way of
running commands). These need ``bwrap``; where it is missing they are skipped, except under
``LOOPD_REQUIRE_BWRAP=1`` (set by .ci/run, which installs it), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from actors.log.records import ToolResult
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



# --- the sandbox cannot undo itself, and each command is bounded ------------------
# Run as root (as CI and many containers do), a command kept every capability inside its
# user namespace: it unmounted its private /tmp, reached the daemon's socket, started a turn
# and answered its own approval "always". And nothing bounded its /tmp, memory, processes,
# files or CPU. Each test below failed on the host of before (see /work/notes/harden.md).


def test_a_command_holds_no_capability_and_an_unprivileged_uid(host: Host) -> None:
    text = _output(_run(host.endpoint, "id -u; grep '^Cap' /proc/self/status"))
    lines = text.splitlines()[1:]
    assert lines[0] != "0"  # not root inside, whoever runs loopd
    caps = dict(line.split(":\t") for line in lines[1:])
    assert set(caps) == {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}
    assert all(int(v, 16) == 0 for v in caps.values()), caps


_EVERY_MOUNT = r"""
while read -r _ _ _ _ mp _; do
  mp=$(printf '%b' "$mp")
  umount "$mp" 2>/dev/null && echo "CHANGED umount $mp"
  umount -l "$mp" 2>/dev/null && echo "CHANGED umount -l $mp"
  mount -o remount,rw "$mp" 2>/dev/null && echo "CHANGED remount,rw $mp"
  mount -o remount,bind,rw "$mp" 2>/dev/null && echo "CHANGED remount,bind,rw $mp"
  mount -t tmpfs none "$mp" 2>/dev/null && echo "CHANGED mounted over $mp"
  echo "tried $mp"
done < /proc/self/mountinfo
unshare -Urm sh -c 'umount -l /tmp && echo CHANGED nested' 2>/dev/null || echo 'no nested namespace'
ls -A /tmp
"""


def test_no_mount_of_the_sandbox_can_be_changed(host: Host) -> None:
    """Every mount point the command sees, each way to change it: all refused, and its /tmp
    is still the private one afterwards (the attack: umount -l /tmp)."""
    text = _output(_run(host.endpoint, _EVERY_MOUNT))
    assert "CHANGED" not in text, text
    tried = [line for line in text.splitlines() if line.startswith("tried ")]
    assert {"tried /", "tried /tmp", str(f"tried {host.workspace}")} <= set(tried)
    assert len(tried) >= 10  # /, /dev, /dev/shm, /proc, /proc/sys, /tmp, /run, the workspace...
    assert "no nested namespace" in text
    assert text.splitlines()[-1] == host.workspace.parent.name  # /tmp: only the way in


def _git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null",
           "GIT_AUTHOR_NAME": "n", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "n",
           "GIT_COMMITTER_EMAIL": "a@b", "GIT_ALLOW_PROTOCOL": "file"}
    done = subprocess.run(["git", "-c", "protocol.file.allow=always", *args], cwd=cwd,
                          env=env, check=True, capture_output=True, text=True)
    return done.stdout


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file, link and directory under ``root``, with its content."""
    seen: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            seen[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            seen[rel] = path.read_bytes()
        else:
            seen[rel] = "dir"
    return seen


_GIT_ATTACKS = (
    "mv .git .git-old && mkdir .git && cp -a .git-old/. .git/ && echo moved;"
    " rm -rf .git 2>/dev/null; test -d .git/objects || echo removed;"
    " echo '[core] fsmonitor = touch /tmp/pwned' >> .git/config && echo config-written;"
    " touch .git/hooks/post-checkout && echo hook-written;"
    " touch .git/other && echo other-written;"
    " git commit -q --allow-empty -m inside 2>/dev/null && echo committed;"
    " echo '[core] fsmonitor = x' >> .git/modules/sub/config && echo module-written;"
    " mv .git/modules .git/m2 && echo modules-moved;"
    " echo 'gitdir: /tmp' > sub/.git && echo pointer-written;"
    " mv sub/.git sub/g && echo pointer-moved;"
    " echo x >> nested/.git/config && echo nested-written;"
    " mv nested/.git nested/g && echo nested-moved;"
    " echo x >> org/deep/.git/config && echo deep-written;"
    " echo 'gitdir: /tmp' > wt/.git && echo worktree-written;"
    " echo '[tools]' > loopd.toml && echo config-made; echo end"
)


def test_git_code_in_the_workspace_stays_what_it_was(tmp_path: Path) -> None:
    """A hook or a core.fsmonitor a command left in a repository of the workspace would run
    the next time the person uses git, outside any sandbox; so would one in a .git a command
    moved aside and rebuilt, a submodule's .git/modules/NAME/config, or a pointer file
    redirected. The top .git as a whole, the submodules' and nested repositories' .git and
    a worktree's pointer are read-only and cannot be moved; a loopd.toml made at the top is
    removed after the command (it could allow every call of the next loopd)."""
    with _shell_host() as h:
        ws = h.workspace
        src = h.workspace.parent / "src"
        src.mkdir()
        _git("init", "-q", str(src), cwd=src)
        _git("commit", "-q", "--allow-empty", "-m", "sub", cwd=src)
        _git("init", "-q", str(ws), cwd=ws)
        _git("submodule", "-q", "add", str(src), "sub", cwd=ws)
        _git("commit", "-q", "-m", "top", cwd=ws)
        _git("worktree", "add", "-q", "wt", cwd=ws)
        _git("init", "-q", "nested", cwd=ws)
        _git("init", "-q", "org/deep", cwd=ws)
        before = {name: _snapshot(ws / name)
                  for name in (".git", "sub/.git", "nested/.git", "org/deep/.git")}
        pointers = {name: (ws / name).read_text() for name in ("sub/.git", "wt/.git")}
        status = _git("status", "--porcelain", cwd=ws)
        text = _output(_run(h.endpoint, _GIT_ATTACKS))
        for done in ("moved", "removed", "config-written", "hook-written", "other-written",
                     "committed", "module-written", "modules-moved", "pointer-written",
                     "pointer-moved", "nested-written", "nested-moved", "deep-written",
                     "worktree-written"):
            assert f"\n{done}\n" not in text, text
        assert "config-made" in text  # it could be made, and is gone after the command
        assert "[sandbox: the command made loopd.toml at the top of the workspace; it was " \
            "removed]" in text
        assert not (ws / "loopd.toml").exists()
        after = {name: _snapshot(ws / name) for name in before}
        assert after == before
        assert {name: (ws / name).read_text() for name in pointers} == pointers
        assert not (ws / ".git-old").exists()
        assert _git("status", "--porcelain", cwd=ws) == status
        assert not Path("/tmp/pwned").exists()


def test_a_loopd_toml_at_the_top_is_read_only(tmp_path: Path) -> None:
    with _shell_host() as h:
        (h.workspace / "loopd.toml").write_text("[tools]\n")
        text = _output(_run(h.endpoint, "echo 'allow = [\"run_command\"]' >> loopd.toml "
                                        "|| echo loopd-ro; mv loopd.toml x || echo kept"))
        assert "loopd-ro" in text and "kept" in text
        assert (h.workspace / "loopd.toml").read_text() == "[tools]\n"
        assert "[sandbox:" not in text


def test_loopd_places_are_hidden_wherever_they_are(host: Host) -> None:
    """The hidden places a host is given (loopd's runtime directory, logs, keys): not under
    /tmp here, so only the hiding keeps them out."""
    place = Path(tempfile.mkdtemp(prefix="loopd-test-", dir="/var/tmp"))
    key = place.parent / f"{place.name}.key_secret"
    try:
        (place / "loopd.sock").write_text("")
        (place / "log.bin").write_text("secret conversation")
        key.write_text("secret key")
        with _shell_host("--hide", str(place), str(key)) as h:
            text = _output(_run(h.endpoint, f"ls -A {place}; echo listed; cat {key}; echo end"))
            assert text.startswith("exit code: 0\nlisted\n")  # an empty directory
            assert "secret key" not in text  # a hidden file cannot be read (nor written)
            denied = _output(_run(h.endpoint, f"touch {place}/x || echo refused"))
            assert "refused" in denied and not (place / "x").exists()
    finally:
        shutil.rmtree(place)
        key.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def bounded() -> Iterator[Host]:
    """A host with small bounds, so each is reached at once."""
    with _shell_host("--tmpfs-mb", "8", "--memory-mb", "64", "--processes", "24",
                     "--file-mb", "4", "--cpu-s", "1") as h:
        yield h


def test_the_private_tmp_is_bounded(bounded: Host) -> None:
    text = _output(_run(bounded.endpoint, "for i in 1 2 3 4; do head -c 3000000 /dev/zero "
                        "> /tmp/f$i || exit 1; done; echo filled"))
    assert "filled" not in text
    assert "No space left on device" in text
    assert "[sandbox bound: /tmp, /run and /dev/shm hold 8 MiB each (tools.shell.tmpfs_mb)" in text
    df = _output(_run(bounded.endpoint, "df -k /tmp /run /dev/shm | tail -n 3"))
    assert [line.split()[1] for line in df.splitlines()[1:]] == ["8192"] * 3


_WHOLE = ("[sandbox bound: the command's processes together may use 64 MiB of memory "
          "(tools.shell.memory_mb); the kernel killed one at that bound]")
_PER_PROCESS = "[sandbox bound: each process may use 64 MiB of address space"
# Outside RLIMIT_DATA: a shared anonymous map, memfds each under tools.shell.file_mb (4 MiB
# here), and several processes each under the bound; 200 MiB in all, touched page by page.
_MMAP = "import mmap; m = mmap.mmap(-1, 200 << 20)\nfor i in range(0, 200 << 20, 4096): m[i] = 1"
_MEMFD = ("import os\nfds = [os.memfd_create('x') for _ in range(60)]\n"
          "for fd in fds: os.write(fd, bytes(3 << 20))")
_MANY = "import time; b = bytearray(50 << 20); b[::4096] = bytes(len(b[::4096])); time.sleep(5)"


def _memory_cgroup() -> str:
    """"" when the sandbox's memory cgroup can be made here; else why not."""
    from actors.tools.providers.pidgroup import why_not

    return why_not("memory")


def test_memory_is_bounded(bounded: Host) -> None:
    python = os.path.realpath(sys.executable)
    text = _output(_run(bounded.endpoint, f"{python} -c 'b = bytearray(200 << 20)'"))
    assert "MemoryError" in text
    assert "(tools.shell.memory_mb" in text and "[sandbox bound: " in text


@pytest.mark.parametrize("attack", ["mmap", "memfd", "many"])
def test_memory_is_bounded_as_a_whole(bounded: Host, attack: str) -> None:
    """A shared anonymous mmap, memfds and several processes, 200 MiB each way under a
    64 MiB bound: stopped, and the result names the bound. Where no memory cgroup can be
    made the address-space limit stops the map; the others are not bounded there
    (docs/sandbox.md says so)."""
    why = _memory_cgroup()
    if why and attack != "mmap":
        pytest.skip(f"no memory cgroup here ({why}): only each process is bounded")
    python = os.path.realpath(sys.executable)
    script = {"mmap": _MMAP, "memfd": _MEMFD, "many": _MANY}[attack]
    (bounded.workspace / "eat.py").write_text(script)
    command = f"{python} eat.py && echo survived"
    if attack == "many":
        command = f"for i in 1 2 3 4; do {python} eat.py & done; wait; exit 1"
    text = _output(_run(bounded.endpoint, command))
    if attack == "many":  # the shell goes on after its children: some were killed
        assert text.startswith("exit code: 1\n"), text
    else:
        assert "survived" not in text, text
    assert (_PER_PROCESS if why else _WHOLE) in text, text


_SPAWN = """
import pathlib, subprocess, time
started = []
for _ in range(100):
    try:
        started.append(subprocess.Popen(["sleep", "4245.5"]))
    except OSError:
        pass
pathlib.Path("started").write_text(str(len(started)))
time.sleep(60)
"""


def test_processes_are_bounded(bounded: Host) -> None:
    """100 sleeps asked for: no more than the bound are ever alive (counted from outside
    while the command waits), and a fork bomb ends with the bound named."""
    (bounded.workspace / "spawn.py").write_text(_SPAWN)
    command = f"{os.path.realpath(sys.executable)} spawn.py"
    try:
        with raw_dealer(bounded.endpoint) as sock:
            sock.send(wire.encode(wire.ToolRequest(1, "s", 1, "run_command",
                                                   {"command": command})))
            wait_until(lambda: (bounded.workspace / "started").exists(),
                       what="the command to start what it could")
            alive = len(living(["sleep", "4245.5"]))
            started = int((bounded.workspace / "started").read_text())
            assert 10 <= alive == started <= 22  # the sandbox's init, sh and python count too
            sock.send(wire.encode(wire.Cancel(1)))
        wait_until(lambda: not living(["sleep", "4245.5"]), what="the sleeps to be gone")
        many = _output(_run(bounded.endpoint, "for i in $(seq 1 50); do sleep 4245.5 & done"))
        assert many.startswith("exit code: 2\n")  # sh gives up at the first fork refused
        assert "[sandbox bound: the command may run 24 processes and threads at once" in many
    finally:
        for p in living(["sleep", "4245.5"]):
            p.kill()


def test_file_size_is_bounded(bounded: Host) -> None:
    text = _output(_run(bounded.endpoint, "head -c 10000000 /dev/zero > big"))
    assert "[sandbox bound: a process wrote a file past 4 MiB (tools.shell.file_mb)" in text
    assert (bounded.workspace / "big").stat().st_size == 4 * 1024 * 1024


def test_cpu_time_is_bounded(bounded: Host) -> None:
    text = _output(_run(bounded.endpoint, "while :; do :; done"))  # the host's limit is 20 s
    assert text.startswith("exit code: 152\n")  # SIGXCPU, long before the time limit
    assert "[sandbox bound: a process used up its CPU time, 1 s (tools.shell.cpu_s)" in text


_REACH = """
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print("CONNECTED", path)
    except OSError as e:
        print("unreachable:", e.strerror)
"""


def test_no_loopd_socket_is_reachable_from_a_daemons_command() -> None:
    """The attack, with a real daemon and a real client: the daemon's runtime directory
    configured outside /tmp (daemon.runtime_dir), its log directory too; a turn's command
    lists them and connects to the daemon's socket. It sees empty directories, reaches no
    socket, and the daemon goes on serving its client."""
    from tests.daemon.daemonkit import Daemon, daemon_config
    from tests.support.fake_llama import FakeLlama
    from tests.support.scripted_llama import agent

    root = Path(tempfile.mkdtemp(prefix="lt-", dir="/var/tmp"))
    try:
        run_dir, sessions = root / "run", root / "sessions"
        with FakeLlama(agent()) as fake:
            config = daemon_config(root, run_dir, fake.url)
            python = os.path.realpath(sys.executable)
            (root / "ws" / "reach.py").write_text(_REACH)
            command = (f"ls -A {run_dir} {sessions}; {python} reach.py {run_dir}/loopd.sock "
                       f"{run_dir}/loopd.pid; echo end")
            order = f"t1 :: run_command {json.dumps({'command': command})}"
            with Daemon(config) as daemon, daemon.client() as client:
                assert (run_dir / "loopd.sock").exists()
                client.turn("s", order).run(lambda e: None)
                assert (sessions / "s" / "log.bin").exists()  # there to be seen, and was not
                records = client.read_log("s")
                result = next(r for r in records if isinstance(r, ToolResult))
                assert "CONNECTED" not in result.content, result.content
                assert result.content.count("unreachable:") == 2
                assert "loopd.sock" not in result.content.split("unreachable")[0]
                assert "log.bin" not in result.content
                assert client.status().pid == daemon.pid  # still serving
    finally:
        shutil.rmtree(root, ignore_errors=True)
