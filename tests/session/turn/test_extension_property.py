"""The property loopd exists for, over generated conversations.

A scripted model answers with random mixes of text, reasoning and tool calls (some
repeated, some malformed), tools answer with random results, failures, denials and
approval requests, and random limits are hit (tool iterations, repeats, thinking cap,
result size, a full context, a failing server). Through all of it:

- every request the session sends starts with exactly the messages (and the tools) of the
  request before it, so llama-server can reuse its prompt cache; restated by epochs, since
  a small random context makes the session compact (before a request past
  session.compact_at, and after the server's "exceeds the context"): within an epoch (no
  Compaction record appended since the request before) each request extends the one
  before, and the first request of an epoch extends the baseline's prefix (the system
  prompt and the tools);
- a turn refused for a full context once its message is logged is taken back (a Rewind):
  the requests after it extend the last request before that turn (within its epoch, else
  the baseline's prefix), never one of the refused turn's;
- the log only grows: its bytes after turn N start with its bytes after turn N-1.

The seed is printed in pytest's header (tests/conftest.py); CI runs 200 examples.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from actors.base.errors import LoopdError
from actors.log.records import Rewind
from actors.session.messages import view
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass
from actors.tools.registry import Registry
from tests.support.fake_llama import Reply, answer, context_full, http_error
from tests.support.turn_rig import Rig, ScriptedPort

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
maybe_text = st.none() | text
word = st.sampled_from(["a", "b", "read", "files", "échec", "😀"])


@st.composite
def tool_call(draw: st.DrawFn) -> tuple[str, str]:
    kind = draw(st.sampled_from(["find", "echo", "echo", "malformed", "unknown"]))
    if kind == "find":
        return "find_tool", json.dumps({"query": draw(word)})
    if kind == "echo":  # few distinct arguments, so repeats happen
        args = {"name": "echo", "arguments": {"text": draw(word)}}
        return "call_tool", json.dumps(args, ensure_ascii=draw(st.booleans()))
    if kind == "unknown":
        return "call_tool", json.dumps({"name": draw(word), "arguments": {}})
    return "call_tool", draw(st.sampled_from(['{"name": "echo", "argu', "[]", "", "nul"]))


@st.composite
def model_reply(draw: st.DrawFn) -> dict[str, Any]:
    """What the scripted model does next; made into a Reply in the test (no randomness here)."""
    kind = draw(st.sampled_from(["answer"] * 8 + ["context_full", "server_error"]))
    if kind != "answer":
        return {"kind": kind}
    return {
        "kind": kind,
        "content": draw(maybe_text),
        "reasoning": draw(maybe_text),
        "tool_calls": draw(st.lists(tool_call(), max_size=3)),
        "finish_reason": draw(st.sampled_from([None, None, None, "length"])),
        "chunk": draw(st.integers(1, 8)),
    }


def _reply(spec: dict[str, Any]) -> Reply:
    kind = spec.pop("kind")
    if kind == "context_full":
        return context_full()
    if kind == "server_error":
        return http_error(500, {"error": {"code": 500, "message": "boom", "type": "server_error"}})
    return answer(**spec)


tool_answer = st.one_of(
    st.builds(lambda c, k, u: wire.Result(id=0, content=c, class_=k, untrusted=u),
              text, st.sampled_from(list(ResultClass)), st.booleans()),
    st.builds(lambda m: wire.Failed(id=0, message=m), text),
    st.builds(lambda r: wire.Denied(id=0, reason=r), text),
    st.builds(lambda p: wire.PendingApproval(id=0, prompt=p), text),
)


def _extends(before: dict[str, Any], after: dict[str, Any], *, new_epoch: bool) -> bool:
    old, new = before["messages"], after["messages"]
    prefix = old[:1] if new_epoch else old  # a new epoch: the baseline's system prompt
    return new[: len(prefix)] == prefix and before.get("tools") == after.get("tools")


def _ask_each_text_once(rig: Rig) -> None:
    """The fake's ``/tokenize`` count is a function of the text, so a text is asked over HTTP
    once per example and its count remembered: each turn's renderer asks again for the texts
    it shares with the turns before (the system prompt, the tools, the older messages), about
    half of the requests (4,556 -> 2,001 with seed 1). Every count the compactor sees is still
    the server's answer, the same as before."""
    ask, counted = rig.inference.tokens, {}

    def tokens(session: str, text: str) -> int:
        if text not in counted:
            counted[text] = ask(session, text)
        return counted[text]

    rig.inference.tokens = tokens  # type: ignore[method-assign]


@given(
    replies=st.lists(model_reply(), max_size=14),
    answers=st.lists(tool_answer, min_size=1, max_size=6),
    turns=st.lists(st.builds(lambda t, n: t + " more" * n, text, st.sampled_from([0, 20, 50, 80])),
                   min_size=1, max_size=5),
    limits=st.fixed_dictionaries({
        "tool_iterations": st.integers(1, 3),
        "repeat_detection": st.booleans(),
        "thinking_cap": st.integers(0, 12),
        "tool_result_cap": st.integers(1, 60),
    }),
    compacting=st.fixed_dictionaries({
        "compaction": st.sampled_from(["summary", "elide"]),
        "compact_at": st.sampled_from([0.5, 0.8, 1.0]),
        "compact_keep": st.sampled_from([0.0, 0.1, 0.25]),
        "summary_tokens": st.integers(16, 80),
    }),
    n_ctx=st.sampled_from([300, 400, 600, 900]),  # the baseline: about 200 of the fake's tokens
)
def test_every_request_extends_the_last_within_an_epoch_and_the_log_only_grows(
    tmp_path_factory: Any,
    replies: list[dict[str, Any]],
    answers: list[wire.Answer],
    turns: list[str],
    limits: dict[str, Any],
    compacting: dict[str, Any],
    n_ctx: int,
) -> None:
    queue = [_reply(dict(r)) for r in replies]
    served = iter(range(10**6))
    port = ScriptedPort(lambda tool, args: answers[next(served) % len(answers)])
    tmp: Path = tmp_path_factory.mktemp("prop")
    asked: list[tuple[int, int]] = []  # per request: its turn, the epoch it renders
    turn = 0

    def script(body: dict[str, Any]) -> Reply:
        asked.append((turn, view(rig.log.records).epoch))
        return queue.pop(0) if queue else answer("done")

    rig = Rig(tmp, script, Registry([port]), props={"n_ctx": n_ctx}, **limits)
    rig.config = rig.config.replace("inference", retries=0).replace("session", **compacting)
    rig.runtime = type(rig.runtime)(config=rig.config, inference=rig.inference,
                                    registry=rig.runtime.registry)
    _ask_each_text_once(rig)
    try:
        logs, taken = [rig.path.read_bytes()], set()
        for turn, content in enumerate(turns):  # script() reads turn
            rewinds = sum(isinstance(r, Rewind) for r in rig.log.records)
            # a limit or a failure: the log must stay an extension all the same
            with contextlib.suppress(LoopdError):
                rig.turn(content)
            if sum(isinstance(r, Rewind) for r in rig.log.records) > rewinds:
                taken.add(turn)  # refused for a full context: taken back
                event("a turn taken back")
            logs.append(rig.path.read_bytes())
        for before, after in itertools.pairwise(logs):
            assert after.startswith(before), "the log changed bytes it already had"
        sent = rig.fake.requests
        for i in range(1, len(sent)):
            now = asked[i][0]
            # the last request before this one that the conversation still shows
            base = max((j for j in range(i) if asked[j][0] == now or asked[j][0] not in taken),
                       default=None)
            if base is None:
                continue
            new_epoch = asked[base][1] != asked[i][1]
            assert _extends(sent[base], sent[i], new_epoch=new_epoch), (
                f"request {i} does not extend {'the baseline of ' if new_epoch else ''}"
                f"request {base}")
    finally:
        rig.close()
