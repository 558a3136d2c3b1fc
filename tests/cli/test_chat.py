"""``loopd chat`` as a person meets it: a real process in a pseudo-terminal
(pexpect) against the fake llama-server on loopback.

Chat commands never reach the model; ``/new`` moves the chat to a new session and keeps the
old one; how full the conversation is gets said as it nears the context, at the wall (with
the ways on), and when a nearly full session is opened again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from actors.cli.chat import parse
from tests.support.fake_llama import Conn, FakeLlama, Reply, answer, context_full
from tests.support.terminal import json_records, leave

ROOT = Path(__file__).resolve().parents[2]
N_CTX = 1000


class Env:
    def __init__(self, root: Path, fake: FakeLlama) -> None:
        self.root, self.fake = root, fake
        (root / "ws").mkdir()
        self.config = root / "loopd.toml"
        self.config.write_text(
            f'[log]\ndir = "{root / "sessions"}"\n'
            f'[tools]\nworkspace = "{root / "ws"}"\nstandard = false\n'
            "[inference]\nretries = 1\nbackoff_s = 0.01\ntimeout_s = 30\n"
        )
        self.children: list[pexpect.spawn] = []

    def chat(self, session: str = "s", term: str = "dumb") -> pexpect.spawn:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "TERM": term}
        child = pexpect.spawn(
            sys.executable, ["-m", "actors.cli", "chat", "--config", str(self.config), "--url",
                             self.fake.url, "--local", "--session", session],
            cwd=str(ROOT), env=env, encoding="utf-8", timeout=60, dimensions=(50, 200))
        self.children.append(child)
        child.expect("Ctrl-D leaves")
        child.expect("> ")
        return child

    def records(self, session: str) -> list[dict[str, Any]]:
        return json_records(self.config, session)


def _script(body: dict[str, Any]) -> Reply:
    """Answers "ok"; "big" makes the prompt 800 of the context's 1,000 tokens; "huge" does
    not fit."""
    last = body["messages"][-1]["content"]
    if "huge" in last:
        return context_full(n_prompt_tokens=1200, n_ctx=N_CTX)
    if "big" in last:
        return answer("ok", usage={"prompt_tokens": 800, "completion_tokens": 2,
                                   "total_tokens": 802})
    return answer(f"you said: {last}")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with FakeLlama(_script, props={"n_ctx": N_CTX}) as fake:
        made = Env(tmp_path, fake)
        try:
            yield made
        finally:
            for child in made.children:
                if child.isalive():
                    child.kill(signal.SIGKILL)
                child.close(force=True)


def test_help_and_unknown_commands_never_reach_the_model(env: Env) -> None:
    child = env.chat()
    child.sendline("/help")
    child.expect("Chat commands")
    child.expect(r"/new \[NAME\]")
    child.expect("> ")
    child.sendline("/frobnicate now")
    child.expect("there is no chat command /frobnicate")
    child.expect("> ")
    child.sendline("//help is a word")  # a message that starts with a slash
    child.expect("you said: /help is a word")
    child.expect("> ")
    leave(child)
    assert [m["messages"][-1]["content"] for m in env.fake.requests] == ["/help is a word"]


def test_new_moves_the_chat_to_a_new_session_and_keeps_the_old_one(env: Env) -> None:
    child = env.chat("talk")
    child.sendline("first")
    child.expect("you said: first")
    child.expect("> ")
    child.sendline("/new")
    child.expect("session talk-2: a new conversation")
    child.expect("> ")
    child.sendline("second")
    child.expect("you said: second")
    child.expect("> ")
    leave(child)
    users = [[r["content"] for r in env.records(s) if r["kind"] == "user"]
             for s in ("talk", "talk-2")]
    assert users == [["first"], ["second"]]
    second = env.fake.requests[-1]["messages"]
    assert [m["role"] for m in second] == ["system", "user"]  # nothing of the old session


def test_the_context_nearly_full_is_said_and_the_wall_names_the_ways_on(env: Env) -> None:
    child = env.chat("full")
    child.sendline("a big question")
    child.expect("the conversation is filling up: 802 of 1,000 tokens")
    child.expect("Ways on: /new starts a new session here")
    child.expect("> ")
    child.sendline("a huge question")
    child.expect("The conversation is full")
    child.expect("Ways on: /new starts a new session here")
    child.expect("embedded.ctx_size")
    child.expect("> ")
    leave(child)
    # the wall came after a compaction: the message alone does not fit (the server said the
    # prompt exceeds the context), so compaction could not help
    assert any(r["kind"] == "compaction" for r in env.records("full"))
    # Ctrl-D and chat again: the session says it is nearly full at once, not at the next turn
    first = env.chat("near")
    first.sendline("a big question")
    first.expect("the conversation is filling up")
    first.expect("> ")
    leave(first)
    again = env.chat("near")
    assert "session near is filling up: 802 of 1,000 tokens" in " ".join(again.before.split())
    leave(again)


def test_a_long_pasted_line_reaches_the_model_whole(tmp_path: Path) -> None:
    """A terminal cuts a line read without readline at 4,095 bytes, silently: a pasted text
    lost its end (seen in the issue-28 transcript). The chat reads through readline."""
    pasted = " ".join(f"line {i} of a long paste." for i in range(600))  # 15,489 characters
    with FakeLlama(lambda body: answer("noted"), props={"n_ctx": 16_000}) as fake:
        env = Env(tmp_path, fake)
        child = env.chat("paste")
        try:
            child.sendline(pasted)
            child.expect("noted")
            child.expect_exact("> ")
            leave(child)
        finally:
            child.close(force=True)
        (sent,) = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "user"]
    assert len(sent) == len(pasted) and sent == pasted


def test_undo_takes_back_the_last_turn_and_keeps_it_in_the_log(env: Env) -> None:
    child = env.chat("u")
    for line in ("first", "second"):
        child.sendline(line)
        child.expect(f"you said: {line}")
        child.expect("> ")
    child.sendline("/help")
    child.expect(r"/undo \[N\]")
    child.expect("> ")
    child.sendline("/undo")
    child.expect("took back turn 2")
    child.expect("the next message follows turn 1")
    child.expect("> ")
    child.sendline("third")
    child.expect("you said: third")
    child.expect("> ")
    child.sendline("/undo 5")
    child.expect("has only 2 turns to take back, not 5")
    child.expect("> ")
    child.sendline("/undo two")
    child.expect("takes a number of turns")
    child.expect("> ")
    leave(child)
    sent = env.fake.requests[-1]["messages"]
    assert [m["content"] for m in sent[1:]] == ["first", "you said: first", "third"]
    records = env.records("u")
    assert [r["content"] for r in records if r["kind"] == "user"] == ["first", "second", "third"]
    assert [r["to_turn"] for r in records if r["kind"] == "rewind"] == [1]


@pytest.mark.parametrize(("line", "parsed"), [
    ("/help", ("help", "")), ("/new garden", ("new", "garden")), ("  /new  ", ("new", "")),
    ("//new", "/new"), ("/etc/hosts says what?", "/etc/hosts says what?"),
    ("hello /help", "hello /help"), ("/Help", "/Help"),
])
def test_a_line_is_a_command_only_as_a_slash_and_one_word(line: str, parsed: Any) -> None:
    assert parse(line) == parsed


def _slow_prompt(gate: threading.Event) -> Reply:
    """A 4,000-token prompt whose processing the test steps through: 1,000 tokens done in
    2 s by the server's own clock (500 a second: 6 s left), then the gate, then the answer."""

    def serve(conn: Conn) -> None:
        def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> None:
            conn.event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                        "id": "c1", "object": "chat.completion.chunk", **more})

        conn.head(200, "text/event-stream")
        role = {"role": "assistant", "content": None}
        for done, ms in ((0, 0), (1000, 2000)):
            chunk(role, prompt_progress={"total": 4000, "cache": 0, "processed": done,
                                         "time_ms": ms})
        gate.wait(30)
        chunk({"content": "Read it all."})
        chunk({}, "stop")
        conn.event({"choices": [], "id": "c1", "usage": {
            "prompt_tokens": 4000, "completion_tokens": 4, "total_tokens": 4004},
            "timings": {"cache_n": 0, "prompt_n": 4000}})
        conn.event("[DONE]")
        conn.end()

    return Reply("slow_prompt", serve)


def test_prompt_processing_shows_tokens_done_and_the_time_left(tmp_path: Path) -> None:
    gate = threading.Event()
    with FakeLlama([_slow_prompt(gate)]) as fake:
        env = Env(tmp_path, fake)
        try:
            child = env.chat(term="xterm-256color")  # rich draws no bar on a dumb one
            child.sendline("read the long file")
            child.expect(r"1,000/4,000 tokens")
            child.expect("about 6 s left")
            gate.set()
            child.expect("Read it all.")
            child.expect("> ")
            leave(child)
        finally:
            gate.set()
            for c in env.children:
                c.close(force=True)


def test_compact_shortens_the_conversation_and_it_goes_on(env: Env) -> None:
    child = env.chat("k")
    for line in ("first", "second", "third"):
        child.sendline(line)
        child.expect(f"you said: {line}")
        child.expect("> ")
    child.sendline("/help")
    child.expect("/compact")
    child.expect("> ")
    child.sendline("/compact")
    child.expect("compacting the conversation \\(asked for\\)")
    child.expect("compacted: ")
    child.expect("> ")
    child.sendline("fourth")
    child.expect("you said: fourth")
    child.expect("> ")
    leave(child)
    sent = env.fake.requests[-1]["messages"]
    assert sent[1]["content"].startswith("[loopd: the earlier part of this conversation")
    assert sent[-1]["content"] == "fourth" and len(sent) < 2 + 2 * 4
    records = env.records("k")
    (compaction,) = [r for r in records if r["kind"] == "compaction"]
    assert compaction["by"] == "person"
    assert [r["content"] for r in records if r["kind"] == "user"] == [
        "first", "second", "third", "fourth"]  # the log keeps every turn


def test_a_session_opened_after_a_compaction_says_its_size_from_the_compaction(
        tmp_path: Path) -> None:
    """The greeting read the last Usage record the conversation shows: after a compaction
    there is none until the next request, so a session compacted to 800 of 1,000 tokens was
    opened as if empty. The compaction's estimate stands in (as in `loopd sessions`)."""
    import io
    import types
    from typing import cast

    from rich.console import Console

    from actors.base import config as cfg
    from actors.cli.chat import Chat
    from actors.cli.conversation import Conversation
    from actors.log.file import SessionLog
    from actors.log.records import Assistant, Compaction, CompactionBy, Usage, User
    from tests.support.turn_rig import baseline

    config = cfg.Config(log=cfg.LogConfig(dir=str(tmp_path)))
    log, _ = SessionLog.open(tmp_path / "c" / "log.bin", fsync="never", baseline=baseline(),
                             name="c")
    log.append(User(content="a pasted page"), Assistant(content="ok", reasoning=None),
               Usage(timings={}, reasoning_tokens=0, thinking_capped=False, prompt_tokens=930,
                     completion_tokens=2, finish_reason="stop"))
    log.append(Compaction(summary="They pasted a page.", kept=1, tokens_before=932,
                          by=CompactionBy.PERSON, tokens_after=800))
    log.close()
    conversation = types.SimpleNamespace(config=config, name="c", context=lambda: N_CTX)
    out = io.StringIO()
    chat = Chat(cast(Conversation, conversation), Console(file=out, width=200), {})
    chat.greet()
    said = " ".join(out.getvalue().split())
    assert "session c is filling up: 800 of 1,000 tokens (80%)" in said, said
