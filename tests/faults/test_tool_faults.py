"""Tool faults at the turn level: each ends as a Failed result in the log, and the turn goes on.

Real tool host processes (a Toolbox with one local ``shell`` host, or a garbage-speaking
host behind a real tool port), the fake llama-server playing an agent that calls the tool
and then answers, a real session log. Each test checks the record sequence of the whole
turn, the result text the model reads, the log on disk, and that the next turn works.

Covered in tests/tools and not repeated here: the port-level answer to a host killed mid-call
and its restart (test_supervisor), a silent host at the port (test_port), a garbage frame
at the port and at the host (test_port, test_host), a command's tree killed at its timeout
(test_standard, two processes). What is new here: each of those as a turn sees it, a host
frozen with SIGSTOP, output of gigabytes with the host's memory measured, and a tree of
hundreds of processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from actors.base.cancel import CancelToken
from actors.base.config import Config, HostConfig
from actors.base.errors import Cancelled
from actors.log.records import ToolResult
from actors.session.turn import run_turn
from actors.tools.port import PORT_GRACE_S, HostLauncher, PortSettings, ToolPort, start_port
from actors.tools.registry import Registry
from actors.tools.toolbox import Toolbox
from tests.support.fake_llama import FakeLlama
from tests.support.fault_rig import MakeRig, TurnRig
from tests.support.scripted_llama import agent
from tests.support.watch import Background, Peak, living, wait_until
from tests.tools.hostkit import short_dir

ROOT = Path(__file__).resolve().parents[2]
FULL_TURN = ["User", "Assistant", "Usage", "ToolResult", "Assistant", "Usage"]
MiB = 1024 * 1024


@pytest.fixture
def fake() -> Iterator[FakeLlama]:
    with FakeLlama(agent()) as server:
        yield server


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Toolbox]:
    """A Toolbox with one local host, ``shell`` (run_command, echo); closed after the test."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    # A heartbeat of 1 s gives a frozen host up after 3 s, and a busy machine room to starve
    # a healthy one for less; the call limit is a hang guard (3 GiB through a pipe on a
    # loaded machine took over 30 s).
    config = Config().replace(
        "tools", standard=False, workspace=str(workspace), allow=("run_command",),
        heartbeat_s=1.0, timeout_s=600.0, hosts=(HostConfig(name="shell", tools=("run_command",
                                                                                   "echo")),),
    )  # fmt: skip
    box = Toolbox.start(config)
    try:
        assert box.problems == {}
        yield box
    finally:
        box.close()


def _commands_allowed(rig: TurnRig) -> TurnRig:
    """The turn's own tools.allow lets run_command run (the session's gate decides: the
    host is given no --allow)."""
    config = rig.config.replace("tools", allow=("run_command",))
    rig.runtime = dataclasses.replace(rig.runtime, config=config)
    return rig


def _host(box: Toolbox) -> psutil.Process:
    pid = box.status()["shell"].pid
    assert pid is not None
    return psutil.Process(pid)


def _result(rig: TurnRig, index: int = 4) -> ToolResult:
    record = rig.records[index]
    assert isinstance(record, ToolResult), f"record {index} is a {type(record).__name__}"
    return record


def _next_turn_works(rig: TurnRig, box: Toolbox) -> None:
    wait_until(lambda: box.ports[0].wait_ready(0.01), what="the host to be ready again")
    before = len(rig.records)
    outcome = rig.turn('again :: echo {"text": "back"}')
    assert outcome.content == "done again."
    assert rig.kinds(before) == FULL_TURN
    assert _result(rig, before + 3).content == "back"
    assert rig.on_disk() == rig.records


def test_a_host_killed_mid_call(shell: Toolbox, fake: FakeLlama, turn_rig: MakeRig) -> None:
    rig = _commands_allowed(turn_rig(fake.url, registry=shell.registry))
    host = _host(shell)
    turn = Background(lambda: rig.turn('kill :: run_command {"command": "sleep 41.1"}'))
    wait_until(lambda: bool(living(["sleep", "41.1"])), what="the command to start")
    command = living(["sleep", "41.1"])[0]
    host.kill()
    outcome = turn.join()
    assert outcome.content == "done kill."
    assert rig.kinds() == FULL_TURN
    assert _result(rig).content.startswith(
        "The tool failed: tool host shell exited (killed by SIGKILL) during the call"
    )
    assert rig.on_disk() == rig.records
    wait_until(lambda: not command.is_running() or command.status() == psutil.STATUS_ZOMBIE,
               what="the killed host's command to be killed")  # fmt: skip
    wait_until(lambda: shell.status()["shell"].restarts == 1, what="the restart")
    _next_turn_works(rig, shell)


def test_a_host_frozen_mid_call(shell: Toolbox, fake: FakeLlama, turn_rig: MakeRig) -> None:
    rig = _commands_allowed(turn_rig(fake.url, registry=shell.registry))
    host = _host(shell)
    # the command outlasts any delay before the freeze: its answer never comes from this host
    turn = Background(lambda: rig.turn('hung :: run_command {"command": "sleep 21.3; echo late"}'))
    wait_until(lambda: bool(living(["sleep", "21.3"])), what="the command to start")
    host.suspend()  # SIGSTOP: alive, holding its socket, answering nothing
    try:
        outcome = turn.join()
    finally:
        with contextlib.suppress(psutil.Error):
            host.resume()
    assert outcome.content == "done hung."
    assert rig.kinds() == FULL_TURN
    text = _result(rig).content
    assert re.match(
        r"The tool failed: tool host shell stopped answering \(nothing for [\d.]+ s\) during "
        r"the call; it may or may not have run", text
    ), text
    # Silent is as good as dead: the supervisor kills the frozen host and starts another.
    wait_until(lambda: shell.status()["shell"].restarts == 1, what="the restart")
    assert shell.status()["shell"].pid != host.pid
    _next_turn_works(rig, shell)


JUNK_TIMEOUT_S = 2.0


@pytest.fixture
def junk() -> Iterator[ToolPort]:
    """A real tool port to :mod:`tests.support.garbage_host` in its own process."""
    with short_dir() as d:
        endpoint = f"ipc://{d}/junk.sock"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        launcher = HostLauncher(
            (sys.executable, "-m", "tests.support.garbage_host", "--bind", endpoint,
             "--parent-pid", str(os.getpid())), env=env,
        )  # fmt: skip
        # The call limit is the stimulus for the answers that never come; it must also let a
        # malformed answer arrive first on a busy machine. A 1 s heartbeat lets a busy host be.
        settings = PortSettings(name="junk", endpoint=endpoint, timeout_s=JUNK_TIMEOUT_S,
                                heartbeat_s=1.0)
        port = start_port(settings, launcher=launcher)
        try:
            assert port.wait_ready(30), "the garbage host did not come up"
            yield port
        finally:
            port.stop()


def test_a_host_answering_garbage(junk: ToolPort, fake: FakeLlama, turn_rig: MakeRig) -> None:
    rig = turn_rig(fake.url, registry=Registry([junk]))
    modes = ["bytes", "map", "wrong_id", "silent", "huge"]
    steps = " ".join(f':: garbage {{"mode": "{m}"}}' for m in modes)
    outcome = rig.turn(f"junk {steps}")
    assert outcome.content == "done junk."
    assert rig.kinds() == ["User"] + ["Assistant", "Usage", "ToolResult"] * 5 + [
        "Assistant", "Usage"
    ]  # fmt: skip
    texts = dict(zip(modes, [r.content for r in rig.records if isinstance(r, ToolResult)],
                     strict=True))  # fmt: skip
    no_answer = ("The tool failed: tool host junk did not answer garbage within "
                 f"{JUNK_TIMEOUT_S + PORT_GRACE_S:g} s")
    assert texts["bytes"] == no_answer  # no id could be read: the call runs out its time
    assert texts["map"].startswith("The tool failed: tool host junk sent a malformed answer: ")
    assert texts["wrong_id"] == no_answer
    assert texts["silent"] == no_answer
    # libzmq drops the frame and the connection: whichever comes first, the call's time
    # running out or the heartbeat missing (then the host is killed and restarted).
    assert re.match(r"The tool failed: tool host junk (did not answer|stopped answering)",
                    texts["huge"]), texts["huge"]  # fmt: skip
    assert rig.on_disk() == rig.records
    wait_until(lambda: junk.wait_ready(0.01), timeout=30, what="the port to be ready again")
    again = rig.turn('again :: garbage {"mode": "map"}')
    assert again.content == "done again."


@pytest.mark.timeout(900)  # 3 GiB through a pipe: seconds alone, minutes on a loaded machine
def test_a_command_printing_gigabytes_is_capped_at_the_host_in_bounded_memory(
    shell: Toolbox, fake: FakeLlama, turn_rig: MakeRig
) -> None:
    rig = _commands_allowed(turn_rig(fake.url, registry=shell.registry))
    host = _host(shell)
    before = host.memory_info().rss
    peak = Peak(lambda: host.memory_info().rss)
    try:
        outcome = rig.turn('flood :: run_command {"command": "yes | head -c 3G"}')
    finally:
        top = peak.stop()
    assert outcome.content == "done flood."
    assert rig.kinds() == FULL_TURN
    result = _result(rig)
    assert result.content.startswith("exit code: 0\ny\ny\ny\n")
    # The host kept max_output_bytes (1 MiB) of the 3 GiB; the turn cut that to its own cap.
    cut = re.search(r"\[loopd: result cut to (\d+) of (\d+) characters\]$", result.content)
    assert cut is not None and result.truncated
    assert MiB < int(cut.group(2)) < MiB + 200
    assert top - before < 64 * MiB, f"host RSS grew by {(top - before) / MiB:.0f} MiB"
    assert peak.samples > 10  # it was watched while the command ran
    print(f"\n3 GiB of output: host RSS {before / MiB:.0f} MiB before, peak {top / MiB:.0f} MiB")
    _next_turn_works(rig, shell)


FORK = "f() { if [ $1 -gt 0 ]; then f $(($1-1)) & f $(($1-1)) & fi; exec sleep 44.4; }; f 7"


def test_a_tree_of_hundreds_of_processes_is_killed_whole(
    shell: Toolbox, fake: FakeLlama, turn_rig: MakeRig
) -> None:
    """The call is given up (here: cancelled) once the tree has grown, whenever that is on
    this machine; every process of it then goes. (The timeout's own kill of a tree is in
    tests/tools/providers/test_command.py.)"""
    rig = _commands_allowed(turn_rig(fake.url, registry=shell.registry))
    cancel = CancelToken()
    message = f'bomb :: run_command {{"command": "{FORK}"}}'
    turn = Background(lambda: run_turn(rig.log, rig.runtime, message, rig.events.append, cancel))
    wait_until(lambda: len(living(["sleep", "44.4"])) >= 200, what="the tree to grow")
    grown = len(living(["sleep", "44.4"]))
    cancel.cancel()
    with pytest.raises(Cancelled):
        turn.join()
    wait_until(lambda: not living(["sleep", "44.4"]), what="every process of the tree to go")
    print(f"\nprocess tree: {grown} of 255 running at once, all killed")
    assert rig.on_disk() == rig.records  # the log stays whole
    _next_turn_works(rig, shell)
