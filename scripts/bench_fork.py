"""Fork and rewind on the real embedded server: what a branch and an undo cost.

A ~4,000-token session (its history one long message of facts, then a question), its
command ended. Then, each on a server process of its own (a new command: nothing in the
server's memory helps either side):

- **fork**: ``loopd sessions fork`` of it (its records and its saved KV state, hard-linked),
  then one turn on the fork: time to the first token and prompt tokens processed;
- **copy**: the same records in a new session without the KV state (what Codex, Goose and
  OpenHands do: they copy the history and re-process it), then the same turn;
- **rewind**: the source's last turn taken back, then a turn: what the undo's next request
  processes.

The ratio that matters is copy / fork (side by side in this run). The fork itself (copying
the log, linking the state file) is timed too. Needs the embedded extra; without it the
bench reports itself skipped. Minutes on 2 cores: most of it is the cold prompt processing
the source and the copy need once each.
"""

from __future__ import annotations

import time
from typing import Any

from actors.base import config as cfg
from actors.inference.slots.files import remove_session_files, slot_dirs
from actors.log.sessiondir import session_path
from actors.session.fork import fork_session
from actors.session.world import World, start_world
from scripts.benchkit import SMOKE_SERVER, facts, scratch, skipped, timed_turn

HISTORY = 170  # lines of facts in the source session: ~4,000 tokens
ANSWER = 16  # tokens of each answer at most
THREADS = 0  # the server's threads (embedded.threads); 0: every core, as a person's has
SYSTEM = ""  # session.system; "": embedded.system, a person's
SMOKE = {"HISTORY": 1, "ANSWER": 2, **SMOKE_SERVER}  # `bench --smoke`: one-line history
NAMES = ("src", "fork", "copy")


def run() -> list[dict[str, Any]]:
    if (skip := skipped()) is not None:
        return skip
    embedded, session = {"threads": THREADS}, {"system": SYSTEM}
    with scratch("loopd-bench-fork-", NAMES, ANSWER, embedded=embedded,
                 session=session) as config:
        return _measure(config)


def _rewind(world: World, name: str) -> None:
    session = world.session(name)
    session.rewind(1).get(timeout=60)
    session.actor_ref.stop(timeout=30)
    world.sessions.remove(session)


def _measure(config: cfg.Config) -> list[dict[str, Any]]:
    with start_world(config) as world:
        timed_turn(world, world.runtime, "src", facts("warehouse", HISTORY))
        _, built = timed_turn(world, world.runtime, "src", "What does item 3 weigh?")
    started = time.perf_counter()
    report = fork_session(config, "src", "fork")
    fork_s = time.perf_counter() - started
    fork_session(config, "src", "copy")
    remove_session_files(slot_dirs(config), session_path(config, "copy"))  # no KV state
    question = "What does item 7 cost?"
    with start_world(config) as world:  # a new command: a new server process
        fast, forked = timed_turn(world, world.runtime, "fork", question)
    with start_world(config) as world:
        slow, copied = timed_turn(world, world.runtime, "copy", question)
    with start_world(config) as world:
        _rewind(world, "src")
        undo_s, undone = timed_turn(world, world.runtime, "src", "What does item 5 weigh?")
    history = built.prompt_tokens + built.completion_tokens
    state = report.state.tokens if report.state is not None else 0
    fork_n, copy_n = (int(u.timings.get("prompt_n", 0)) for u in (forked, copied))
    undo_n = int(undone.timings.get("prompt_n", 0))
    restored = forked.slot.restored if forked.slot else 0
    return [
        {"name": "source session", "value": history, "unit": "tokens",
         "note": f"its saved KV state: {state:,} tokens"},
        {"name": "fork: making it (log copied, state file linked)", "value": fork_s * 1000,
         "unit": "ms"},
        {"name": "fork: time to first token of its first turn", "value": fast, "unit": "s",
         "ratio": 1.0, "note": f"restored {restored:,} tokens in "
                               f"{forked.slot.restore_ms if forked.slot else 0:.0f} ms"},
        {"name": "copy without KV state: time to first token", "value": slow, "unit": "s",
         "ratio": slow / fast, "note": "what the peers do"},
        {"name": "fork: prompt tokens processed", "value": fork_n, "unit": "tokens",
         "ratio": 1.0},
        {"name": "copy without KV state: prompt tokens processed", "value": copy_n,
         "unit": "tokens", "ratio": copy_n / max(1, fork_n)},
        {"name": "rewind: next turn's time to first token", "value": undo_s, "unit": "s",
         "ratio": undo_s / fast},
        {"name": "rewind: next turn's prompt tokens processed", "value": undo_n,
         "unit": "tokens", "ratio": undo_n / max(1, fork_n)},
    ]
