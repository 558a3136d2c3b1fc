"""The Toolbox: real host processes started, restarted after SIGKILL, and never left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from actors.base.config import Config, HostConfig, ShellConfig
from actors.base.errors import ConfigError
from actors.base.processes.trees import is_alive
from actors.tools.port import PortState, ToolPort
from actors.tools.protocol import wire
from actors.tools.registry import Remote, dispatch
from actors.tools.toolbox import Toolbox, host_argv
from actors.wire.curve import write_keypair
from tests.support.watch import HANG_S
from tests.tools.hostkit import ROOT, host_env, host_processes, short_dir, wait_until
from tests.tools.mcp_support import closed_port_url, refusing

Make = Callable[..., Toolbox]


@pytest.fixture
def workspace() -> Iterator[Path]:
    with short_dir() as d:
        (d / "notes.txt").write_text("hello from the workspace\n")
        yield d


@pytest.fixture
def make(workspace: Path) -> Iterator[Make]:
    """Starts toolboxes on ``workspace``; closes them all, then checks no host is left."""
    boxes: list[Toolbox] = []

    def start(**tools: Any) -> Toolbox:
        # hang guards: hosts start in well under a second alone, in seconds on a busy machine
        settings = {"workspace": str(workspace), "heartbeat_s": 1.0, "timeout_s": 30.0,
                    "start_timeout_s": HANG_S, **tools}  # fmt: skip
        box = Toolbox.start(Config().replace("tools", **settings))
        boxes.append(box)
        return box

    try:
        yield start
    finally:
        for box in boxes:
            box.close()
    assert host_processes() == []


def _run(box: Toolbox, tool: str, **arguments: Any) -> wire.Answer:
    entry = box.registry.entry(tool)
    assert entry is not None, f"no host offers {tool}"
    # approved: the session's gate decides (tools.allow is not handed to the hosts)
    return entry[1].call(session="s", call=1, tool=tool, arguments=arguments, approved=True)


def _sleeps(marker: str) -> list[psutil.Process]:
    """Living ``sleep MARKER`` processes, wherever they are in the process tree."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if (p.info["cmdline"] or [])[:2] == ["sleep", marker] and is_alive(p):
            found.append(p)
    return found


def test_the_standard_hosts_start_and_answer(make: Make) -> None:
    box = make()
    assert box.problems == {}
    status = box.status()
    assert sorted(status) == ["files", "shell", "web"]
    assert all(s.state is PortState.READY and s.pid for s in status.values())
    assert len({s.pid for s in status.values()}) == 3  # each host its own process
    assert {s.name for s in box.registry.specs()} == {
        "read_file", "list_dir", "search_files", "write_file", "outline_file", "find_definition",
        "run_command", "fetch_url",
    }  # fmt: skip
    answer = _run(box, "read_file", path="notes.txt")
    assert answer == wire.Result(answer.id, "hello from the workspace\n")


def _port(box: Toolbox, name: str) -> ToolPort:
    (port,) = [p for p in box.ports if p.name == name]
    return port


def test_a_host_killed_mid_call_fails_the_call_and_is_restarted(make: Make) -> None:
    box = make()
    shell = _port(box, "shell")
    old_pid = shell.status().pid
    assert old_pid is not None
    result: list[wire.Answer] = []
    call = threading.Thread(
        target=lambda: result.append(_run(box, "run_command", command="sleep 31.1"))
    )
    call.start()
    try:
        wait_until(lambda: bool(_sleeps("31.1")), what="the command to start")
        orphan = _sleeps("31.1")[0]
        os.kill(old_pid, signal.SIGKILL)
    finally:
        call.join(60)
    [answer] = result  # well before the 30 s timeout: the exit itself fails the call
    assert isinstance(answer, wire.Failed)
    assert "tool host shell exited (killed by SIGKILL) during the call" in answer.message
    wait_until(lambda: not is_alive(orphan), what="the killed host's command to be killed")
    wait_until(lambda: shell.status().restarts == 1 and shell.wait_ready(0.01), what="the restart")
    assert shell.status().pid not in (None, old_pid)
    again = _run(box, "run_command", command="echo back")
    assert again == wire.Result(again.id, "exit code: 0\nback\n")


def test_a_host_that_stops_answering_is_killed_and_restarted(make: Make) -> None:
    box = make()
    files = _port(box, "files")
    pid = files.status().pid
    assert pid is not None
    old = psutil.Process(pid)
    old.suspend()  # SIGSTOP: alive, but silent
    try:
        wait_until(
            lambda: files.status().restarts == 1 and files.wait_ready(0.01), what="the restart"
        )
    finally:
        if is_alive(old):
            old.kill()
    assert not is_alive(old)
    answer = _run(box, "read_file", path="notes.txt")
    assert answer == wire.Result(answer.id, "hello from the workspace\n")


def test_close_stops_every_host_and_what_its_tools_started(make: Make) -> None:
    box = make()
    hosts = host_processes()
    assert len(hosts) == 3
    result: list[wire.Answer] = []
    call = threading.Thread(
        target=lambda: result.append(_run(box, "run_command", command="sleep 32.2"))
    )
    call.start()
    try:
        wait_until(lambda: bool(_sleeps("32.2")), what="the command to start")
        command = _sleeps("32.2")[0]
        box.close()
    finally:
        call.join(60)
    assert isinstance(result[0], wire.Failed)
    assert host_processes() == []
    assert not is_alive(command)
    assert all(not is_alive(h) for h in hosts)


_DAEMON = """
import json, sys, time
from actors.base.config import Config
from actors.tools.registry import Remote, dispatch
from actors.tools.toolbox import Toolbox, host_argv
box = Toolbox.start(Config().replace("tools", workspace=sys.argv[1]))
print(json.dumps([s.pid for s in box.status().values()]), flush=True)
time.sleep(300)
"""


def test_no_host_outlives_a_daemon_killed_with_sigkill(workspace: Path) -> None:
    daemon = subprocess.Popen(
        [sys.executable, "-c", _DAEMON, str(workspace)], cwd=ROOT, env=host_env(),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    hosts: list[psutil.Process] = []
    try:
        assert daemon.stdout is not None
        hosts = [psutil.Process(pid) for pid in json.loads(daemon.stdout.readline())]
        assert len(hosts) == 3
        daemon.kill()
        daemon.wait(30)
        _, alive = psutil.wait_procs(hosts, timeout=20)  # each notices within ~0.25 s
        assert [p for p in alive if is_alive(p)] == []
    finally:
        daemon.kill()
        daemon.wait(30)
        for p in hosts:
            if is_alive(p):
                p.kill()


def test_a_workspace_that_is_not_a_directory_is_refused(workspace: Path) -> None:
    config = Config().replace("tools", workspace=str(workspace / "missing"))
    with pytest.raises(ConfigError, match=r"tools.workspace = .*missing.* is not a directory"):
        Toolbox.start(config)


def test_hosts_that_do_not_come_up_are_reported_not_waited_for(make: Make, workspace: Path) -> None:
    public, secret = write_keypair(workspace / "keys", "me")
    hosts = (
        HostConfig(name="far", kind="remote", endpoint="tcp://127.0.0.1:9", server_key=str(public),
                   client_key=str(secret)),
        HostConfig(name="keyless", kind="remote", endpoint="tcp://127.0.0.1:9",
                   server_key=str(public)),
    )  # fmt: skip
    # "far" never answers: start-up waits all of its start_timeout_s, so a short one
    box = make(standard=False, hosts=hosts, start_timeout_s=0.5)
    assert sorted(box.problems) == ["far", "keyless"]
    assert "no tool list within 0.5 s (tools.start_timeout_s)" in box.problems["far"]
    assert "is our public key in its --allow-keys directory?" in box.problems["far"]
    assert "a remote host needs client_key" in box.problems["keyless"]
    assert box.registry.specs() == []
    # "broken" exits with its usage-error code: start-up stops waiting for it then, well
    # inside the hang guard, with why from its log
    broken = make(standard=False, hosts=(HostConfig(name="broken", tools=("frobnicate",)),))
    assert sorted(broken.problems) == ["broken"]
    assert "unknown standard tool(s) frobnicate" in broken.problems["broken"]
    assert broken.registry.specs() == []


def test_a_configured_local_host_runs_the_tools_it_names(make: Make) -> None:
    box = make(standard=False, hosts=(HostConfig(name="mine", tools=("list_dir", "echo")),))
    assert [p.name for p in box.ports] == ["mine"]
    assert "notes.txt" in str(_run(box, "list_dir", path="."))


def test_a_host_named_like_a_standard_one_is_refused(workspace: Path) -> None:
    config = Config().replace(
        "tools", workspace=str(workspace), hosts=(HostConfig(name="shell", tools=("echo",)),)
    )
    with pytest.raises(ConfigError, match="shell is the name of a standard host"):
        Toolbox.start(config)


def test_an_mcp_host_runs_an_mcp_server_behind_a_tool_host(make: Make) -> None:
    pytest.importorskip("mcp")
    server = (sys.executable, str(ROOT / "tests" / "tools" / "mcp_test_server.py"))
    box = make(standard=False, hosts=(HostConfig(name="m", kind="mcp", command=server),))
    assert box.problems == {}
    answer = _run(box, "echo", text="through MCP")
    assert answer == wire.Result(answer.id, "through MCP")


@pytest.mark.parametrize("fault", ["401", "closed port"])
def test_an_mcp_server_that_fails_at_once_fails_start_up_at_once(make: Make, fault: str) -> None:
    pytest.importorskip("mcp")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(refusing(401)) if fault == "401" else closed_port_url()
        # start_timeout_s is HANG_S: a start-up that waited for it would say so
        box = make(standard=False, hosts=(HostConfig(name="m", kind="mcp", url=url),))
    problem = box.problems["m"]
    assert "tools.start_timeout_s" not in problem
    assert problem.startswith("its tool host exited (exit code 2) at start and is not started")
    said = "answered HTTP 401" if fault == "401" else "is it running, and is url in"
    assert said in problem  # the host's own words, from its log


def test_a_tool_name_two_hosts_offer_is_qualified_by_host_and_the_person_told(
    make: Make,
) -> None:
    box = make(hosts=(HostConfig(name="more", tools=("read_file", "echo")),))
    assert box.problems == {}
    assert box.warnings == [
        "tool read_file of host more is offered as more__read_file: host files also has a "
        "tool named read_file and keeps that name"
    ]
    names = [s.name for s in box.registry.specs()]
    assert names.count("read_file") == 1 and "more__read_file" in names
    assert box.registry.entry("read_file")[1].name == "files"  # type: ignore[index]
    spec, port = box.registry.entry("more__read_file")  # type: ignore[misc]
    assert (spec.name, port.name) == ("more__read_file", "more")
    target = dispatch(box.registry, "call_tool",
                      '{"name": "more__read_file", "arguments": {"path": "notes.txt"}}')
    assert isinstance(target, Remote) and (target.port.name, target.tool) == ("more", "read_file")


def test_the_shell_settings_reach_the_host_that_runs_run_command(workspace: Path) -> None:
    shell = ShellConfig("none", True, ("PATH", "LC_*"), tmpfs_mb=8, memory_mb=64, processes=24,
                        file_mb=4, cpu_s=1.5)
    tools = Config().replace("tools", shell=shell).tools
    argv = host_argv("shell", "ipc:///x", tools, workspace, standard=("run_command",),
                     hide=("/run/loopd", "/home/me/.local/share/loopd"))
    at = argv.index("--sandbox")
    assert argv[at : at + 16] == (
        "--sandbox", "none", "--env", "PATH", "LC_*", "--tmpfs-mb", "8", "--memory-mb", "64",
        "--processes", "24", "--file-mb", "4", "--cpu-s", "1.5", "--network")  # fmt: skip
    at = argv.index("--hide")
    assert argv[at : at + 3] == ("--hide", "/run/loopd", "/home/me/.local/share/loopd")
    files = host_argv("files", "ipc:///y", tools, workspace, standard=("read_file",),
                      hide=("/run/loopd",))
    assert "--sandbox" not in files and "--hide" in files  # the file tools refuse them too


def test_hosts_are_given_no_allow_whatever_tools_allow_says(workspace: Path) -> None:
    """Every call that needs approval comes back to the session's gate, which asks for a
    protected write (and what a deny rule cannot check) whatever allows the tool; a host
    given --allow would run those unasked."""
    tools = Config().replace("tools", allow=("write_file", "run_command")).tools
    argv = host_argv("files", "ipc:///y", tools, workspace,
                     standard=("write_file", "run_command"))
    assert "--allow" not in argv



def test_run_command_without_a_sandbox_is_warned_at_start(make: Make) -> None:
    box = make(
        standard=False,
        hosts=(HostConfig(name="sh", tools=("run_command",)),),
        shell=ShellConfig(sandbox="none"),
    )
    assert len(box.warnings) == 1
    assert 'run_command runs commands without a sandbox (tools.shell.sandbox = "none")' in (
        box.warnings[0]
    )
    files_only = make(standard=False, hosts=(HostConfig(name="f", tools=("read_file",)),))
    assert files_only.warnings == []


def test_a_missing_bwrap_is_said_at_start(make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    with short_dir() as empty:
        monkeypatch.setenv("PATH", str(empty))
        box = make(standard=False, hosts=(HostConfig(name="sh", tools=("run_command",)),))
    assert len(box.warnings) == 1
    assert "bwrap is not on the PATH" in box.warnings[0]
    assert "apt-get install bubblewrap" in box.warnings[0]

