"""Bad input on ``loopd acp``'s stdin gets a JSON-RPC error and loses nothing; its end, or a
signal, mid-turn leaves a valid log and no process behind. A real ``loopd acp`` process,
written to line by line (no SDK would send these bytes)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.base.processes.stop_deadline import EXIT_CODE
from actors.log.records import Assistant, User
from tests.support.acp_editor import AcpEnv, RawAgent, assert_gone, children_of, model
from tests.support.fake_llama import FakeLlama

pytestmark = pytest.mark.timeout(240)

TEN_MB = 10 * 1024 * 1024
HANG_S = 60  # hang guards: the grace of the stop test is 2 s


def prompt(raw: RawAgent, session: str, text: str) -> tuple[dict[str, Any], list[Any]]:
    rid = raw.send("session/prompt", {"sessionId": session,
                                      "prompt": [{"type": "text", "text": text}]})
    return raw.answer(rid)


def error_of(message: dict[str, Any]) -> tuple[Any, int]:
    assert "error" in message and "result" not in message, message
    return message["id"], message["error"]["code"]


def test_garbage_gets_errors_and_the_session_goes_on(
    env: AcpEnv, raw: Callable[..., RawAgent]
) -> None:
    agent = raw("--local")
    session = agent.start(env.workspace)
    answered, _ = prompt(agent, session, "t1")
    assert answered["result"] == {"stopReason": "end_turn"}

    agent.write(b"this is not json\n")
    assert error_of(agent.read()) == (None, -32700)
    agent.write(b'{"jsonrpc": "2.0", "id": 7, "method": \n')  # cut short
    assert error_of(agent.read()) == (None, -32700)
    agent.write(b"[1, 2, 3]\n")  # a batch: ACP has none
    assert error_of(agent.read()) == (None, -32600)
    agent.write(b"42\n")
    assert error_of(agent.read()) == (None, -32600)
    agent.write(b'{"jsonrpc": "2.0", "id": "x8"}\n')  # neither a request nor an answer
    assert error_of(agent.read()) == ("x8", -32600)
    agent.write(b'{"jsonrpc": "2.0", "id": "x9", "method": ["session/new"]}\n')
    assert error_of(agent.read()) == ("x9", -32600)
    agent.write(b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "initialize"}\n')
    assert error_of(agent.read()) == (None, -32600)
    agent.write(b"\n   \n")  # blank lines: nothing to answer

    # unknown methods; a notification gets no answer (JSON-RPC), a request an error
    agent.send("no/such/thing", {}, notify=True)
    rid = agent.send("no/such/method", {})
    assert error_of(agent.answer(rid)[0]) == (rid, -32601)
    assert error_of(agent.request("session/set_mode", {"sessionId": session,
                                                       "modeId": "x"}))[1] == -32601

    # wrong params
    for method, params in [
        ("initialize", {}),  # no protocolVersion
        ("session/prompt", {"sessionId": session}),  # no prompt
        ("session/prompt", {"sessionId": session, "prompt": "not a list"}),
        ("session/new", {"mcpServers": []}),  # no cwd
        ("session/fork", {"sessionId": session}),  # no cwd
        ("session/load", {"sessionId": 5, "cwd": str(env.workspace), "mcpServers": []}),
    ]:
        assert error_of(agent.request(method, params))[1] == -32602, (method, params)
    bad = [
        ("session/prompt", {"sessionId": "nobody", "prompt": [{"type": "text", "text": "hi"}]},
         "no session 'nobody'"),
        ("session/prompt", {"sessionId": session, "prompt": [{"type": "image", "data": "AA==",
                                                              "mimeType": "image/png"}]},
         "text and resource_link"),
        ("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": " "}]},
         "the prompt is empty"),
        ("session/new", {"cwd": "relative/dir", "mcpServers": []}, "absolute path"),
        ("session/new", {"cwd": str(env.root / "missing"), "mcpServers": []},
         "is not a directory"),
        ("session/new", {"cwd": str(env.root), "mcpServers": []}, "needs a loopd acp"),
        ("session/load", {"sessionId": "../etc", "cwd": str(env.workspace),
                          "mcpServers": []}, "is not allowed"),
        ("session/load", {"sessionId": "never-made", "cwd": str(env.workspace),
                          "mcpServers": []}, "does not exist"),
    ]
    for method, params, says in bad:
        message = agent.request(method, params)
        assert "error" in message and says in message["error"]["message"], (method, message)

    # a 10 MB line: answered under its id (read from its first bytes), never held whole
    rid = next(agent.ids)
    huge = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "session/prompt", "params": {
        "sessionId": session, "prompt": [{"type": "text", "text": "x" * TEN_MB}]}})
    agent.write(huge.encode() + b"\n")
    message = agent.read()
    assert error_of(message) == (rid, -32600)
    assert "over loopd's limit" in message["error"]["message"]
    agent.write(b"y" * TEN_MB + b"\n")  # 10 MB of garbage: no id to answer under
    assert error_of(agent.read()) == (None, -32600)

    # nothing was lost, nothing was added: the session answers, its log has the good turns
    answered, _ = prompt(agent, session, "t2")
    assert answered["result"] == {"stopReason": "end_turn"}
    assert agent.close() == 0
    records = env.records(session)
    assert [r.content for r in records if isinstance(r, User)] == ["t1", "t2"]
    assert [r.content for r in records if isinstance(r, Assistant)] == ["done t1.", "done t2."]
    for line in agent.stdout_bytes:  # and stdout held nothing but JSON-RPC
        assert json.loads(line)["jsonrpc"] == "2.0"


@pytest.mark.parametrize("how", ["stdin closes", "SIGTERM"])
def test_the_end_mid_turn_leaves_a_valid_log_and_no_process(
    env: AcpEnv, raw: Callable[..., RawAgent], how: str
) -> None:
    agent = raw("--local")
    session = agent.start(env.workspace)
    rid = agent.send("session/prompt", {"sessionId": session,
                                        "prompt": [{"type": "text", "text": "t1 [stall]"}]})
    while True:  # the answer has begun: the turn is in the middle of a model response
        message = agent.read()
        if message.get("params", {}).get("update", {}).get("sessionUpdate") == (
                "agent_message_chunk"):
            break
    started = children_of(agent.proc.pid)
    assert started  # the tool host
    if how == "SIGTERM":
        agent.proc.send_signal(signal.SIGTERM)
    assert agent.close() == 0
    assert_gone(started)
    # the prompt read before the end was answered: cancelled
    answers = [json.loads(line) for line in agent.stdout_bytes]
    assert {"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "cancelled"}} in answers
    records = env.records(session)  # whole: no torn tail
    assert [r.content for r in records if isinstance(r, User)] == ["t1 [stall]"]
    assert not any(isinstance(r, Assistant) for r in records)  # the cut answer is not kept


def test_a_stop_that_outlasts_its_grace_ends_acp_and_leaves_the_log_whole(
    tmp_path: Path,
) -> None:
    """SIGTERM after a turn; the model server then takes the KV save at the stop and never
    answers (inference.read_timeout_s an hour): `loopd acp` waited for it that long. Past
    daemon.stop_grace_s it says so, kills its tool host and exits 1; the log is whole."""
    save = tmp_path / "save"
    save.mkdir()
    with FakeLlama(model(), save_dir=save) as fake:
        env = AcpEnv(tmp_path, fake.url)
        text = env.config.read_text()
        env.config.write_text(
            text.replace("[inference]\n", "[inference]\nread_timeout_s = 3600\n")
            + f'[slots]\nsave_dir = "{save}"\n[daemon]\nstop_grace_s = 2\n'
        )
        agent = RawAgent(env.argv("--local"), env.stderr)
        try:
            session = agent.start(env.workspace)
            answered, _ = prompt(agent, session, "t1")
            assert answered["result"] == {"stopReason": "end_turn"}
            started = children_of(agent.proc.pid)
            assert started  # the tool host
            fake.slot_gate.clear()  # from now on every slot action waits for the test
            agent.proc.send_signal(signal.SIGTERM)
            code = agent.close(timeout=HANG_S)  # a hang guard, well past the grace
            assert any(a == "save" for a, _, _ in fake.slot_calls)  # what it waited on
        finally:
            fake.slot_gate.set()
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
    err = env.stderr.read_text()
    assert code == EXIT_CODE, err
    assert "loopd did not stop within daemon.stop_grace_s = 2 s" in err
    assert "Thread 0x" in err  # the stacks: where it was stuck
    assert_gone(started)
    records = env.records(session)  # whole: no torn tail
    assert [r.content for r in records if isinstance(r, User)] == ["t1"]


def test_lifecycle_bad_input_is_answered_and_loses_nothing(
    env: AcpEnv, raw: Callable[..., RawAgent], tmp_path: Path
) -> None:
    """Close twice, a prompt or close of an unknown session, resume of an unknown one, resume
    or load of another workspace's: each a clear error; the session goes on after them."""
    agent = raw("--local")
    session = agent.start(env.workspace)
    answered, _ = prompt(agent, session, "t1")
    assert answered["result"] == {"stopReason": "end_turn"}

    closed = agent.request("session/close", {"sessionId": session})
    assert closed["result"] == {"_meta": {"loopd": {"cancelledTurn": False}}}
    again = agent.request("session/close", {"sessionId": session})
    assert error_of(again)[1] == -32002
    assert "not open in this loopd acp (closed already" in again["error"]["message"]

    unknown = agent.request("session/resume", {"sessionId": "nobody", "cwd": str(env.workspace),
                                               "mcpServers": []})
    assert error_of(unknown)[1] == -32002
    assert unknown["error"]["message"].startswith("session nobody does not exist")
    assert "result" in agent.request("session/resume", {
        "sessionId": session, "cwd": str(env.workspace), "mcpServers": []})
    answered, _ = prompt(agent, session, "t2")
    assert answered["result"] == {"stopReason": "end_turn"}
    assert agent.close() == 0

    # another workspace's loopd acp: the session is refused, not opened there
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = raw("--local")
    assert "result" in elsewhere.request("initialize", {"protocolVersion": 1})
    refused = elsewhere.request("session/resume", {"sessionId": session, "cwd": str(other),
                                                   "mcpServers": []})
    assert error_of(refused)[1] == -32602
    assert str(env.workspace) in refused["error"]["message"]
    loaded = elsewhere.request("session/load", {"sessionId": session, "cwd": str(other),
                                                "mcpServers": []})
    assert error_of(loaded)[1] == -32602  # the same check as resume: nothing replayed
    assert str(env.workspace) in loaded["error"]["message"]
    assert elsewhere.close() == 0
    assert not [m for m in elsewhere.stdout_bytes if b"session/update" in m]
    users = [r.content for r in env.records(session) if isinstance(r, User)]
    assert users == ["t1", "t2"]


def test_close_mid_turn_cancels_it_and_the_session_resumes(
    env: AcpEnv, raw: Callable[..., RawAgent]
) -> None:
    """session/close while a turn runs: the turn ends ``cancelled`` (its log valid), the
    close answers after it, and the session resumes and goes on."""
    agent = raw("--local")
    session = agent.start(env.workspace)
    turn = agent.send("session/prompt", {"sessionId": session,
                                         "prompt": [{"type": "text", "text": "t1 [stall]"}]})
    while agent.read(HANG_S).get("params", {}).get("update", {}).get(
            "sessionUpdate") != "agent_message_chunk":
        pass  # the answer has begun: the turn is running
    close = agent.send("session/close", {"sessionId": session})
    answers: dict[Any, dict[str, Any]] = {}
    while len(answers) < 2:
        message = agent.read(HANG_S)
        if "method" not in message:
            answers[message["id"]] = message
    assert answers[turn]["result"]["stopReason"] == "cancelled"
    assert answers[close]["result"] == {"_meta": {"loopd": {"cancelledTurn": True}}}
    assert "result" in agent.request("session/resume", {
        "sessionId": session, "cwd": str(env.workspace), "mcpServers": []})
    answered, _ = prompt(agent, session, "t2")
    assert answered["result"] == {"stopReason": "end_turn"}
    assert agent.close() == 0
    records = env.records(session)
    assert [r.content for r in records if isinstance(r, User)] == ["t1 [stall]", "t2"]
