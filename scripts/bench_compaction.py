"""Compaction: what a conversation longer than its context costs, three ways on.

One scripted conversation of ``TURNS`` turns (each a paragraph of notes and a question, about
300 tokens with its answer) on a slot of ``N_CTX`` tokens (the embedded model's 8,192),
with the embedded model's baseline (its system prompt and the standard tools, about 1,900
tokens), so that the context fills about three times. Each way on a session of its own:

- **loopd**: ``session.compaction = "elide"`` at ``compact_at`` 0.4 (the embedded
  defaults); the first request
  after a compaction reuses the baseline's prefix the slot holds and processes only the
  summary, the kept turns and the new message;
- **re-prefill**: the same compactions, but each first request after one is sent with
  ``cache_prompt: false``: the server processes the whole new prompt, baseline included
  (what Codex, Goose and OpenHands pay: their summary replaces the history and the prompt
  is processed again from its start);
- **new session**: ``session.compaction = "off"``: when the context is full (SessionFull)
  the turn is asked again in a new session, which knows nothing of the earlier turns (what
  a person can do without compaction).

Per way: prompt tokens the server processed over the conversation (its ``prompt_n``, every
request counted: the summary requests too), per turn (mean and the largest), the first
request after each compaction (``cache_n``, ``prompt_n``), and the wall time.

This runs against the **fake llama-server** (tests/support/fake_llama.py: 4 characters a
token, prefix caching per slot, ``cache_prompt: false`` honoured), not the embedded model,
whose prefill (15-60 tokens a second on 2 shared cores) would make one run take an hour:
the tokens are the measure; the wall time is loopd's own work (compaction, ``/tokenize``,
the log) plus the fake's, not a model's. Multiply the token differences by the embedded
model's prefill time per token
(docs/sessions.md#a-conversation-outlives-its-context-compaction) for what they cost there.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.base.errors import SessionFull
from actors.base.events import Event
from actors.inference.slots.files import remove_session_files, slot_dirs
from actors.inference.types import ChatRequest, Completion
from actors.log.sessiondir import session_path
from actors.session.messages import SUMMARY_FRAME
from actors.session.world import start_world
from tests.support.fake_llama import FakeLlama, Reply, answer, context_full, render_prompt

__all__ = ["run"]

TURNS = 30
N_CTX = 8192  # the embedded model's tokens a slot
NOTE_LINES = 12  # lines of notes in each turn's message (~20 tokens each)
SMOKE = {"TURNS": 8, "N_CTX": 1700, "NOTE_LINES": 6}  # `bench --smoke`: compactions still
WAYS = ("loopd", "re-prefill", "new session")
_FRAME = SUMMARY_FRAME.split("{")[0]  # how a first request after a compaction starts


def message(turn: int) -> str:
    """Turn ``turn``'s message: notes on one day and a question on them."""
    notes = "\n".join(
        f"- day {turn}, entry {j}: crate {turn * 31 + j} moved from bay {j % 7} to bay "
        f"{(turn + j) % 11}, weighed {(turn * 13 + j * 7) % 97} kg, checked by team {j % 4}."
        for j in range(1, NOTE_LINES + 1)
    )
    return f"Notes for day {turn}:\n{notes}\nWhich crate of day {turn} was the heaviest?"


def _reply(body: dict[str, Any]) -> Reply:
    tokens = len(render_prompt(body)) // 4  # the fake's count
    if tokens > N_CTX:
        return context_full(tokens, N_CTX)
    asked = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    first = asked.splitlines()[0][:60]
    return answer(content=f"Noted ({first}). The heaviest crate is listed in the notes.")


@dataclasses.dataclass(slots=True)
class _Counted:
    """The inference, counting what the server processed; optionally re-prefilling the
    first request after each compaction (``cache_prompt: false``)."""

    inner: Any
    reprefill: bool
    processed: int = 0
    epochs: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # cache_n, prompt_n
    _summary: str = ""

    def complete(self, request: ChatRequest, sink: Callable[[Event], None],
                 cancel: CancelToken) -> Completion:
        first = self._first_of_epoch(request)
        if first and self.reprefill:
            request = dataclasses.replace(request, sampling={**request.sampling,
                                                             "cache_prompt": False})
        done: Completion = self.inner.complete(request, sink, cancel)
        prompt_n = int(done.timings.get("prompt_n", done.prompt_tokens))
        self.processed += prompt_n
        if first:
            self.epochs.append((int(done.timings.get("cache_n", 0)), prompt_n))
        return done

    def _first_of_epoch(self, request: ChatRequest) -> bool:
        if len(request.messages) < 2:
            return False
        second = request.messages[1].get("content")
        if not isinstance(second, str) or not second.startswith(_FRAME) \
                or second == self._summary:
            return False
        self._summary = second
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclasses.dataclass(frozen=True, slots=True)
class _Result:
    per_turn: list[int]  # prompt tokens processed in each turn
    seconds: float
    compactions: int
    sessions: int
    epochs: list[tuple[int, int]]


def run() -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="loopd-bench-compaction-"))
    results: dict[str, _Result] = {}
    try:
        for way in WAYS:  # each on a server of its own: a cold slot
            with FakeLlama(_reply, props={"n_ctx": N_CTX}) as fake:
                results[way] = _conversation(root / way.replace(" ", "-"), fake.url, way)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _rows(results)


def _config(root: Path, url: str, way: str) -> cfg.Config:
    defaults = cfg.Config()  # the embedded model's baseline and defaults, on the fake server
    embedded = defaults.embedded
    return cfg.parse({
        "log": {"dir": str(root / "sessions"), "fsync": "never"},
        "tools": {"workspace": str(root)},
        "inference": {"url": url, "temperature": 0, "seed": 1},
        "session": {"system": embedded.system, "pinned": list(embedded.pinned),
                    "tool_results": "user", "compact_at": defaults.session.compact_at,
                    "compaction": "off" if way == "new session" else "elide"},
    })


def _conversation(root: Path, url: str, way: str) -> _Result:
    root.mkdir(parents=True)
    config = _config(root, url, way)
    names = [f"bench-{way.replace(' ', '-')}-0"]
    per_turn: list[int] = []
    compactions = 0
    started = time.perf_counter()
    try:
        with start_world(config) as world:
            model = _Counted(world.runtime.inference, reprefill=way == "re-prefill")
            runtime = dataclasses.replace(world.runtime, inference=model)
            session = world.session(names[-1])
            for turn in range(1, TURNS + 1):
                before = model.processed
                try:
                    outcome = _turn(session, runtime, message(turn))
                except SessionFull:  # a new session, as a person would start
                    names.append(f"bench-{way.replace(' ', '-')}-{len(names)}")
                    session = world.session(names[-1])
                    outcome = _turn(session, runtime, message(turn))
                compactions += outcome.compactions
                per_turn.append(model.processed - before)
            world.close_sessions()
    finally:
        for name in names:
            remove_session_files(slot_dirs(config), session_path(config, name))
    return _Result(per_turn, time.perf_counter() - started, compactions, len(names),
                   model.epochs)


def _turn(session: Any, runtime: Any, text: str) -> Any:
    return session.turn(runtime, text, lambda _: None, CancelToken()).get(timeout=120)


def _rows(results: dict[str, _Result]) -> list[dict[str, Any]]:
    """The table's rows; RuntimeError when a way did not do what it says (so the smoke run
    in ``make test`` fails): loopd did not compact, or lost the baseline's prefix after a
    compaction; re-prefill kept it; the new-session way compacted or never started over."""
    base = results["loopd"]
    if not base.epochs or any(cache == 0 for cache, _ in base.epochs):
        raise RuntimeError(f"loopd: no compaction, or the cache lost after one: {base}")
    if any(cache for cache, _ in results["re-prefill"].epochs):
        raise RuntimeError(f"re-prefill reused the cache: {results['re-prefill']}")
    if results["new session"].compactions or results["new session"].sessions < 2:
        raise RuntimeError(f"new session: {results['new session']}")
    total = sum(base.per_turn)
    rows: list[dict[str, Any]] = []
    for way, r in results.items():
        mine = sum(r.per_turn)
        note = {"loopd": f"{r.compactions} compactions (elide)",
                "re-prefill": f"{r.compactions} compactions, each re-processed from the start",
                "new session": f"{r.sessions} sessions, each knowing none of the earlier turns",
                }[way]
        rows += [
            {"name": f"{way}: prompt tokens processed, {len(r.per_turn)} turns", "value": mine,
             "unit": "tokens", "ratio": mine / max(1, total), "note": note},
            {"name": f"{way}: per turn, mean", "value": round(statistics.fmean(r.per_turn)),
             "unit": "tokens", "note": " ".join(map(str, r.per_turn))},
            {"name": f"{way}: per turn, largest", "value": max(r.per_turn), "unit": "tokens"},
            {"name": f"{way}: wall time (fake server)", "value": r.seconds, "unit": "s",
             "ratio": r.seconds / max(1e-9, base.seconds)},
        ]
        if r.epochs:
            rows.append({
                "name": f"{way}: first request after a compaction", "unit": "tokens",
                "value": round(statistics.fmean(p for _, p in r.epochs)),
                "note": "prompt_n; cache_n " + ", ".join(str(c) for c, _ in r.epochs)})
    return rows
