"""A log written before the one codec (by loopd at ee2b571) still opens, record for record,
and today's encoding of the same records is the same bytes: the log's format did not move.

``fixtures/before-one-codec/log.bin`` was written by ``SessionLog`` at ee2b571 from the
records below and is never rewritten: a change to the codec that changes a byte on disk
fails here.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

from actors.log import records
from actors.log.file import HEADER, SessionLog, frame, read_records
from actors.log.records import (
    Approval,
    ApprovalDecision,
    ApprovalScope,
    Assistant,
    Baseline,
    CacheLoss,
    Record,
    SlotState,
    SlotUse,
    ToolCall,
    ToolResult,
    Usage,
    User,
)
from actors.tools.protocol.spec import ResultClass

FIXTURE = Path(__file__).parent / "fixtures" / "before-one-codec" / "log.bin"
T = dt.datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=dt.UTC)
TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
            },
        },
    },
)  # fmt: skip
# fmt: off
RECORDS: list[Record] = [
    Baseline(system="You are helpful. ✓", tools=TOOLS, model="qwen3-4b", created=T, time=T),
    User(content="what is in notes.txt? 日本語", time=T),
    Assistant(
        content=None, reasoning="look at the file",
        tool_calls=(
            ToolCall(id="c1", name="read_file", arguments='{"path": "notes.txt"}'),
            ToolCall(id="c2", name="call_tool", arguments='{"name": "x", "arguments": {}}'),
        ),
        time=T,
    ),
    Usage(
        timings={"cache_n": 12, "prompt_n": 30, "prompt_ms": 3.5, "predicted_per_second": 41.25},
        reasoning_tokens=7, thinking_capped=False, prompt_tokens=42, completion_tokens=19,
        finish_reason="tool_calls",
        slot=SlotUse(server="http://127.0.0.1:8080", slot=2, state=SlotState.RESTORED,
                     restored=4646, restore_ms=20.5, reason=""),
        time=T,
    ),
    Approval(
        call=1, tool="read_file", decision=ApprovalDecision.ALLOW, scope=ApprovalScope.SESSION,
        by="person", reason="", rule="read_file: notes.txt", time=T,
    ),
    ToolResult(
        call=1, tool_call_id="c1", content="hello\nworld", class_=ResultClass.PUBLIC,
        untrusted=False, truncated=False, time=T,
    ),
    Approval(
        call=2, tool="x", decision=ApprovalDecision.DENY, scope=ApprovalScope.ONCE, by="timeout",
        reason="no answer in 300 s", rule="", time=T,
    ),
    ToolResult(
        call=2, tool_call_id="c2", content="denied", class_=ResultClass.SECRET, untrusted=True,
        truncated=True, time=T,
    ),
    CacheLoss(expected=4646, got=0, cause="no saved state", time=T),
    Usage(
        timings={}, reasoning_tokens=0, thinking_capped=True, prompt_tokens=2**40,
        completion_tokens=0, finish_reason="length", slot=None, time=T,
    ),
    Usage(
        timings={"t": 1}, reasoning_tokens=0, thinking_capped=False, prompt_tokens=1,
        completion_tokens=1, finish_reason="stop",
        slot=SlotUse(server="u", slot=0, state=SlotState.NONE, reason="restore failed"), time=T,
    ),
    Usage(
        timings={}, reasoning_tokens=0, thinking_capped=False, prompt_tokens=1,
        completion_tokens=1, finish_reason="stop",
        slot=SlotUse(server="u", slot=1, state=SlotState.KEPT),
        time=dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    ),
    Assistant(
        content="", reasoning=None, tool_calls=(),
        time=dt.datetime(2199, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
    ),
    Approval(
        call=3, tool="run_command", decision=ApprovalDecision.ALLOW,
        scope=ApprovalScope.ALWAYS, by="rule", reason="", rule="run_command: git status", time=T,
    ),
    ToolResult(
        call=3, tool_call_id="c3", content="", class_=ResultClass.INTERNAL, untrusted=False,
        truncated=False, time=T,
    ),
    User(content="", time=T),
    Assistant(content="The file says hello world.", reasoning="", tool_calls=(), time=T),
]
# fmt: on


def test_a_log_written_before_the_one_codec_opens_record_for_record(tmp_path: Path) -> None:
    path = tmp_path / "old" / "log.bin"
    path.parent.mkdir()
    shutil.copyfile(FIXTURE, path)
    log, report = SessionLog.open(path)
    with log:
        assert (report.records, report.cut_bytes, report.created) == (len(RECORDS), 0, False)
        assert list(log.records) == RECORDS
        assert log.next_call() == 4  # the calls it holds are counted as before
    assert path.read_bytes() == FIXTURE.read_bytes()  # opening changed nothing
    assert list(read_records(FIXTURE)) == RECORDS


def test_todays_encoding_of_the_same_records_is_the_same_bytes() -> None:
    assert HEADER + b"".join(frame(r) for r in RECORDS) == FIXTURE.read_bytes()


def test_the_records_keep_their_kinds_and_types() -> None:
    """Equality alone would pass an enum read back as its text: the types are the same too."""
    for old, new in zip(RECORDS, read_records(FIXTURE), strict=True):
        assert type(new) is type(old)
        for name in old.__dataclass_fields__:
            assert type(getattr(new, name)) is type(getattr(old, name)), name


def test_the_fields_added_later_are_the_documented_ones() -> None:
    """Each reads as its default in an older log (tests/log/test_records.py shows it)."""
    assert [(kind, field, default) for kind, field, default, _ in records.CODEC.added()] == [
        ("usage", "slot", None), ("cache_loss", "cause", ""), ("compaction", "outside", False),
        ("compaction", "tokens_after", 0), ("rewind", "refused", ""),
    ]
    doc = " ".join((records.__doc__ or "").split())
    assert '``usage.slot`` (nil) and ``cache_loss.cause`` ("")' in doc
    assert '``rewind.refused`` ("")' in doc
    assert "``compaction.outside`` (false)" in doc
    assert "``compaction.tokens_after`` (0: not known)" in doc
