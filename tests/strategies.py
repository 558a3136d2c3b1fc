"""Hypothesis strategies for log records and conversations, shared by the test modules.

``records()`` draws any single record with every field varied; ``conversations()`` draws a
Baseline plus a record sequence in which tool results mostly answer earlier tool calls
(some calls stay unanswered, some results are orphans) and Approval records come before a
call's result or stand for a call that never ran (denied, cancelled, a crash while
waiting), the shapes a real session and a broken one produce.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from typing import Any

from hypothesis import strategies as st

from actors.log.records import (
    AgentLink,
    Approval,
    ApprovalDecision,
    ApprovalScope,
    Assistant,
    Baseline,
    CacheLoss,
    Compaction,
    CompactionBy,
    Forked,
    Record,
    Rewind,
    SlotState,
    SlotUse,
    ToolCall,
    ToolResult,
    Usage,
    User,
)
from actors.tools.protocol.spec import ResultClass

__all__ = [
    "agent_links",
    "approvals",
    "assistants",
    "baselines",
    "cache_losses",
    "compactions",
    "conversations",
    "epoch_records",
    "forks",
    "json_values",
    "records",
    "rewinds",
    "texts",
    "times",
    "tool_calls",
    "tool_results",
    "usages",
    "users",
]

# Any unicode text msgpack can carry (hypothesis excludes lone surrogates by default).
texts = st.text(max_size=40)
ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
counts = st.integers(min_value=0, max_value=2**31)
times = st.datetimes(
    min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(dt.UTC)
)

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | ints64 | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(texts, json_values, max_size=5)

tool_definitions = st.builds(
    lambda name, desc, props: {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props},
        },
    },
    texts,
    texts,
    json_objects,
)

baselines = st.builds(
    Baseline,
    system=texts,
    tools=st.lists(tool_definitions | json_objects, max_size=3).map(tuple),
    model=texts,
    created=times,
    time=times,
)
users = st.builds(User, content=texts, time=times)
tool_calls = st.builds(ToolCall, id=texts, name=texts, arguments=texts)
assistants = st.builds(
    Assistant,
    content=st.none() | texts,
    reasoning=st.none() | texts,
    tool_calls=st.lists(tool_calls, max_size=3).map(tuple),
    time=times,
)
slot_uses = st.builds(
    SlotUse, server=texts, slot=counts, state=st.sampled_from(SlotState), restored=counts,
    restore_ms=st.floats(allow_nan=False, allow_infinity=False), reason=texts,
)
# What actors.log.server_values keeps of a server's timings (and a log's, read back).
timings = st.dictionaries(
    st.text(max_size=64),
    counts | st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    max_size=8,
)
usages = st.builds(
    Usage,
    slot=st.none() | slot_uses,
    timings=timings,
    reasoning_tokens=counts,
    thinking_capped=st.booleans(),
    prompt_tokens=counts,
    completion_tokens=counts,
    finish_reason=texts,
    time=times,
)
cache_losses = st.builds(CacheLoss, expected=counts, got=counts, cause=texts, time=times)
tool_results = st.builds(
    ToolResult,
    call=st.integers(min_value=1, max_value=2**31),
    tool_call_id=texts,
    content=texts,
    class_=st.sampled_from(ResultClass),
    untrusted=st.booleans(),
    truncated=st.booleans(),
    time=times,
)
approvals = st.builds(
    Approval,
    call=st.integers(min_value=1, max_value=2**31),
    tool=texts,
    decision=st.sampled_from(ApprovalDecision),
    scope=st.sampled_from(ApprovalScope),
    by=st.sampled_from(["person", "rule", "session", "timeout", "cancel"]) | texts,
    reason=texts,
    rule=texts,
    time=times,
)
compactions = st.builds(
    Compaction, summary=texts, kept=counts, tokens_before=counts,
    by=st.sampled_from(CompactionBy), time=times,
)
forks = st.builds(Forked, from_=texts, at=counts, time=times)
agent_links = st.builds(AgentLink, parent=texts, child=texts, task=texts,
                        context=st.sampled_from(["fresh", "fork"]), time=times)
rewinds = st.builds(Rewind, to_turn=counts, time=times)
# Every kind but Compaction and Rewind: records that never change what an earlier request
# sent.
epoch_records: st.SearchStrategy[Record] = st.one_of(
    baselines, users, assistants, usages, cache_losses, tool_results, approvals, forks,
    agent_links,
)
records: st.SearchStrategy[Record] = epoch_records | compactions | rewinds


# The fixed parts of a conversation, made once: a strategy made inside ``conversations`` at
# each draw was validated again at each draw (a third of the property tests' time). The
# draws, and so the examples of a seed, are the same.
_ids = st.sampled_from(["call_0", "call_1", "call_2", "c", ""]) | texts
_assistants_with_ids = st.builds(
    Assistant,
    content=st.none() | texts,
    reasoning=st.none() | texts,
    tool_calls=st.lists(st.builds(ToolCall, id=_ids, name=texts, arguments=texts),
                        max_size=3).map(tuple),
    time=times,
)
_refusals = st.just("") | texts
_others = usages | cache_losses | baselines


@functools.cache
def _kinds(compacting: bool, rewinding: bool) -> st.SearchStrategy[str]:
    kinds = ["user", "assistant", "result", "result", "approval", "other"]
    kinds += ["compaction"] if compacting else []
    kinds += ["rewind", "rewind", "forked"] if rewinding else []
    return st.sampled_from(kinds)


@functools.cache
def _steps(max_steps: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=max_steps)


@st.composite
def conversations(
    draw: st.DrawFn, max_steps: int = 25, compacting: bool = False, rewinding: bool = False
) -> tuple[Baseline, list[Record]]:
    """A baseline and the records after it, tool results referring to earlier calls' ids.

    The ids come from a small alphabet so that duplicates and collisions happen; results
    may answer a call, answer nothing (an orphan), or never come (a call stopped by a limit).
    With ``compacting``, Compaction records too (``kept`` an index of the list with the
    baseline at 0, at most the compaction's own: a turn start, any record, or past all).
    With ``rewinding``, Rewind records too (``to_turn`` a turn asked so far, or one past
    them) and a Forked note now and then.
    """
    baseline = draw(baselines)
    out: list[Record] = []
    seen: list[str] = []
    number = 0
    kinds = _kinds(compacting, rewinding)
    for _ in range(draw(_steps(max_steps))):
        choice = draw(kinds)
        if choice == "rewind":
            asked = sum(1 for r in out if isinstance(r, User))
            out.append(Rewind(to_turn=draw(st.integers(0, asked + 1)),
                              refused=draw(_refusals), time=draw(times)))
        elif choice == "forked":
            out.append(draw(forks))
        elif choice == "compaction":
            here = len(out) + 1  # its index, the baseline being 0
            starts = [i + 1 for i, r in enumerate(out) if isinstance(r, User)] or [here]
            kept = draw(st.sampled_from(starts) | st.integers(min_value=1, max_value=here))
            out.append(dataclasses.replace(draw(compactions), kept=kept))
        elif choice == "user":
            out.append(draw(users))
        elif choice == "assistant":
            a = draw(_assistants_with_ids)
            seen.extend(c.id for c in a.tool_calls)
            out.append(a)
        elif choice == "approval":  # before the call's result, or its call never ran
            approval = draw(approvals)
            out.append(dataclasses.replace(approval, call=number + 1))
        elif choice == "result":
            number += 1
            target = draw(st.sampled_from(seen) if seen else _ids)
            result = draw(tool_results)
            out.append(
                ToolResult(
                    call=number,
                    tool_call_id=target,
                    content=result.content,
                    class_=result.class_,
                    untrusted=result.untrusted,
                    truncated=result.truncated,
                    time=result.time,
                )
            )
        else:
            out.append(draw(_others))
    return baseline, out
