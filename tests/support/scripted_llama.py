"""A deterministic "agent" script for the fake llama-server, in a thread or its own process.

The fault, load and crash tests and the loop benchmarks need a model that behaves the same
way every time for the same conversation, however often it is asked, by however many
sessions at once. :func:`agent` is that model: it reads its orders from the last user
message, so the test decides every answer by what it sends::

    "turn 7 :: read_file {"path": "notes.txt"} :: find_tool {"query": "files"}"

The text before the first ``::`` is the turn's tag. Each later part is one tool step: the
model's *k*-th response after the user message calls the *k*-th step's tool (``find_tool``
directly, any other name through ``call_tool``), and once every step has a tool result it
answers ``"done <tag>."`` (padded to ``answer_chars``). Call ids are made from the tag and
the step, so a turn's records do not depend on what came before it.

Run it as a process (benchmarks: a server thread would share the client's GIL)::

    python -m tests.support.scripted_llama --port 0 [--answer-chars N] [--chunk N]

prints its URL and serves until SIGTERM; :func:`serve_in_process` does that as a context
manager.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from tests.support.fake_llama import FakeLlama, Reply, answer, in_process, serve_until_term

__all__ = ["agent", "call_id", "main", "orders", "serve_in_process"]

_SLUG = re.compile(r"[^A-Za-z0-9]+")


def orders(text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """The tag and the tool steps written in a user message (see the module docstring)."""
    tag, *parts = [p.strip() for p in text.split("::")]
    steps = []
    for part in parts:
        name, _, args = part.partition(" ")
        steps.append((name, json.loads(args) if args.strip() else {}))
    return tag, steps


def call_id(tag: str, step: int) -> str:
    """The id of the tool call a turn's ``step`` makes: a function of the tag alone."""
    return f"call-{_SLUG.sub('-', tag).strip('-')}-{step}"


def _user_text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def agent(answer_chars: int = 0, chunk: int = 4) -> Callable[[dict[str, Any]], Reply]:
    """A FakeLlama script: tool steps as the last user message orders, then the answer."""

    def script(body: dict[str, Any]) -> Reply:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        tag, steps = orders(_user_text(messages[last_user])) if last_user >= 0 else ("", [])
        done = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "tool")
        if done < len(steps):
            name, args = steps[done]
            if name in ("find_tool", "agent"):  # the session's own tools, called directly
                call = (call_id(tag, done), name, json.dumps(args))
            else:
                wrapped = {"name": name, "arguments": args}
                call = (call_id(tag, done), "call_tool", json.dumps(wrapped))
            return answer(tool_calls=[call], chunk=chunk)
        text = f"done {tag}."
        if len(text) < answer_chars:
            filler = " All is well."
            text += (filler * (answer_chars // len(filler) + 1))[: answer_chars - len(text)]
        return answer(text, chunk=chunk)

    return script


@contextlib.contextmanager
def serve_in_process(
    answer_chars: int = 0, chunk: int = 4, cpus: set[int] | None = None, slots: int = 1
) -> Iterator[str]:
    """The agent fake in its own process; yields its URL, stops it (SIGTERM) on exit.

    ``cpus``: the CPUs the server may run on (benchmarks give it a core of its own);
    ``slots``: the ``total_slots`` its /props says.
    """
    with in_process("tests.support.scripted_llama", "--answer-chars", str(answer_chars),
                    "--chunk", str(chunk), "--slots", str(slots), cpus=cpus) as url:  # fmt: skip
        yield url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the fake llama-server with the agent script")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--answer-chars", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=4)
    parser.add_argument("--slots", type=int, default=1)
    args = parser.parse_args(argv)
    fake = FakeLlama(agent(args.answer_chars, args.chunk), port=args.port,
                     props={"total_slots": args.slots})
    return serve_until_term(fake)


if __name__ == "__main__":
    sys.exit(main())
