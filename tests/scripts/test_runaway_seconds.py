"""scripts/runaway_seconds.py without a model: the limits it turns off are the runaway
limits and nothing else, and its table puts each turn's two runs side by side."""

from __future__ import annotations

import dataclasses

from actors.base import config as cfg
from scripts.runaway_seconds import OFF, SCENARIOS, Turn, table


def test_off_turns_off_exactly_the_runaway_limits() -> None:
    on = cfg.Config()
    off = on.replace("loop", **OFF)
    changed = {k for k in OFF if getattr(on.loop, k) != getattr(off.loop, k)}
    names = {f.name for f in dataclasses.fields(on.loop) if f.name.startswith("runaway_")}
    assert changed == names == set(OFF)
    assert all(getattr(off.loop, k) == 0 for k in OFF)
    assert off.loop.max_tokens == on.loop.max_tokens  # what still stops a runaway


def test_the_pages_are_the_issue_s_messages_and_the_table_pairs_the_runs() -> None:
    pages = SCENARIOS["pages"]
    assert len(pages.messages) == 10 and pages.embedded == {"ctx_size": 4096}
    assert all(m.endswith("Reply with OK.") for m in pages.messages)
    rows = [Turn("uses", "on", 1, 79.8, 687, 1818, 0, "copy", 687, "The files"),
            Turn("uses", "off", 1, 179.1, 2072, 1818, 0, "max_tokens", 0, "The files")]
    lines = table(rows).splitlines()
    assert lines[2] == "| uses | 1 | 79.8 | 687 | copy at 687 | 179.1 | 2072 | max_tokens |"
    assert "uses off: 179.1 s, 2072 generated, 1 cut, 0 compactions" in lines
