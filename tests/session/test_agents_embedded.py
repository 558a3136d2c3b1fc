"""Agents on the real model: a question over two large files, answered through two children
at once, each starting warm (docs/agents.md).

The embedded llama-server, a 4,096-token context, two slots, one thread. Two files of ~1,400
tokens each: with the baseline (~1,500 tokens) the two would not fit in one conversation,
while each fits a child whole (no child compacts), so each goes to a child that reads it
(``read_file``: the real model's call and the real file) and answers with the one line asked
for; both answers are in the parent's next request. The parent's final answer is checked for
the first only: the 0.5B model as a parent copies the first of several results when they are
sentences (it combines two one-word results; docs/agents.md). The parent's first response is
scripted (two ``agent`` calls: the small model is not asked to decide that here); every other
request is the real model's. Both children's requests are at the server at the same time
(each one's output began before the other ended), and each child's first request processes
only its task plus a few tokens of the template: the baseline's KV state is restored into its
slot (or processed once, apart, by the first child of a baseline never saved). Half the
embedded default's context (8,192) and files half as long (~3,000 tokens) show the same: the
two files overflow the context, each fits a child; 106 -> 43 s alone (load ~2).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.base.events import AgentDone, AgentEvent, Content, Event, Progress, Reasoning
from actors.log.file import read_records
from actors.log.records import Assistant, Compaction, ToolResult, Usage
from actors.log.sessiondir import session_path
from actors.session.world import start_world
from tests.support.embedded import FEW, MODEL, THREADS, require_embedded
from tests.support.scripted_parent import ParentScripted

WORDS = {"alpha.txt": "MAPLE", "beta.txt": "CEDAR"}
TASKS = tuple(f"Read the file {f} and answer with the code word it gives." for f in WORDS)
TEMPLATE = 12  # tokens of the chat template around a user message and the assistant cue
CTX = 4096  # each slot's context: the baseline and one file fit, the baseline and both do not
COLOURS = ("red", "blue", "green", "grey", "white", "black", "brown")


def inventory(name: str, word: str) -> str:
    """A file of ~1,400 tokens whose one fact is its code word (its first line)."""
    lines = [f"{name} gives the code word {word}."]
    lines += [f"Line {i}: the {COLOURS[i % 7]} crate on shelf {i % 11} holds {i * 37 % 101} "
              f"bolts and {i * 13 % 29} nuts." for i in range(1, 61)]
    return "\n".join(lines) + "\n"


@pytest.mark.embedded
@pytest.mark.timeout(1500)
def test_two_children_read_a_large_file_each_at_once_and_the_parent_gets_both_answers(
        tmp_path: Path) -> None:
    require_embedded()
    for name, word in WORDS.items():
        (tmp_path / name).write_text(inventory(name, word))
    config = cfg.parse({
        "log": {"dir": str(tmp_path / "sessions"), "fsync": "never"},
        "tools": {"workspace": str(tmp_path)},
        "loop": {"max_tokens": 40},
        "inference": {"temperature": 0, "seed": 1},
        "agents": {"enabled": True},
        "embedded": {"ctx_size": CTX, "slots": 2, "threads": THREADS, "model": MODEL},
    })
    seen: dict[str, list[float]] = {}  # child -> [first output at, done at]
    lock = threading.Lock()

    def sink(event: Event) -> None:
        with lock:
            if isinstance(event, AgentEvent) and isinstance(event.event, Content | Reasoning
                                                            | Progress):
                seen.setdefault(event.agent, [time.monotonic(), 0.0])
            if isinstance(event, AgentDone):
                seen.setdefault(event.agent, [0.0, 0.0])[1] = time.monotonic()

    with start_world(config) as world:
        inference = world.runtime.inference
        runtime = dataclasses.replace(world.runtime, inference=ParentScripted(
            inference, "s", [(task, "fresh") for task in TASKS]))
        started = time.monotonic()
        outcome = world.session("s").turn(
            runtime, "What are the code words of alpha.txt and beta.txt? Name both.", sink,
            CancelToken()).get(timeout=1400)
        wall = time.monotonic() - started
        sizes = {f: inference.tokens("s", (tmp_path / f).read_text()) for f in WORDS}
        parent = read_records(session_path(config, "s"))
        children = {}
        for name, task in zip(("s.a1", "s.a2"), TASKS, strict=True):
            records = read_records(session_path(config, name))
            children[name] = (records, inference.tokens(name, task))
    print(f"\nturn {wall:.1f} s; files {sizes} tokens; children (first output, done) {seen}; "
          f"answer {outcome.content!r}; first requests " + "; ".join(
              f"{n}: prompt_n {next(r for r in rs if isinstance(r, Usage)).timings.get('prompt_n')}"
              f" cache_n {next(r for r in rs if isinstance(r, Usage)).timings.get('cache_n')} "
              f"task {t}" for n, (rs, t) in children.items()))
    first_a = next(r for r in children["s.a1"][0] if isinstance(r, Usage))
    baseline = first_a.prompt_tokens - children["s.a1"][1] - TEMPLATE  # system prompt, tools
    assert baseline + sum(sizes.values()) > CTX, (baseline, sizes)  # both: not in one context
    (a_first, a_done), (b_first, b_done) = seen["s.a1"], seen["s.a2"]
    assert a_first < b_done and b_first < a_done, seen  # at the server at the same time
    for (records, task_tokens), (file, word) in zip(children.values(), WORDS.items(),
                                                    strict=True):
        first = next(r for r in records if isinstance(r, Usage))
        assert first.timings["prompt_n"] <= task_tokens + TEMPLATE + FEW, first.timings
        assert first.timings["cache_n"] > 0, first.timings  # the baseline, restored or kept
        calls = [c for r in records if isinstance(r, Assistant) for c in r.tool_calls]
        assert any(c.name == "read_file" and file in c.arguments for c in calls), calls
        assert any(isinstance(r, ToolResult) and word in r.content for r in records)
        assert not [r for r in records if isinstance(r, Compaction)]  # the file held whole
    results = " ".join(r.content for r in parent if isinstance(r, ToolResult))
    assert all(word in results for word in WORDS.values()), results  # both answers sent
    # the small model as a parent copies the first result it was given (docs/agents.md)
    assert outcome.content is not None and WORDS["alpha.txt"] in outcome.content.upper()
