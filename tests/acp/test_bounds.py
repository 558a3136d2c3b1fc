"""What no ACP client can do to ``loopd acp``: end it with a line nested too deep, or run it
out of descriptors by opening sessions. A real ``loopd acp`` process, written to line by
line."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.log.records import User
from tests.support.acp_editor import AcpEnv, RawAgent

pytestmark = pytest.mark.timeout(240)

LINE = 200 * 1024  # a line well under the 4 MiB limit
FDS = 160  # the descriptors of the process that runs out of them


def error_of(message: dict[str, Any]) -> tuple[Any, int]:
    assert "error" in message and "result" not in message, message
    return message["id"], message["error"]["code"]


def prompt(agent: RawAgent, session: str, text: str) -> dict[str, Any]:
    rid = agent.send("session/prompt", {"sessionId": session,
                                        "prompt": [{"type": "text", "text": text}]})
    return agent.answer(rid)[0]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_line_nested_too_deep_gets_an_error_and_the_agent_goes_on(
    env: AcpEnv, raw: Callable[..., RawAgent]
) -> None:
    agent = raw("--local")
    session = agent.start(env.workspace)
    agent.write(b"[" * LINE + b"\n")  # never closed
    assert error_of(agent.read())[1] == -32600
    agent.write(nested(LINE // 2).encode() + b"\n")  # closed: 200 KB of brackets
    assert error_of(agent.read())[1] == -32600
    agent.write(b'{"jsonrpc": "2.0", "id": 7, "method": "session/prompt", "params": '
                + nested(LINE // 2).encode() + b"}\n")  # answered under its id
    message = agent.read()
    assert error_of(message) == (7, -32600) and "nests deeper" in message["error"]["message"]
    for rid, depth in ((8, 100), (9, 900), (10, 990)):  # deep, within what the parser follows
        agent.write(b'{"jsonrpc": "2.0", "id": %d, "method": "session/prompt", "params": '
                    b'{"sessionId": "%s", "prompt": [{"type": "text", "text": "x", "_meta": '
                    b'{"deep": %s}}]}}\n' % (rid, session.encode(), nested(depth).encode()))
        assert agent.answer(rid)[0]["id"] == rid  # an answer, whichever
    assert prompt(agent, session, "t1")["result"] == {"stopReason": "end_turn"}
    assert agent.close() == 0


def open_fds(agent: RawAgent) -> int:
    return len(os.listdir(f"/proc/{agent.proc.pid}/fd"))


def test_local_sessions_past_the_cap_close_the_least_recently_used(
    env: AcpEnv, raw: Callable[..., RawAgent]
) -> None:
    """Three sessions open at most: the fourth, fifth ... close the idle one used least
    recently, which answers again when next asked (opened from its log)."""
    env.config.write_text(env.config.read_text() + "[daemon]\nmax_sessions_per_client = 3\n")
    agent = raw("--local")
    first = agent.start(env.workspace)
    assert prompt(agent, first, "t1")["result"] == {"stopReason": "end_turn"}
    made = [first] + [new(agent, env) for _ in range(2)]
    full = open_fds(agent)
    made += [new(agent, env) for _ in range(12)]
    assert open_fds(agent) <= full + 2, (full, open_fds(agent))  # not one more per session
    assert prompt(agent, first, "t2")["result"] == {"stopReason": "end_turn"}
    listed = agent.request("session/list", {})["result"]["sessions"]
    assert {s["sessionId"] for s in listed} >= set(made)
    assert agent.close() == 0
    assert [r.content for r in env.records(first) if isinstance(r, User)] == ["t1", "t2"]


def new(agent: RawAgent, env: AcpEnv) -> str:
    made = agent.request("session/new", {"cwd": str(env.workspace), "mcpServers": []})
    session: str = made["result"]["sessionId"]
    return session


def test_running_out_of_descriptors_is_an_error_answer(
    env: AcpEnv, raw: Callable[..., RawAgent], tmp_path: Path
) -> None:
    """With the cap above what the process may open, sessions are opened until the
    descriptors run out: every request still gets an answer, errors name the problem, and
    the agent ends cleanly."""
    env.config.write_text(env.config.read_text() + "[daemon]\nmax_sessions_per_client = 4000\n")
    agent = RawAgent(["prlimit", f"--nofile={FDS}:{FDS}", "--", *env.argv("--local")],
                     env.stderr)
    try:
        assert "result" in agent.request("initialize", {"protocolVersion": 1})
        errors = []
        for _ in range(FDS):
            made = agent.request("session/new", {"cwd": str(env.workspace), "mcpServers": []})
            if "error" in made:
                errors.append(made["error"]["message"])
                break
        assert errors, "the descriptors never ran out"
        listed = agent.request("session/list", {})  # an answer, a result or an error
        assert "result" in listed or "descriptor" in listed["error"]["message"], listed
        assert agent.close() == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
    assert "Traceback" not in env.stderr.read_text()
