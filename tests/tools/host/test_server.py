"""A real tool host process, spoken to over a real ipc:// socket."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq

from actors.tools.port import PortSettings, Questions, ToolPort, start_port
from actors.tools.protocol import wire
from tests.support.watch import HANG_S
from tests.tools.hostkit import (
    FAKE,
    ROOT,
    ask,
    host_env,
    raw_dealer,
    recv,
    short_dir,
    spawn_host,
)


def _req(id: int, tool: str, **arguments: Any) -> wire.ToolRequest:
    return wire.ToolRequest(id, "s", id, tool, arguments)


@contextlib.contextmanager
def _fake_host(timeout: str) -> Iterator[tuple[str, Path]]:
    with short_dir() as d:
        endpoint = f"ipc://{d}/h.sock"
        args = ("--provider", FAKE, "--timeout", timeout, "--max-calls", "2",
                "--max-frame-bytes", "65536")  # fmt: skip
        with spawn_host(endpoint, *args, log=d / "host.log"):
            with raw_dealer(endpoint) as sock:
                assert isinstance(ask(sock, wire.Hello()), wire.Tools)
            yield endpoint, d


@pytest.fixture(scope="module")
def host() -> Iterator[tuple[str, Path]]:
    """One fake-tools host for the module: (endpoint, scratch dir). 2 calls at once at most,
    and a call limit that is a hang guard: a call held open on purpose (a gate file) is still
    running when the test needs it to, however slowly this machine runs the test."""
    with _fake_host("60") as made:
        yield made


@pytest.fixture(scope="module")
def quick() -> Iterator[tuple[str, Path]]:
    """The same host with a call limit of 0.5 s, for the tests of that limit (their tool
    sleeps 1.5 s: the limit always passes first)."""
    with _fake_host("0.5") as made:
        yield made


def test_hello_answers_the_tool_list_and_ping_answers_pong(host: tuple[str, Path]) -> None:
    endpoint, _ = host
    with raw_dealer(endpoint) as sock:
        tools = ask(sock, wire.Hello())
        assert isinstance(tools, wire.Tools)
        assert "echo" in [t.name for t in tools.tools]
        assert ask(sock, wire.Ping()) == wire.Pong()


def test_a_call_round_trips(host: tuple[str, Path]) -> None:
    endpoint, _ = host
    with raw_dealer(endpoint) as sock:
        assert ask(sock, _req(5, "echo", text="hi")) == wire.Result(5, "hi")


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (_req(1, "nope"), "has no tool 'nope'"),
        (_req(2, "echo", text=3), "arguments of echo do not match its schema at text: 3 is not"),
        (_req(3, "echo"), "'text' is a required property"),
        (_req(4, "boom", message="kaput"), "boom failed: RuntimeError: kaput"),
        (_req(5, "not_an_answer"), "not_an_answer returned int, not an answer"),
    ],
)  # fmt: skip
def test_bad_calls_and_failing_tools_answer_failed(
    host: tuple[str, Path], request_: wire.ToolRequest, says: str
) -> None:
    endpoint, _ = host
    with raw_dealer(endpoint) as sock:
        answer = ask(sock, request_)
    assert isinstance(answer, wire.Failed)
    assert answer.id == request_.id
    assert says in answer.message


def test_garbage_and_oversized_frames_do_not_take_the_host_down(host: tuple[str, Path]) -> None:
    endpoint, _ = host
    with raw_dealer(endpoint) as sock:
        sock.send(b"\xc1\xc1 garbage")
        bad = recv(sock)
        assert isinstance(bad, wire.Failed)
        assert "could not read the message: not a msgpack message" in bad.message
        sock.send(msgpack.packb({"v": 1, "kind": "request", "id": 9, "tool": 1}))
        partial = recv(sock)
        assert isinstance(partial, wire.Failed)
        assert partial.id == 9
        sock.send_multipart([b"two", b"frames"])
        two = recv(sock)
        assert isinstance(two, wire.Failed)
        assert "one message must be one frame" in two.message
        sock.send(wire.encode(wire.Result(1, "from a client")))
        odd = recv(sock)
        assert isinstance(odd, wire.Failed)
        assert "does not take Result messages" in odd.message
        assert ask(sock, wire.Ping()) == wire.Pong()
    with raw_dealer(endpoint) as big:
        big.send(b"\x00" * 200_000)  # over MAXMSGSIZE: libzmq cuts this peer off
        assert recv(big, timeout=0.5) is None
    with raw_dealer(endpoint) as sock:
        assert ask(sock, _req(6, "echo", text="still here")) == wire.Result(6, "still here")


def test_a_slow_call_blocks_neither_pings_nor_other_calls(host: tuple[str, Path]) -> None:
    endpoint, d = host
    gate = d / "gate-slow"
    with raw_dealer(endpoint) as sock:
        sock.send(wire.encode(_req(1, "wait_for_file", path=str(gate))))
        assert ask(sock, wire.Ping()) == wire.Pong()
        assert ask(sock, _req(2, "echo", text="fast")) == wire.Result(2, "fast")
        gate.touch()
        assert recv(sock) == wire.Result(1, "file appeared")


def test_calls_over_the_cap_are_refused_not_queued(host: tuple[str, Path]) -> None:
    endpoint, d = host
    gate = d / "gate-cap"
    with raw_dealer(endpoint) as sock:
        sock.send(wire.encode(_req(1, "wait_for_file", path=str(gate))))
        sock.send(wire.encode(_req(2, "wait_for_file", path=str(gate))))
        third = ask(sock, _req(3, "echo", text="x"))
        assert isinstance(third, wire.Failed)
        assert "is busy: 2 calls are running" in third.message
        gate.touch()
        assert {recv(sock), recv(sock)} == {
            wire.Result(1, "file appeared"),
            wire.Result(2, "file appeared"),
        }


def test_a_hanging_tool_is_answered_failed_at_the_timeout(quick: tuple[str, Path]) -> None:
    endpoint, _ = quick
    with raw_dealer(endpoint) as sock:
        answer = ask(sock, _req(7, "hang", seconds=1.5))
        assert isinstance(answer, wire.Failed)
        assert "hang did not finish within 0.5 s" in answer.message
        assert ask(sock, wire.Ping()) == wire.Pong()


def test_a_cancel_stops_waiting_for_a_call(host: tuple[str, Path]) -> None:
    endpoint, d = host
    gate = d / "gate-cancel"
    with raw_dealer(endpoint) as sock:
        sock.send(wire.encode(_req(8, "wait_for_file", path=str(gate))))
        sock.send(wire.encode(wire.Cancel(8)))
        gate.touch()
        # the cancelled call's answer is never sent: the next frame is the ping's
        assert ask(sock, wire.Ping()) == wire.Pong()
        assert recv(sock, timeout=0.3) is None


def test_the_host_exits_when_its_parent_is_gone() -> None:
    with short_dir() as d:
        endpoint = f"ipc://{d}/h.sock"
        argv = ["-m", "actors.tools.host", "--bind", endpoint, "--provider", FAKE]
        code = (
            "import os, subprocess, sys; "
            f"p = subprocess.Popen([sys.executable, *{argv!r}, '--parent-pid', str(os.getpid())], "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid, flush=True)"
        )
        parent = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=host_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        host = psutil.Process(int(parent.stdout.split()[0]))
        try:
            host.wait(timeout=20)  # its parent exited at once: the host follows within ~0.25 s
        finally:
            if host.is_running():
                host.kill()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tools", "frobnicate"], "unknown standard tool(s) frobnicate"),
        ([], "no tools: give --tools NAMES"),
        (["--provider", "nope.nothing:x"], "--provider nope.nothing:x: cannot load it"),
        (["--tools", "echo", "--workspace", "/not/here"], "workspace /not/here is not a dir"),
        (["--tools", "echo", "--curve-secret", "x"], "--curve-secret and --allow-keys go together"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_with_the_reason(args: list[str], says: str) -> None:
    with short_dir() as d:
        run = subprocess.run(
            [sys.executable, "-m", "actors.tools.host", "--bind", f"ipc://{d}/x.sock", *args],
            cwd=ROOT, env=host_env(), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert run.returncode == 2
    assert says in run.stderr


def test_mcp_without_the_mcp_module_is_a_clear_error() -> None:
    code = (
        "import sys; sys.modules['actors.tools.providers.mcp'] = None; "
        "from actors.tools.host import main; sys.exit(main(sys.argv[1:]))"
    )
    with short_dir() as d:
        run = subprocess.run(
            [sys.executable, "-c", code, "--bind", f"ipc://{d}/x.sock", "--mcp", "server --flag"],
            cwd=ROOT, env=host_env(), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert run.returncode == 2
    assert "--mcp" in run.stderr
    assert "Traceback" not in run.stderr


# --- through the tool port -------------------------------------------------------------------


@contextlib.contextmanager
def _port(endpoint: str) -> Iterator[ToolPort]:
    # the port's own limit and heartbeats are hang guards: the host's answer decides
    handle = start_port(
        PortSettings("fake", endpoint, timeout_s=HANG_S, heartbeat_s=2.0),
        context=zmq.Context.instance(),
    )
    try:
        assert handle.wait_ready(HANG_S)
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def port(host: tuple[str, Path]) -> Iterator[ToolPort]:
    with _port(host[0]) as handle:
        yield handle


def test_the_port_gets_the_hosts_own_timeout_answer(quick: tuple[str, Path]) -> None:
    with _port(quick[0]) as port:
        answer = port.call(session="s", call=1, tool="hang", arguments={"seconds": 1.5})
    assert isinstance(answer, wire.Failed)
    assert "hang did not finish within 0.5 s (the tool host's limit" in answer.message


def test_the_port_round_trips_through_a_real_host(port: ToolPort) -> None:
    answer = port.call(session="s", call=1, tool="pid", arguments={})
    assert isinstance(answer, wire.Result)
    assert int(answer.content) != os.getpid()


# --- a question mid-call (wire: ask / reply) --------------------------------------------------


def test_a_question_mid_call_reaches_the_asker_and_its_answer_the_tool(port: ToolPort) -> None:
    seen: list[tuple[wire.Ask, float]] = []

    def person(question: wire.Ask, deadline: float) -> tuple[str, dict[str, Any]]:
        seen.append((question, deadline))
        return "accept", {"name": "Grace"}

    answer = port.call(session="s", call=1, tool="question", arguments={"message": "Whom?"},
                       ask=Questions(person, 30.0))
    assert answer == wire.Result(answer.id, 'accept {"name": "Grace"}')
    ((question, deadline),) = seen
    assert (question.server, question.message) == ("fake", "Whom?")
    assert question.schema["properties"]["name"]["default"] == "Ada"
    assert deadline - time.monotonic() <= 30.0
    declined = port.call(session="s", call=2, tool="question", arguments={"message": "Whom?"},
                         ask=Questions(lambda _q, _d: ("decline", {"name": "x"}), 30.0))
    assert isinstance(declined, wire.Result) and declined.content == "decline {}"


def test_without_an_asker_the_host_is_told_nobody_can_answer(port: ToolPort) -> None:
    answer = port.call(session="s", call=1, tool="question", arguments={"message": "Whom?"})
    assert isinstance(answer, wire.Result) and answer.content == "nobody to ask"


def test_a_question_nobody_answers_is_cancelled_by_the_host(host: tuple[str, Path]) -> None:
    """A port that never replies (gone, or an older one): the host stops waiting at the
    request's ask_s and the tool hears "cancel"."""
    endpoint, _ = host
    with raw_dealer(endpoint) as sock:
        request = wire.ToolRequest(9, "s", 1, "question", {"message": "Whom?"}, ask_s=0.2)
        question = ask(sock, request)
        assert isinstance(question, wire.Ask) and question.id == 9
        answer = recv(sock)
        assert isinstance(answer, wire.Result) and answer.content == "cancel {}"


# --- progress while a call runs (wire: progress) ----------------------------------------------


def test_progress_reaches_the_port_before_the_answer(port: ToolPort) -> None:
    seen: list[wire.Progress] = []
    answer = port.call(session="s", call=1, tool="steps", arguments={},
                       ask=Questions(None, 0.0, seen.append))
    assert isinstance(answer, wire.Result) and answer.content == "3 steps taken"
    assert [(p.id, p.done, p.total, p.message) for p in seen] == [
        (answer.id, 1.0, 0.0, "step 1"), (answer.id, 2.0, 3.0, "step 2"),
        (answer.id, 3.0, 3.0, "step 3")]


def test_a_request_that_wants_no_progress_gets_none(host: tuple[str, Path]) -> None:
    with raw_dealer(host[0]) as sock:
        assert ask(sock, _req(5, "steps")) == wire.Result(5, "3 steps taken")


def test_the_persons_time_does_not_count_against_the_calls_limit(
    quick: tuple[str, Path],
) -> None:
    """The quick host stops a call after 0.5 s; the person takes longer than that to answer,
    and the call still finishes with their answer."""

    def slow_person(question: wire.Ask, deadline: float) -> tuple[str, dict[str, Any]]:
        time.sleep(1.0)
        return "accept", {"name": "Slow"}

    with _port(quick[0]) as port:
        answer = port.call(session="s", call=1, tool="question", arguments={"message": "Who?"},
                           ask=Questions(slow_person, 30.0))
    assert isinstance(answer, wire.Result), answer
    assert answer.content == 'accept {"name": "Slow"}'


def test_progress_gives_the_call_a_whole_limit_again(quick: tuple[str, Path]) -> None:
    """The quick host stops a call after 0.5 s; one that reports progress every 0.3 s runs
    its 1.2 s to the end, and the same call wanting no progress is stopped at the limit."""
    with _port(quick[0]) as port:
        seen: list[wire.Progress] = []
        answer = port.call(session="s", call=1, tool="long_steps", arguments={"steps": 4},
                           ask=Questions(None, 0.0, seen.append))
        assert isinstance(answer, wire.Result), answer
        assert answer.content == "4 long steps taken" and len(seen) == 4
        stopped = port.call(session="s", call=2, tool="long_steps", arguments={"steps": 4})
        assert isinstance(stopped, wire.Failed)
        assert "did not finish within 0.5 s" in stopped.message
