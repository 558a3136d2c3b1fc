"""``loopd compact SESSION`` in this process (no daemon): a Compaction record by the person,
the model's summary asked on the warm slot, and the conversation goes on from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.cli.main import main
from actors.log.file import read_records
from actors.log.records import Compaction, CompactionBy
from actors.session.messages import SUMMARY_FRAME
from tests.support.fake_llama import FakeLlama, answer


def test_loopd_compact_summarises_and_the_next_turn_goes_on(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'[log]\ndir = "{tmp_path / "sessions"}"\nfsync = "never"\n'
        f'[tools]\nstandard = false\nworkspace = "{tmp_path}"\n'
        "[inference]\nretries = 1\nbackoff_s = 0.01\ntimeout_s = 20\n"
    )
    replies = [answer("One."), answer("Two."), answer("Three."), answer("They counted."),
               answer("Four.")]
    with FakeLlama(replies) as fake:
        def loopd(*args: str) -> int:
            return main([*args, "--config", str(config), "--url", fake.url])

        for word in ("one", "two", "three"):
            assert loopd("run", word, "--session", "a") == 0
        capsys.readouterr()
        assert loopd("compact", "a") == 0
        said = " ".join(capsys.readouterr().err.split())
        assert "compacting the conversation (asked for)" in said and "compacted: " in said
        asked = fake.requests[3]["messages"]
        assert asked[:-1] == fake.requests[2]["messages"] + [
            {"role": "assistant", "content": "Three."}]  # the warm slot's prompt, and more
        assert loopd("run", "four", "--session", "a") == 0
        sent = fake.requests[-1]["messages"]
    assert sent[1]["content"] == SUMMARY_FRAME.format(summary="They counted.")
    assert sent[-1]["content"] == "four"
    records = read_records(tmp_path / "sessions" / "a" / "log.bin")
    (compaction,) = [r for r in records if isinstance(r, Compaction)]
    assert compaction.by is CompactionBy.PERSON and compaction.summary == "They counted."
