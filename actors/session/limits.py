"""The pure parts of a turn: result capping, cache loss, repeat detection, answer texts, the
passages the runaway watch's echo follows."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from actors.base.textcut import cut
from actors.inference.runaway import Watcher, pieces, unnumbered
from actors.inference.types import BaselineUse
from actors.log.records import (
    Assistant,
    CacheLoss,
    Compaction,
    Record,
    SlotState,
    SlotUse,
    ToolResult,
    Usage,
    User,
)
from actors.session.messages import View, view
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass
from actors.wire.fieldchecks import parse_json

__all__ = [
    "ASKED_AGAIN",
    "DENIED",
    "FAILED",
    "REPEAT_NOTICE",
    "TOO_MANY_CALLS",
    "Answered",
    "Repeats",
    "answer_text",
    "baseline_outcome",
    "cache_outcome",
    "call_key",
    "cap_result",
    "loss_cause",
    "passages",
    "result_failed",
    "shown_tokens",
    "shown_usage",
]

BASELINE_SLACK = 8  # tokens of the template's marks a first request may not reuse

REPEAT_NOTICE = (
    "Not run: this exact call ({name} with these arguments) was already made in this turn. "
    "Use its earlier result, or change the arguments."
)
TOO_MANY_CALLS = (
    "the model asked for {count} tool calls in one response "
    "(loop.max_calls_per_response = {cap}); none of them ran and the response was not kept"
)
DENIED = "The call was denied: "  # how a denied call's result starts
FAILED = "The tool failed: "  # how a failed call's result starts
ASKED_AGAIN = (
    FAILED + "its host asked for approval again ({prompt}) after the call was approved, so it "
    "did not run."
)


@dataclasses.dataclass(frozen=True, slots=True)
class Answered:
    """What a call's answer becomes in the log (a ToolResult) and the events."""

    text: str
    class_: ResultClass = ResultClass.PUBLIC
    untrusted: bool = False
    outcome: str = "result"  # result, denied, failed, local or repeat (ToolResultEvent)


def answer_text(answer: wire.Answer) -> Answered:
    """What a host's answer becomes in the log: text, class, untrusted, and its outcome name."""
    if isinstance(answer, wire.Result):
        return Answered(answer.content, answer.class_, answer.untrusted)
    if isinstance(answer, wire.Denied):
        return Answered(f"{DENIED}{answer.reason}", outcome="denied")
    if isinstance(answer, wire.PendingApproval):
        # Only after approval (actors.approval.gate answers the first PendingApproval): a host bug.
        return Answered(ASKED_AGAIN.format(prompt=answer.prompt), outcome="failed")
    return Answered(f"{FAILED}{answer.message}", outcome="failed")


def result_failed(content: str) -> bool:
    """Whether a logged result says the call did not run (denied) or failed."""
    return content.startswith((DENIED, FAILED))


def cap_result(text: str, cap: int) -> tuple[str, bool]:
    """``text`` cut to at most ``cap`` characters (never inside one), with a note of the cut.

    A cap too small for the note keeps just the text (the record's ``truncated`` says so).
    """
    if len(text) <= cap:
        return text, False
    note = f"\n[loopd: result cut to {{kept}} of {len(text)} characters]"
    room = cap - len(note.format(kept=cap))
    if room < 1:
        return cut(text, cap, "chars")[0], True
    kept, size, _ = cut(text, room, "chars")
    return kept + note.format(kept=size), True


def cache_outcome(
    previous: Mapping[str, Any] | None, new: Mapping[str, Any], slot: SlotUse | None = None,
    baseline: BaselineUse | None = None,
) -> CacheLoss | None:
    """A CacheLoss when the new request reused fewer tokens than the previous prompt held;
    its cause from what the slot keeper did for the request (``slot``). A session's first
    request (no ``previous``) expects the baseline the keeper gave its slot."""
    if not previous:
        return baseline_outcome(new, slot, baseline)
    if "cache_n" not in new:
        return None
    expected = int(previous.get("cache_n", 0)) + int(previous.get("prompt_n", 0))
    got = int(new["cache_n"])
    if got >= expected:
        return None
    return CacheLoss(expected=expected, got=got, cause=loss_cause(slot, baseline))


def baseline_outcome(new: Mapping[str, Any], slot: SlotUse | None,
                     baseline: BaselineUse | None) -> CacheLoss | None:
    """A CacheLoss for a request that started without its session's state, when the
    baseline's saved state could not be restored (its cause), or when the server reused
    fewer of the baseline's tokens than the slot held, less the template's few marks."""
    if baseline is None or not baseline.tokens:
        return None
    if baseline.loss:
        return CacheLoss(expected=baseline.tokens, got=0, cause=baseline.loss)
    if "cache_n" not in new:
        return None
    got = int(new["cache_n"])
    if got + BASELINE_SLACK >= baseline.tokens:
        return None
    why = slot.reason if slot is not None else ""
    return CacheLoss(expected=baseline.tokens, got=got,
                     cause="; ".join(r for r in (why, "the server did not keep its tokens") if r))


def shown_usage(records: Sequence[Record], shown: View | None = None) -> Usage | None:
    """The Usage of the last request whose prompt the next one extends: the last one the
    rendering still shows (a rewind hides those of the turns it took back; their state is
    longer than the next prompt, so the server keeps the common part). None when that
    request was of another epoch than the next one (the first request after a compaction,
    or a rewind past one: the slot holds another epoch, and only the baseline's prefix is
    common). ``shown``: the view of ``records`` when the caller has it (a view of them and
    one User record more, not logged yet, gives the same answer)."""
    shown = view(records) if shown is None else shown
    live = set(shown.live)
    last = next((i for i in range(len(records) - 1, 0, -1) if isinstance(records[i], Usage)),
                None)
    if last is None:
        return None
    if last not in live and view(records[:last]).epoch != shown.epoch:
        return None
    found = next((i for i in reversed(shown.live) if isinstance(records[i], Usage)), None)
    if found is None or found < shown.epoch:  # asked before the compaction in effect
        return None
    usage = records[found]
    return usage if isinstance(usage, Usage) else None


def shown_tokens(records: Sequence[Record]) -> int:
    """How full the conversation's prompt is now, in tokens (0: not known): the last shown
    request's prompt and answer, or, when a compaction came after it, that compaction's
    estimate of the prompt after it (``loopd sessions`` right after ``loopd compact``)."""
    shown = view(records)
    usage = shown_usage(records, shown)
    if usage is not None:
        return usage.prompt_tokens + usage.completion_tokens
    compaction = records[shown.epoch] if shown.epoch else None
    return compaction.tokens_after if isinstance(compaction, Compaction) else 0


def loss_cause(slot: SlotUse | None, baseline: BaselineUse | None = None) -> str:
    """Why the cache was short, as far as the keeper's record of the request tells."""
    if slot is None:
        return ""
    if slot.state is SlotState.RESTORED and baseline is not None:  # the baseline stood in
        return slot.reason
    if slot.state is SlotState.RESTORED:
        took = f"the restore of {slot.restored} tokens did not take"
        return f"{slot.reason}; {took}" if slot.reason else took
    if slot.state is SlotState.KEPT:
        return "the server dropped the slot's cache"
    return slot.reason or "nothing to restore"


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """What makes two calls the same: the name and the arguments, key order ignored."""
    try:
        return name, json.dumps(parse_json(arguments), sort_keys=True)
    except ValueError:
        return name, arguments.strip()


class Repeats:
    """Counts identical calls, ``(name, arguments)`` with the JSON normalised, in one turn."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], int] = {}

    def seen(self, name: str, arguments: str) -> int:
        """How many times this call was made before in this turn (and count this one)."""
        key = call_key(name, arguments)
        count = self._seen.get(key, 0)
        self._seen[key] = count + 1
        return count


def passages(records: Sequence[Record], question: str, limit: int) -> tuple[str, ...]:
    """The earlier answers, to questions other than ``question``, that copied at least
    ``limit`` pieces of their own turn's tool results word for word (a file's lines read
    with their numbers count as the lines the model copies without them): what the runaway
    watch's echo follows (``loop.runaway_echo_tokens``). An answer in the model's own words
    is not one (the same facts told again to another question about the same file are a
    right answer), nor an answer to the same question asked again."""
    if not limit:
        return ()
    asked, current = _question_key(question), ""
    found: list[str] = []
    results: list[str] = []
    for record in records:
        if isinstance(record, User):
            current, results = record.content, []
        elif isinstance(record, ToolResult):
            results.append(record.content)
        elif (isinstance(record, Assistant) and record.content and not record.tool_calls
              and results and _question_key(current) != asked
              and _copied(record.content, tuple(results), limit)):
            found.append(record.content)
    return tuple(found)


@functools.lru_cache(maxsize=256)
def _copied(answer: str, results: tuple[str, ...], limit: int) -> bool:
    """Whether ``answer`` copied at least ``limit`` pieces of ``results`` word for word.
    Kept: every turn asks it again of each earlier answer, whose verdict never changes (the
    strings are the log's own, so their hashes are computed once)."""
    if len(pieces(answer)) < limit:
        return False
    watch = Watcher([{"content": unnumbered("\n".join(results))}], 0, limit, lazy=0)
    return watch.feed(answer + "\n") is not None


def _question_key(question: str) -> str:
    return " ".join(question.lower().split()).rstrip("?.! ")
