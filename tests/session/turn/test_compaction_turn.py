"""Compaction inside a turn, against the fake llama-server: before a request past
session.compact_at, after the server's "exceeds the context", and SessionFull for what it
cannot help (a message larger than the context, refused before it is logged; a turn refused
once logged is taken back: its message is never answered later, out of order)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.base.errors import SessionFull
from actors.base.events import Compacted, Compacting, Content
from actors.inference.actor import Inference
from actors.log.file import SessionLog
from actors.log.records import (
    Assistant,
    Baseline,
    CacheLoss,
    Compaction,
    CompactionBy,
    Rewind,
    ToolResult,
    Usage,
    User,
    now,
)
from actors.session import limits as limits_module
from actors.session import messages as messages_module
from actors.session import render as render_module
from actors.session.compaction import ELIDE_HEADER
from actors.session.frame_words import frame_piece
from actors.session.messages import SUMMARY_FRAME
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass
from actors.tools.registry import META_TOOLS, Registry
from tests.support.fake_llama import Reply, answer, context_full, render_prompt
from tests.support.turn_rig import Rig, ScriptedPort

Make = Callable[..., Rig]
LONG = " more" * 80  # 400 characters: 100 of the fake's tokens
ECHO = ("call_tool", json.dumps({"name": "echo", "arguments": {"text": "x"}}))


def compacting(r: Rig, **session: Any) -> Rig:
    r.config = r.config.replace("session", **session)
    r.runtime = type(r.runtime)(config=r.config, inference=r.inference,
                                registry=r.runtime.registry)
    return r


def test_a_turn_past_compact_at_compacts_first_and_the_cache_keeps_the_baseline(
        rig: Make) -> None:
    r = compacting(rig(lambda body: answer("noted"), props={"n_ctx": 1000}), compaction="elide")
    for n in range(5):
        r.turn(f"question {n}{LONG}")
    assert not any(isinstance(x, Compaction) for x in r.records)  # 5 turns fit 800 tokens
    before = r.fake.requests[-1]
    r.turn(f"question 5{LONG}")
    (compaction,) = [x for x in r.records if isinstance(x, Compaction)]
    assert compaction.by is CompactionBy.AUTO and compaction.tokens_before > 800
    assert compaction.summary.startswith(ELIDE_HEADER) and "question 0" in compaction.summary
    # the Compaction comes before the turn's question, which is sent after the kept turns
    assert isinstance(r.records[r.records.index(compaction) + 1], User)
    start = next(e for e in r.events if isinstance(e, Compacting))
    done = next(e for e in r.events if isinstance(e, Compacted))
    assert (start.why, start.how, done.why) == ("auto", "elide", "auto")
    assert done.tokens_after < done.tokens_before == compaction.tokens_before
    first = r.fake.requests[-1]["messages"]
    assert first[0] == before["messages"][0]  # the baseline's prefix: the system prompt
    assert first[1]["content"] == SUMMARY_FRAME.format(summary=compaction.summary)
    assert first[-1]["content"] == f"question 5{LONG}"
    usage = r.records[-1]
    assert isinstance(usage, Usage)
    baseline_tokens = 190  # the fake's tools and system prompt, about
    assert usage.timings["cache_n"] >= baseline_tokens  # the prefix was kept
    assert usage.prompt_tokens < compaction.tokens_before
    assert not any(isinstance(x, CacheLoss) for x in r.records)  # expected, not a loss
    r.turn("and then?")  # the next request extends the first of the epoch
    assert r.fake.requests[-1]["messages"][: len(first)] == first
    assert not any(isinstance(x, CacheLoss) for x in r.records)


def test_in_a_small_context_a_compaction_leaves_room_for_the_next_turn(rig: Make) -> None:
    """The baseline (~190 of the fake's tokens) is nearly half of a 500-token context and a
    turn ~60 tokens: were the kept turns as many as compact_keep allows, they would fill
    what the compaction freed and every turn would compact again. The kept turns take at
    most half the room, so no two turns in a row compact."""
    words = " word" * 18
    r = compacting(rig(lambda body: answer("noted" + words), props={"n_ctx": 500}),
                   compaction="elide")
    made: list[int] = []
    for n in range(16):
        before = sum(isinstance(x, Compaction) for x in r.records)
        r.turn(f"question {n}{words}")
        made.append(sum(isinstance(x, Compaction) for x in r.records) - before)
    shape = "".join(map(str, made))
    assert shape.count("1") >= 4 and "11" not in shape and "2" not in shape, shape
    assert all(a.content for a in r.records if isinstance(a, Assistant)), shape


def test_a_turn_past_compact_at_alone_is_kept_when_the_context_holds_it(rig: Make) -> None:
    """A tool result that alone takes the turn past compact_at (as a read of a long file in a
    small context) but fits the context: the compaction keeps that turn whole (half the
    headroom above compact_at stays for the answer) and it is answered, instead of
    SessionFull and a new session. Real model, 4,096 tokens: a 1,900-token read did that."""
    big = ("result " * 280).strip()  # ~490 of the fake's tokens: the turn ~520 with it
    replies: list[Reply] = [answer("noted"), answer("noted"), answer("noted"),
                            answer(tool_calls=[ECHO]), answer("read it")]

    def script(body: dict[str, Any]) -> Reply:  # the server's context: 1,000 tokens
        tokens = len(render_prompt(body)) // 4
        return context_full(tokens, 1000) if tokens > 1000 else replies.pop(0)

    port = ScriptedPort(lambda tool, args: wire.Result(
        id=0, content=big, class_=ResultClass.PUBLIC, untrusted=False))
    r = compacting(rig(script, Registry([port]), props={"n_ctx": 1000}), compaction="elide")
    for n in range(3):
        r.turn(f"question {n}{LONG}")
    outcome = r.turn("read the long one")
    assert outcome.content == "read it"
    assert sum(isinstance(x, Compaction) for x in r.records) == 1
    last = r.fake.requests[-1]["messages"]
    assert big in str(last[-1]["content"])
    assert not any(str(m["content"]).startswith("question 2") for m in last)  # not verbatim
    assert not any(isinstance(x, Rewind) for x in r.records)


def test_a_turn_far_from_the_limits_asks_the_server_for_no_count(
        rig: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each /tokenize is a round trip to the server: a request that fits by an upper bound
    of the counts (its bytes) asks for none; one near compact_at is counted exactly (the
    test above: five turns of 400 characters fit 800 of the fake's tokens, not of bytes)."""
    asked: list[str] = []
    real = Inference.tokens

    def tokens(self: Inference, session: str, text: str) -> int:
        asked.append(text)
        return real(self, session, text)

    monkeypatch.setattr(Inference, "tokens", tokens)
    r = compacting(rig(lambda body: answer("noted")), compaction="elide")  # 8,192 tokens
    r.turn("first question")
    r.turn("second question")
    assert asked == []
    r = compacting(rig(lambda body: answer("noted"), props={"n_ctx": 1000}), compaction="elide")
    for n in range(3):
        r.turn(f"question {n}{LONG}")
    assert asked, "near the limit the server counts"
    assert not any(isinstance(x, Compaction) for x in r.records)


def test_each_request_renders_the_conversation_once(
        rig: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendering is the turn's cost that grows with the log: the messages make_room renders
    to count a request are the ones sent (one rendering a request, as before compaction)."""
    renders: list[int] = []
    real = messages_module.render

    def render(*args: Any, **kw: Any) -> Any:
        renders.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(messages_module, "render", render)
    monkeypatch.setattr(render_module, "render", render)
    replies: list[Reply] = [answer(tool_calls=[ECHO]), answer("done")]
    r = compacting(rig(replies, Registry([ScriptedPort()])), compaction="elide")
    r.turn("first question")
    assert len(r.fake.requests) == 2
    assert len(renders) == 2
    assert r.fake.requests[-1]["messages"][-1]["role"] == "tool"


def test_each_request_folds_the_log_into_its_view_once(
        rig: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """The view (a fold over every record) is worked out once a request: when its prompt is
    measured; the last shown Usage, asked then and again when the answer is logged, comes
    from that view (before: three folds a request)."""
    folds: list[int] = []
    real = messages_module.view

    def view(*args: Any, **kw: Any) -> Any:
        folds.append(1)
        return real(*args, **kw)

    for module in (messages_module, render_module, limits_module):
        monkeypatch.setattr(module, "view", view)
    replies: list[Reply] = [answer(tool_calls=[ECHO]), answer("done"), answer("two")]
    r = compacting(rig(replies, Registry([ScriptedPort()])), compaction="elide")
    r.turn("first question")
    r.turn("second question")
    assert len(r.fake.requests) == 3
    assert len(folds) == 3
    assert [type(x).__name__ for x in r.records].count("Usage") == 3


def test_the_server_saying_the_context_is_exceeded_compacts_and_asks_again(rig: Make) -> None:
    replies: list[Reply] = [answer("one"), answer("two"), context_full(9000, 8192),
                            answer("three")]
    r = compacting(rig(replies), compaction="elide")
    r.turn("first question")
    r.turn("second question")
    assert r.turn("third question").content == "three"
    (compaction,) = [x for x in r.records if isinstance(x, Compaction)]
    assert compaction.by is CompactionBy.OVERFLOW and compaction.tokens_before == 9000
    assert r.kinds()[-4:] == ["User", "Compaction", "Assistant", "Usage"]
    retried = r.fake.requests[-1]["messages"]
    assert retried[1]["content"].startswith(SUMMARY_FRAME.split("{")[0])
    assert not any(isinstance(x, CacheLoss) for x in r.records)


def test_a_summary_is_asked_of_the_model_on_the_warm_slot(rig: Make) -> None:
    replies: list[Reply] = [answer("one"), answer("two"), context_full(9000, 8192),
                            answer("They asked two things."), answer("three")]
    r = compacting(rig(replies), compaction="summary", summary_tokens=64)
    r.turn("first question")
    r.turn("second question")
    r.turn("third question")
    (compaction,) = [x for x in r.records if isinstance(x, Compaction)]
    assert compaction.summary == "They asked two things."
    full, asked = r.fake.requests[2], r.fake.requests[3]
    # the live prompt (what the slot holds) and one request more, thinking off, capped
    assert asked["messages"][:-1] == full["messages"]
    assert "summary" in asked["messages"][-1]["content"]
    assert asked["max_tokens"] == 64
    assert (asked.get("chat_template_kwargs") or {}).get("enable_thinking") is False
    # no Usage record for the summary request: one per answer of the conversation
    assert sum(isinstance(x, Usage) for x in r.records) == 3


def test_a_message_larger_than_the_context_is_refused_and_logs_nothing(rig: Make) -> None:
    r = rig([answer("fine")], props={"n_ctx": 1000})
    before = r.path.read_bytes()
    with pytest.raises(SessionFull) as full:
        r.turn("x" * 5000)  # 1,250 of the fake's tokens
    assert "Your message was not sent (nor kept)" in str(full.value)
    assert r.path.read_bytes() == before and r.fake.requests == []
    assert r.turn("a short one").content == "fine"


def test_an_overflow_nothing_can_be_dropped_from_is_session_full(rig: Make) -> None:
    r = rig([context_full(9000, 8192), answer("fresh")])
    with pytest.raises(SessionFull):
        r.turn("only question")
    # nothing to compact (the one message is the conversation): the turn is taken back
    assert r.kinds() == ["User", "Rewind"]
    assert r.turn("a short one").content == "fresh"
    assert [m["content"] for m in r.fake.requests[-1]["messages"][1:]] == ["a short one"]


def test_a_turn_refused_after_its_calls_and_a_compaction_is_taken_back_whole(
        rig: Make) -> None:
    """A message typed while full was answered once the context was raised. A turn
    full again after compacting goes back to where it was asked: its question, call, result
    and compaction stay in the log; the next request sends turn 1 and the new message only."""
    replies: list[Reply] = [answer("one"), answer(tool_calls=[ECHO]),
                            context_full(9000, 8192), context_full(9000, 8192), answer("three")]
    r = compacting(rig(replies, Registry([ScriptedPort()])), compaction="elide")
    r.turn("first")
    answered = [*r.fake.requests[0]["messages"], {"role": "assistant", "content": "one"}]
    before = r.path.read_bytes()
    with pytest.raises(SessionFull) as full:
        r.turn("read the long file")
    assert "taken back" in str(full.value) and "9000 tokens" in str(full.value)
    assert r.path.read_bytes().startswith(before)  # the log only grew
    assert r.kinds()[-3:] == ["ToolResult", "Compaction", "Rewind"]
    (back,) = [x for x in r.records if isinstance(x, Rewind)]
    assert back.to_turn == 1 and back.refused == "the prompt is 9000 tokens and the model's " \
        "context holds 8192"
    assert any(isinstance(x, ToolResult) for x in r.records)  # kept in the log
    assert r.turn("third").content == "three"
    sent = r.fake.requests[-1]["messages"]
    assert sent[: len(answered)] == answered
    assert [m["content"] for m in sent[len(answered):]] == ["third"]


def test_compaction_off_leaves_a_full_context_session_full(rig: Make) -> None:
    """compaction = "off": neither past compact_at (where "elide" compacts at turn 6, the
    first test) nor on the server's "exceeds the context": the turn is SessionFull and taken
    back (its question stays in the log, never sent)."""
    full: list[bool] = []

    def script(body: dict[str, Any]) -> Reply:
        return context_full(1100, 1000) if full else answer("noted")

    r = compacting(rig(script, props={"n_ctx": 1000}), compaction="off")
    for n in range(7):  # past 800 tokens (compact_at 0.8 of 1000) from turn 6
        r.turn(f"question {n}{LONG}")
    assert not any(isinstance(x, Compaction) for x in r.records)
    assert not any(isinstance(e, Compacting) for e in r.events)
    full.append(True)
    before = r.path.read_bytes()
    with pytest.raises(SessionFull):
        r.turn("question 7")
    assert r.kinds()[-2:] == ["User", "Rewind"]  # the question is logged, nothing compacted
    assert not any(isinstance(x, Compaction) for x in r.records)
    assert r.path.read_bytes().startswith(before)


def pasted(n: int) -> str:
    """~450 of the fake's tokens of notes (a person pasting), ending "Reply with OK."."""
    lines = " ".join(f"Item {n}-{j}: the red box on shelf {j} holds {n + j} screws."
                     for j in range(1, 36))
    return f"Notes, part {n}: {lines} Reply with OK."


def test_ten_pasted_pages_on_a_small_context_never_compact_twice_in_a_row(
        rig: Make, tmp_path: Path) -> None:
    """A 4,096-token context whose baseline takes ~1,170 (the embedded model's share): at
    compact_at 0.4 (1,638 tokens) every request passed the threshold and compacted, the
    first of a turn and the one after its call alike. The threshold counts the room after
    the baseline: every turn is answered, no request compacts right after one that did, and
    at most every other turn compacts. Each turn makes a call first (as the
    embedded model did, listing an empty workspace): before, both its requests compacted."""
    def script(body: dict[str, Any]) -> Reply:  # a call first, as the small model did
        last = body["messages"][-1]
        return answer(tool_calls=[ECHO]) if last["role"] == "user" else answer("OK")

    r = compacting(rig(script, props={"n_ctx": 4096}), compaction="elide", compact_at=0.4)
    r.log.close()
    r.log, _ = SessionLog.open(tmp_path / "paste" / "log.bin", fsync="never", name="s",
                               baseline=Baseline(system="Be brief. " * 390, tools=META_TOOLS,
                                                 model="fake", created=now()))
    assert 900 < r.inference.tokens("s", r.log.baseline.system) < 1050  # tools: ~190 more
    made = []
    for n in range(1, 11):
        assert 430 < len(pasted(n)) // 4 < 470
        assert r.turn(pasted(n)).content == "OK"
        made.append(sum(isinstance(x, Compaction) for x in r.records) - sum(made))
    kinds = [type(x).__name__ for x in r.records if isinstance(x, Compaction | Usage)]
    shape = "".join(map(str, made))
    assert "CompactionUsageCompaction" not in "".join(kinds), shape  # not twice in a row
    assert 1 <= shape.count("1") <= 4 and "2" not in shape and "11" not in shape, shape
    # each compaction keeps the last turn verbatim: the context holds it, the turn sent with
    # the compaction and the one after (before: 19 compactions in these 10 turns, "1222222222")
    compacted = [e for e in r.events if isinstance(e, Compacted)]
    assert compacted and all(e.turns_kept >= 2 for e in compacted), compacted


def test_the_request_after_a_compaction_compacts_again_only_when_the_context_is_full(
        rig: Make) -> None:
    """A turn compacts before its first request, then reads a long result that takes the
    next request past the threshold again: compacting at once would free little and drop
    what the first compaction kept. It is sent as it is (it fits the context); the turn
    after it may compact."""
    big = ("result " * 180).strip()  # ~320 of the fake's tokens
    replies: list[Reply] = [answer("noted")] * 5 + [answer(tool_calls=[ECHO]), answer("read"),
                                                    answer("next")]
    port = ScriptedPort(lambda tool, args: wire.Result(
        id=0, content=big, class_=ResultClass.PUBLIC, untrusted=False))
    r = compacting(rig(replies, Registry([port]), props={"n_ctx": 1000}), compaction="elide")
    for n in range(5):
        r.turn(f"question {n}{LONG}")
    assert not any(isinstance(x, Compaction) for x in r.records)
    assert r.turn(f"read it{LONG}").content == "read"
    assert sum(isinstance(x, Compaction) for x in r.records) == 1
    kinds = "".join(type(x).__name__[0] for x in r.records if isinstance(x, Compaction | Usage))
    assert "CUC" not in kinds, kinds  # no request compacted right after one that did
    assert big in str(r.fake.requests[-1]["messages"])
    assert r.turn("and?").content == "next"


def test_a_compaction_between_a_read_and_its_answer_never_makes_the_frame_the_answer(
        rig: Make) -> None:
    """Compaction inside a turn, after its third read and before the answer, cutting the
    turn between two responses (the first two reads go): the request still holds the
    question. A model that answers the last thing the person said (as the small one did)
    answered the summary's frame, which was that last thing; now it is the question."""
    big = ("result " * 170).strip()  # ~300 of the fake's tokens
    reads: list[int] = []

    def script(body: dict[str, Any]) -> Reply:
        sent = body["messages"]
        if (sent[-1]["role"] == "tool" and len(reads) < 3) or "long ones" in sent[-1]["content"]:
            reads.append(1)
            return answer(tool_calls=[("call_tool", json.dumps(
                {"name": "echo", "arguments": {"text": f"part {len(reads)}"}}))])
        if sent[-1]["role"] == "user":
            return answer("noted")
        said = [m["content"] for m in sent if m["role"] == "user"]
        return answer(f"You said: {said[-1][:60]}")  # the last thing the person said

    port = ScriptedPort(lambda tool, args: wire.Result(
        id=0, content=big, class_=ResultClass.PUBLIC, untrusted=False))
    r = compacting(rig(script, Registry([port]), props={"n_ctx": 1000}), compaction="elide")
    for n in range(3):
        r.turn(f"question {n}{LONG}")
    outcome = r.turn("read the long ones")
    assert len(reads) == 3 and any(isinstance(x, Compaction) for x in r.records)
    frame = SUMMARY_FRAME.split("{")[0][:40]
    assert frame not in outcome.content, outcome.content
    assert outcome.content == "You said: read the long ones", outcome.content
    last = r.fake.requests[-1]["messages"]
    assert last[1]["content"].startswith(frame) and str(last).count(big) == 1


def test_a_follow_up_that_compacts_keeps_the_file_the_turn_before_read(rig: Make) -> None:
    """A read, then a follow-up past the threshold: the read turn is more than the kept
    turns' budget (half the room), but it fits the room, so it stays verbatim; the
    follow-up was answered from nothing ("Python 3.6 or later"; the file said >=3.10)."""
    big = "requires-python = '>=3.10' " + ("x " * 640)  # ~340 of the fake's tokens
    replies: list[Reply] = [answer("noted"), answer("noted"), answer(tool_calls=[ECHO]),
                            answer("It needs Python 3.10."), answer("3.10")]
    port = ScriptedPort(lambda tool, args: wire.Result(
        id=0, content=big, class_=ResultClass.PUBLIC, untrusted=False))
    r = compacting(rig(replies, Registry([port]), props={"n_ctx": 1000}), compaction="elide")
    for n in range(2):
        r.turn(f"question {n}{LONG}")
    r.turn("Read pyproject.toml.")
    assert not any(isinstance(x, Compaction) for x in r.records)
    r.turn("Which Python does it need?")
    assert sum(isinstance(x, Compaction) for x in r.records) == 1
    sent = str(r.fake.requests[-1]["messages"])
    assert "requires-python" in sent
    assert not any(str(m["content"]).startswith("question")
               for m in r.fake.requests[-1]["messages"])


@pytest.mark.parametrize("said, kept", [
    ("The person asked: What is this project for?", "What is this project for?"),
    ("You asked it first. [loopd: the earlier part of this conversation no longer fits the "
     "context, so it was summarised. The summary:]\n\nThe person asked: question 0 more",
     "You asked it first. \n\nquestion 0 more"),
])
def test_a_compactions_wording_never_reaches_an_answer(rig: Make, said: str, kept: str) -> None:
    """The elided summary's line copied as the answer ("The person asked: What is this
    project for?" to "What was the first question I asked you?"): the wording is taken out
    of the stream, the answer and the log; the person's content stays."""
    r = compacting(rig([*[answer("noted")] * 6, answer(said, chunk=3)], props={"n_ctx": 1000}),
                   compaction="elide")
    for n in range(6):
        r.turn(f"question {n}{LONG}")
    assert any(isinstance(x, Compaction) for x in r.records)
    before = len(r.events)
    out = r.turn("What was the first question I asked you?")
    assert out.content == kept
    assert "".join(e.text for e in r.events[before:] if isinstance(e, Content)) == kept
    (*_, last, usage) = r.records
    assert isinstance(last, Assistant) and last.content == kept and isinstance(usage, Usage)
    assert frame_piece(out.content) is None


def test_an_answer_before_any_compaction_keeps_loopds_words(rig: Make) -> None:
    r = rig([answer("The person asked: no longer fits the context.")])
    assert r.turn("Quote it.").content == "The person asked: no longer fits the context."



def test_a_read_that_passes_the_threshold_is_answered_before_the_next_message_compacts(
        rig: Make) -> None:
    """compact_at 0.4 (the embedded default) of 4,000 tokens (1,600; the baseline and three
    turns of the read's size are less): a read takes the turn past it, far under the
    context. The answer is asked on the conversation as it was, with no compaction between
    the result and its answer (re-rendered around the result, the small model answered the
    result's first line, "The website launch moves to 14 June." for "Who will fix the login
    bug?", twice in the eval's long chat); the next message compacts at its start."""
    big = "Tom will fix the login bug. " + ("minutes " * 120)  # ~250 of the fake's tokens
    port = ScriptedPort(lambda tool, args: wire.Result(
        id=0, content=big, class_=ResultClass.PUBLIC, untrusted=False))

    def script(body: dict[str, Any]) -> Reply:
        sent = body["messages"]
        if sent[-1]["role"] == "user" and sent[-1]["content"].startswith("Who"):
            return answer(tool_calls=[ECHO])
        return answer("Tom." if big in str(sent[-1]["content"]) else "noted")

    r = compacting(rig(script, Registry([port]), props={"n_ctx": 4000}), compaction="elide",
                   compact_at=0.4)
    for n in range(5):
        r.turn(f"question {n}{LONG}{LONG}")
    r.turn(f"question 5{LONG}")
    assert not any(isinstance(x, Compaction) for x in r.records)
    assert r.turn("Who will fix the login bug?").content == "Tom."
    kinds = [type(x).__name__ for x in r.records]
    assert "Compaction" not in kinds, kinds  # not between the result and its answer
    asked = r.fake.requests[-1]["messages"]  # the whole conversation, no frame
    assert asked[1]["content"] == f"question 0{LONG}{LONG}" and big in str(asked[-1])
    r.turn("And the budget?")
    (compaction,) = [x for x in r.records if isinstance(x, Compaction)]
    assert compaction.tokens_before > 1600  # it was past the threshold
    assert isinstance(r.records[r.records.index(compaction) + 1], User)  # before its question
