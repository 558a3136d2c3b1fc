"""A compaction SIGKILLed between its summary and its record, and right after the record:
the log reopens with nothing lost, and the next turn works (compacting again when the
conversation still needs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.log.file import SessionLog, read_records
from actors.log.records import Assistant, Compaction, CompactionBy, User
from actors.tools.registry import Registry
from tests.faults.compact_child import POINTS, SUMMARY
from tests.faults.killpoint import kill_at
from tests.support.fake_llama import answer
from tests.support.turn_rig import Rig, ScriptedPort, baseline

LONG = " more" * 80  # 100 of the fake's tokens


@pytest.mark.parametrize("point", POINTS)
def test_a_compaction_killed_loses_nothing_and_the_next_turn_works(
        tmp_path: Path, point: str) -> None:
    path = tmp_path / "sessions" / "s" / "log.bin"
    log, _ = SessionLog.open(path, baseline=baseline(), name="s")
    with log:  # five turns of 100 tokens and more: past 0.8 of 1,000 with a sixth
        for n in range(5):
            log.append(User(content=f"question {n}{LONG}"),
                       Assistant(content=f"answer {n}", reasoning=None))
    before = path.read_bytes()
    kill_at("tests.faults.compact_child", tmp_path, point)
    after = path.read_bytes()
    assert after.startswith(before)  # nothing lost
    compactions = [r for r in read_records(path) if isinstance(r, Compaction)]
    if point == "summary":
        assert after == before and compactions == []  # only the summary was lost
    else:
        (made,) = compactions
        assert made.by is CompactionBy.PERSON and made.summary == SUMMARY
    rig = Rig(tmp_path, lambda body: answer("fine"), Registry([ScriptedPort()]),
              props={"n_ctx": 1000})
    try:
        rig.config = rig.config.replace("session", compaction="elide")
        rig.runtime = type(rig.runtime)(config=rig.config, inference=rig.inference,
                                        registry=rig.runtime.registry)
        assert rig.turn(f"question 5{LONG}").content == "fine"
        assert path.read_bytes().startswith(after)  # the log only grew
        now = [r for r in rig.records if isinstance(r, Compaction)]
        # killed before the record: the turn compacts (the conversation still needs it);
        # killed after it: it goes on from the person's compaction
        assert [c.by for c in now] == ([CompactionBy.AUTO] if point == "summary"
                                       else [CompactionBy.PERSON])
        sent = rig.fake.requests[-1]["messages"]
        assert sent[1]["content"].startswith("[loopd: the earlier part")
        assert sent[-1]["content"] == f"question 5{LONG}"
    finally:
        rig.close()
