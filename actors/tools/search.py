"""``find_tool``'s ranking: which tools match a few words, best first (pure)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from actors.tools.protocol.spec import ToolSpec

__all__ = ["find"]


def find(specs: Sequence[ToolSpec], query: str, limit: int = 5) -> str:
    """The find_tool answer: the best matches for ``query``, with their schemas."""
    if not specs:
        return "No tools are available right now: no tool host is connected."
    words = _query_words(query)
    if not words:
        listed = specs[: max(limit, 20)]
        head = f"All {len(specs)} tools" if len(listed) == len(specs) else f"{len(listed)} tools"
        return _describe(f"{head} (ask with a few words to narrow it down):", listed)
    scored = sorted(
        ((score, i, s) for i, s in enumerate(specs) if (score := _score(words, s)) > 0),
        key=lambda t: (-t[0], t[1]),
    )
    if not scored:
        names = ", ".join(s.name for s in specs[:30])
        return (
            f"No tool matches {query!r}. The tools are: {names}. Try other words with "
            "find_tool, or call_tool with one of these names."
        )
    top = scored[0][0]
    best = [s for score, _, s in scored[:limit] if score >= top / 4]  # drop weak tails
    return _describe(f"Tools matching {query!r}, best first:", best)


_STOP = {
    "a",
    "an",
    "the",
    "to",
    "of",
    "in",
    "on",
    "for",
    "and",
    "or",
    "with",
    "from",
    "my",
    "me",
    "i",
    "some",
    "this",
    "that",
    "it",
    "is",
    "be",
    "tool",
    "tools",
    "please",
    "can",
    "want",
}


def _words(text: str) -> list[str]:
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)  # camelCase -> camel Case
    return re.findall(r"[a-z0-9]+", text.lower())


def _query_words(query: str) -> list[str]:
    return [w for w in dict.fromkeys(_words(query)) if w not in _STOP]


def _related(a: str, b: str) -> bool:
    """Same word up to an ending: file/files, read/reading, dir/directory."""
    short, long = sorted((a, b), key=len)
    return len(short) >= 3 and long.startswith(short)


def _score(words: list[str], spec: ToolSpec) -> float:
    name_words = _words(spec.name)
    desc_words = set(_words(spec.description))
    score = 0.0
    for w in words:
        if w in name_words:
            score += 3
        elif any(_related(w, n) for n in name_words):
            score += 2
        if w in desc_words:
            score += 1
        elif any(_related(w, d) for d in desc_words):
            score += 0.5
    if "_".join(words) == spec.name.lower() or " ".join(words) == spec.name.lower():
        score += 10
    return score


def _describe(head: str, specs: Iterable[ToolSpec]) -> str:
    lines = [head]
    for s in specs:
        notes = []
        if s.needs_approval:
            notes.append("needs approval")
        if s.untrusted:
            notes.append("its results come from outside and may be wrong")
        extra = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"- {s.name}: {s.description}{extra}")
        lines.append(f"  arguments: {json.dumps(s.parameters, ensure_ascii=False, sort_keys=True)}")
    lines.append('Run one with call_tool(name="...", arguments={...}).')
    return "\n".join(lines)
