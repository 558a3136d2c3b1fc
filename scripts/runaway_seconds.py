"""The seconds the runaway-text limit saves a turn on the real model (docs/eval.md, the
runaway part).

Each scenario runs twice on the embedded model, one after the other, with the embedded
defaults (standard tools, the embedded system prompt) but for the keys named: once with the
limits at their defaults (``loop.runaway_repeat_tokens``, ``runaway_copy_tokens``,
``runaway_echo_tokens``) and once with them off (0), so only ``loop.max_tokens`` and the
request's wall-clock limit stop a runaway, as before the limit. Per turn: seconds, tokens
generated (the turn's responses together), prompt tokens processed, compactions, and
whether and where the answer was cut (the Cut record's why: repeat, copy or echo, and the
tokens the server had sent then; no Cut record but ``finish_reason`` "length":
``loop.max_tokens``).

Scenarios:

- ``pages``: ten ~450-token pasted pages, each ending "Reply with OK.", on an empty
  workspace with ``embedded.ctx_size = 4096`` (a person pasting notes);
- ``readme``: "Read README.md and tell me what this project does" on click (the eval's
  ``package:click`` workspace: the installed package laid out as its sdist has it);
- ``show``: "Show me README.md." on the same workspace (a right answer copies the file);
- ``uses``: "Which files use the class Whitespace?" on tomlkit (the eval's
  ``tuned-repo`` workspace), which the model answered with its search's 67 matches
  numbered, then again, to ``loop.max_tokens``;
- ``ticket``: "Create a ticket titled: Coffee machine is broken" with the eval's help-desk
  MCP servers (``own-tools``), answered with a made-up numbered list of the ticket's details
  that repeats (any approval is given).

    python -m scripts.runaway_seconds --config /tmp/one-thread.toml [--scenario pages ...]
        [--limits on|off ...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.base.events import AnswerCut, Event
from actors.inference.slots.files import remove_session_files, slot_dirs
from actors.log.records import Compaction, Cut, Record, Usage, User
from actors.log.sessiondir import session_path
from actors.session.world import start_world
from scripts.eval import _Harness, _unpack, with_servers

OFF = {"runaway_repeat_tokens": 0, "runaway_copy_tokens": 0, "runaway_echo_tokens": 0}
PAGES = 10


def page(n: int) -> str:
    """~450 tokens of pasted notes, ending "Reply with OK." (the issue's messages)."""
    items = " ".join(f"Item {n}-{j}: the red box on shelf {j} holds {n + j + 20} screws."
                     for j in range(1, 22))
    return f"Notes, page {n}. {items} Reply with OK."


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    workspace: str  # "" empty, else a package unpacked by the eval's _unpack
    messages: tuple[str, ...]
    embedded: dict[str, Any]
    servers: tuple[str, ...] = ()  # MCP servers of examples/eval/servers, beside the standard


SCENARIOS = {
    "pages": Scenario("pages", "", tuple(page(n) for n in range(1, PAGES + 1)),
                      {"ctx_size": 4096}),
    "readme": Scenario("readme", "click",
                       ("Read README.md and tell me what this project does",), {}),
    "show": Scenario("show", "click", ("Show me README.md.",), {}),
    # where the real model ran away in the eval (seed 7): a search's matches given back as a
    # numbered list, and a made-up list of a new ticket's details
    "uses": Scenario("uses", "tomlkit", ("Which files use the class Whitespace?",), {}),
    "ticket": Scenario("ticket", "", ("Create a ticket titled: Coffee machine is broken",),
                       {}, ("desk.py", "office.py")),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    scenario: str
    limits: str
    turn: int
    seconds: float
    generated: int
    processed: int
    compactions: int
    cut: str  # the Cut record's why (repeat, copy, echo, timeout), "max_tokens", or ""
    cut_at: int  # tokens the server had sent when the watch cut (AnswerCut.tokens), else 0
    answer: str


def _turn_records(records: Sequence[Record]) -> list[Record]:
    start = max((i for i, r in enumerate(records) if isinstance(r, User)), default=0)
    return list(records[start:])


def run(scenario: Scenario, limits: str, base: cfg.Config,
        say: Callable[[str], None]) -> list[Turn]:
    """One session of ``scenario`` with the runaway limits ``on`` (defaults) or ``off``."""
    root = Path(tempfile.mkdtemp(prefix="loopd-runaway-"))
    workspace = root / "workspace"
    workspace.mkdir()
    if scenario.workspace:
        _unpack(workspace, scenario.workspace)
    config = base.replace("log", dir=str(root / "sessions"), fsync="never")
    config = config.replace("tools", workspace=str(workspace), rules_file=str(root / "r.toml"))
    if scenario.embedded:
        config = config.replace("embedded", **scenario.embedded)
    if limits == "off":
        config = config.replace("loop", **OFF)
    config = with_servers(config, scenario.servers)
    name = f"runaway-{scenario.name}-{limits}"
    rows: list[Turn] = []
    try:
        with start_world(config, say) as world:
            session = world.session(name)
            for n, message in enumerate(scenario.messages, 1):
                cuts: list[AnswerCut] = []

                def sink(event: Event, cuts: list[AnswerCut] = cuts) -> None:
                    if isinstance(event, AnswerCut):
                        cuts.append(event)

                before = len(session.records().get(timeout=60))
                started = time.monotonic()
                outcome = session.turn(world.runtime, message, sink, CancelToken(),
                                       _Harness(True)).get()  # any approval: yes
                seconds = time.monotonic() - started
                records = session.records().get(timeout=60)
                turn = _turn_records(records)
                usages = [r for r in turn if isinstance(r, Usage)]
                why = next((r.why for r in reversed(turn) if isinstance(r, Cut)), "")
                if not why and outcome.cut:
                    why = "max_tokens" if usages[-1].finish_reason == "length" else "cut"
                row = Turn(
                    scenario.name, limits, n, round(seconds, 1),
                    sum(u.completion_tokens for u in usages),
                    sum(_processed(u) for u in usages),
                    sum(isinstance(r, Compaction) for r in records[before:]),
                    why, cuts[-1].tokens if cuts and cuts[-1].why in {"repeat", "copy", "echo"}
                    else 0, outcome.content[:160])
                rows.append(row)
                say(f"{scenario.name} {limits} turn {n}: {row.seconds} s, {row.generated} "
                    f"generated, {row.processed} processed, {row.compactions} compactions, "
                    f"cut: {row.cut or '-'}; {row.answer[:80]!r}")
            world.close_sessions()
    finally:
        remove_session_files(slot_dirs(config), session_path(config, name))
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _processed(usage: Usage) -> int:
    n = usage.timings.get("prompt_n")
    return int(n) if isinstance(n, int | float) else usage.prompt_tokens


def table(rows: Sequence[Turn]) -> str:
    """Per scenario and turn, the limits on and off side by side."""
    by = {(r.scenario, r.turn, r.limits): r for r in rows}
    lines = ["| scenario | turn | on: s | on: generated | on: cut | off: s | off: generated "
             "| off: cut |", "|---|---|---|---|---|---|---|---|"]
    for scenario, turn in dict.fromkeys((r.scenario, r.turn) for r in rows):
        cells = []
        for limits in ("on", "off"):
            r = by.get((scenario, turn, limits))
            cut = f"{r.cut} at {r.cut_at}" if r and r.cut_at else (r.cut if r else "") or "-"
            cells += [f"{r.seconds}", f"{r.generated}", cut] if r else ["", "", ""]
        lines.append(f"| {scenario} | {turn} | " + " | ".join(cells) + " |")
    for scenario in dict.fromkeys(r.scenario for r in rows):
        for limits in ("on", "off"):
            mine = [r for r in rows if r.scenario == scenario and r.limits == limits]
            if mine:
                lines.append(f"{scenario} {limits}: {sum(r.seconds for r in mine):.1f} s, "
                             f"{sum(r.generated for r in mine)} generated, "
                             f"{sum(bool(r.cut) for r in mine)} cut, "
                             f"{sum(r.compactions for r in mine)} compactions")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.runaway_seconds",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="a config file to start from (threads, say)")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--limits", action="append", choices=("on", "off"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    base = cfg.load(args.config) if args.config else cfg.Config()

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows: list[Turn] = []
    for name in args.scenario or ["pages", "readme"]:
        for limits in args.limits or ["on", "off"]:
            rows += run(SCENARIOS[name], limits, base, say)
    print(table(rows))
    if args.out:
        args.out.write_bytes(orjson.dumps([dataclasses.asdict(r) for r in rows],
                                          option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
