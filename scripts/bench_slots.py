"""The slot keeper on the real embedded server: what keeping the KV state saves.

(a) **Resume**: a ~4,000-token session, its command ended; a new command (a new World, so a
    new llama-server process) continues it. Time to the first token of the answer and the
    prompt tokens processed, with the session's saved state restored against the same
    turn with the file deleted first (what every command paid before the keeper).
(b) **A new session**: its first turn's time to first token and prompt tokens processed,
    with the baseline's saved state restored into its slot (``slots.warm_start``, a new
    command on a new server process, so only the file can help) against the same turn with
    warm starts off (every new session processed its system prompt and tools), side by
    side in one run; and a second new session in the same command. Then a whole
    ``loopd run`` on a new session, wall time, without a daemon (``--local``: it starts its
    llama-server, restores the baseline, answers, saves) and through a running one.
(c) **Round-robin**: 8 sessions take turns on a 2-slot server. Prompt tokens processed per
    request after the first round: with the keeper (leases, save, restore) against the old
    behaviour (every session on slot 0, nothing saved; the server's own RAM cache of idle
    prompts, ``--cache-ram``, is all that helps it) and against the new tokens of each
    request (prompt tokens minus what the session's state already held: the floor).

Needs the embedded extra; without it the bench reports itself skipped. It takes minutes on
2 cores: most of it is the cold prompt processing both sides need once.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.inference.llama import LlamaClient
from actors.inference.slots.files import remove_session_files, slot_dirs
from actors.inference.types import ChatRequest, Completion
from actors.log.records import Record, Usage
from actors.log.sessiondir import session_path
from actors.session.turn import Runtime
from actors.session.world import World, start_world
from scripts.benchkit import SMOKE_SERVER, facts, scratch, skipped, timed_turn
from tests.daemon.daemonkit import Daemon, cli
from tests.tools.hostkit import short_dir

SESSIONS, SLOTS, ROUNDS = 8, 2, 2
HISTORY = 170  # lines of facts in the resumed session: ~4,000 tokens
SHELF = 12  # lines of facts in each round-robin session's first message
ANSWER = 16  # tokens of each answer at most
THREADS = 0  # the server's threads (embedded.threads); 0: every core, as a person's has
SYSTEM = ""  # session.system; "": embedded.system, a person's
NEW_TOOLS = True  # the new-session part with the standard tools, as a person's sessions have
# `bench --smoke`: the fewest turns that still take every path: two sessions on one slot (so
# the keeper saves and restores), one round, one-line messages, two-token answers
SMOKE = {"SESSIONS": 2, "SLOTS": 1, "ROUNDS": 1, "HISTORY": 1, "SHELF": 1, "ANSWER": 2,
         "NEW_TOOLS": False, **SMOKE_SERVER}


def run() -> list[dict[str, Any]]:
    if (skip := skipped()) is not None:
        return skip
    names = ["resume", "new-first", "new-cold", "new-warm", "new-second", *_COMMANDS,
             *(_name(i) + t for i in range(SESSIONS) for t in ("", "-old"))]
    embedded, session = {"slots": SLOTS, "threads": THREADS}, {"system": SYSTEM}
    with scratch("loopd-bench-slots-", names, ANSWER, embedded=embedded,
                 session=session) as config:
        return (_resume(config) + _new_session(config) + _commands(config)
                + _round_robin(config))


def _name(i: int) -> str:
    return f"rr{i}"


def _resume(config: cfg.Config) -> list[dict[str, Any]]:
    with start_world(config) as world:
        _, built = timed_turn(world, world.runtime, "resume", facts("warehouse", HISTORY))
    times: dict[str, tuple[float, Usage]] = {}
    for variant in ("restored", "not restored"):
        if variant == "not restored":
            remove_session_files(slot_dirs(config), session_path(config, "resume"))
            config = config.replace("slots", warm_start=False)  # nor the baseline's
        with start_world(config) as world:  # a new command: a new server process
            times[variant] = timed_turn(world, world.runtime, "resume", "What does item 7 weigh?")
    (fast, kept), (slow, cold) = times["restored"], times["not restored"]
    restored = kept.slot.restored if kept.slot else 0
    size = next((m.bytes / max(m.tokens, 1) for s in slot_dirs(config) for k, m in s.all()
                 if k.startswith("resume-")), 0.0)
    return [
        {"name": "resume: history", "value": built.prompt_tokens + built.completion_tokens,
         "unit": "tokens", "note": f"saved at {size / 1024:.1f} KiB per token"},
        {"name": "resume, restored: time to first token", "value": fast, "unit": "s",
         "ratio": 1.0, "note": f"restored {restored:,} tokens in "
                               f"{kept.slot.restore_ms if kept.slot else 0:.0f} ms"},
        {"name": "resume, not restored: time to first token", "value": slow, "unit": "s",
         "ratio": slow / fast},
        {"name": "resume, restored: prompt tokens processed",
         "value": int(kept.timings.get("prompt_n", 0)), "unit": "tokens", "ratio": 1.0},
        {"name": "resume, not restored: prompt tokens processed",
         "value": int(cold.timings.get("prompt_n", 0)), "unit": "tokens",
         "ratio": int(cold.timings.get("prompt_n", 0)) / max(1, int(kept.timings["prompt_n"]))},
    ]


def _new_session(config: cfg.Config) -> list[dict[str, Any]]:
    config = config.replace("tools", standard=NEW_TOOLS)  # a person's baseline: ~1,170 tokens
    ask = {"new-first": "What is 12 times 3?", "new-cold": "What is 12 times 3?",
           "new-warm": "What is 12 times 3?", "new-second": "What is 7 plus 5?"}
    with start_world(config) as world:  # the baseline processed and saved, if it was not yet
        timed_turn(world, world.runtime, "new-first", ask["new-first"])
    ttft: dict[str, float] = {}
    with start_world(config.replace("slots", warm_start=False)) as world:
        ttft["new-cold"] = timed_turn(world, world.runtime, "new-cold", ask["new-cold"])[0]
    with start_world(config) as world:  # a new command: only the saved file can help
        for name in ("new-warm", "new-second"):
            ttft[name] = timed_turn(world, world.runtime, name, ask[name])[0]
    first = {name: next(r for r in _records(config, name) if isinstance(r, Usage))
             for name in ttft}  # each session's first request (a turn may ask more)

    def processed(name: str) -> int:
        return int(first[name].timings.get("prompt_n", 0))

    def how(name: str) -> str:
        use = first[name].slot
        return (f"; restored {use.restored:,} tokens in {use.restore_ms:.0f} ms ({use.reason})"
                if use is not None and use.restored else "")

    cold, warm = ttft["new-cold"], ttft["new-warm"]
    return [
        {"name": "new session, warm starts off: time to first token", "value": cold,
         "unit": "s", "ratio": cold / warm,
         "note": f"{processed('new-cold'):,} of {first['new-cold'].prompt_tokens:,} prompt "
                 "tokens processed"},
        {"name": "new session, baseline restored: time to first token", "value": warm,
         "unit": "s", "ratio": 1.0,
         "note": f"{processed('new-warm'):,} of {first['new-warm'].prompt_tokens:,} prompt "
                 f"tokens processed{how('new-warm')}"},
        {"name": "second new session, same command: time to first token",
         "value": ttft["new-second"], "unit": "s", "ratio": ttft["new-second"] / warm,
         "note": f"{processed('new-second'):,} prompt tokens processed{how('new-second')}"},
        {"name": "new session, warm starts off: prompt tokens processed",
         "value": processed("new-cold"), "unit": "tokens",
         "ratio": processed("new-cold") / max(1, processed("new-warm"))},
        {"name": "new session, baseline restored: prompt tokens processed",
         "value": processed("new-warm"), "unit": "tokens", "ratio": 1.0},
    ]


_COMMANDS = ("cmd-prime", "cmd-local", "cmd-daemon")


def _commands(config: cfg.Config) -> list[dict[str, Any]]:
    """A whole ``loopd run`` on a new session: without a daemon, then through one."""
    question = "What is 12 times 3?"
    with short_dir() as d:
        path = d / "loopd.toml"
        path.write_text(_toml(config, d / "run"), encoding="utf-8")
        wall: dict[str, float] = {}

        def command(name: str, *flags: str) -> None:
            started = time.perf_counter()
            done = cli(path, "run", *flags, "--session", name, question, timeout=900)
            wall[name] = time.perf_counter() - started
            if done.returncode != 0:
                raise RuntimeError(f"loopd run --session {name}: {done.stderr[-2000:]}")

        command("cmd-local", "--local")
        with Daemon(path):
            command("cmd-prime")  # the daemon's model server up and warm
            command("cmd-daemon")
            cli(path, "stop", timeout=120)

    def note(name: str) -> str:
        usage = next(r for r in _records(config, name) if isinstance(r, Usage))
        how = usage.slot.reason if usage.slot is not None else ""
        return (f"{int(usage.timings.get('prompt_n', 0)):,} of {usage.prompt_tokens:,} prompt "
                f"tokens processed ({how})")

    local, daemon = wall["cmd-local"], wall["cmd-daemon"]
    return [
        {"name": "loopd run, new session, no daemon: whole command", "value": local,
         "unit": "s", "ratio": local / daemon,
         "note": f"starts its llama-server; {note('cmd-local')}"},
        {"name": "loopd run, new session, through the daemon: whole command", "value": daemon,
         "unit": "s", "ratio": 1.0, "note": note("cmd-daemon")},
    ]


def _toml(config: cfg.Config, run_dir: Path) -> str:
    """``config``'s keys this bench sets, as a file for ``loopd`` commands."""
    return (
        f'[log]\ndir = "{config.log_dir}"\nfsync = "never"\n'
        f"[tools]\nstandard = {str(NEW_TOOLS).lower()}\n"
        f"[loop]\nmax_tokens = {config.loop.max_tokens}\n"
        "[inference]\ntemperature = 0\nseed = 1\ntimeout_s = 900\n"
        f'[embedded]\nslots = {SLOTS}\nthreads = {THREADS}\nmodel = "{config.embedded.model}"\n'
        f'[session]\nsystem = "{SYSTEM}"\n'
        f'[daemon]\nruntime_dir = "{run_dir}"\nconnect_timeout_s = 5\n'
    )


class _SlotZero:
    """The old behaviour: every request on slot 0 of the one server, no keeper."""

    def __init__(self, client: LlamaClient) -> None:
        self._client = client

    def complete(self, request: ChatRequest, sink: Any, cancel: CancelToken) -> Completion:
        return self._client.chat_with_retry(request, sink, cancel, slot=0)

    def turn_ended(self, session: str) -> None:
        """Nothing is kept between turns."""

    def context(self, session: str) -> int:
        return 0  # not known: so nothing is counted (tokens) and nothing compacted before

    def tokens(self, session: str, text: str) -> int:
        return self._client.tokenize(text)


def _rounds(world: World, runtime: Runtime, tag: str) -> Iterator[Usage]:
    """Every session's first turn, then ROUNDS rounds; yields the later rounds' Usage."""
    for i in range(SESSIONS):
        timed_turn(world, runtime, f"{_name(i)}{tag}", facts(f"shelf {i}{tag}", SHELF))
    for n in range(ROUNDS):
        for i in range(SESSIONS):
            yield timed_turn(world, runtime, f"{_name(i)}{tag}",
                             f"Round {n}: what does item {n + 2} weigh?")[1]


def _round_robin(config: cfg.Config) -> list[dict[str, Any]]:
    with start_world(config) as world:  # each strategy on a server process of its own
        keeper = list(_rounds(world, world.runtime, ""))
    with start_world(config) as world:
        client = LlamaClient(world.config.inference, url=world.urls[0])
        try:
            old_runtime = Runtime(config=world.config, inference=_SlotZero(client),
                                  registry=world.runtime.registry)
            old = list(_rounds(world, old_runtime, "-old"))
        finally:
            client.close()
    floor = []
    for name in [_name(i) for i in range(SESSIONS)]:
        records = _records(config, name)
        usages = [r for r in records if isinstance(r, Usage)]
        floor += [max(0, b.prompt_tokens - a.prompt_tokens - a.completion_tokens + 1)
                  for a, b in itertools.pairwise(usages)]
    new = statistics.mean(floor)
    kept = statistics.mean(int(u.timings.get("prompt_n", 0)) for u in keeper)
    was = statistics.mean(int(u.timings.get("prompt_n", 0)) for u in old)
    note = f"{SESSIONS} sessions, {SLOTS} slots, {ROUNDS} rounds after the first"
    return [
        {"name": "round-robin: new tokens per request (floor)", "value": new, "unit": "tokens",
         "ratio": 1.0, "note": note},
        {"name": "round-robin, keeper: prompt tokens processed per request", "value": kept,
         "unit": "tokens", "ratio": kept / new},
        {"name": "round-robin, all on slot 0: prompt tokens processed per request",
         "value": was, "unit": "tokens", "ratio": was / new,
         "note": f"{was / max(kept, 1):.1f}x the keeper's"},
    ]


def _records(config: cfg.Config, name: str) -> tuple[Record, ...]:
    from actors.log.file import read_records

    return read_records(session_path(config, name))
