"""``find_tool``'s ranking: which tools match a few words, best first (pure)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from actors.tools.protocol.spec import ToolSpec

__all__ = ["asked_for", "find", "finds_any"]


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


# Words that name many tools' verbs: a question's "get" or "list" says nothing about which.
_GENERIC_WORDS = """
get set list lists show create make add remove delete update change run runs check find
search fetch read write query look give tell what which where when many much there their
have does will would could should about into from your
"""
_GENERIC = frozenset(_GENERIC_WORDS.split())
# Short words of any sentence, which say nothing of a tool (finds_any)
_FUNCTION_WORDS = """
are was were been has had did how who why whom whose not but all any may you his her its
one our out own too yet per off via than then them they we he she us am do does done so if
"""
_FUNCTION = frozenset(_FUNCTION_WORDS.split())


def asked_for(question: str, specs: Sequence[ToolSpec]) -> tuple[frozenset[str], ...]:
    """The tools ``question`` names by a word of their names, grouped by that word, in the
    question's order: "What is the weather in Oslo, and convert 20 C to F" names
    ({get_weather}, {convert_units}); "How many tickets are open?" names ({list_tickets,
    create_ticket}) once. A word of four letters or more, not a verb every kind of tool has
    (get, list, search...), equal to a word of the name or the same up to an ending
    (ticket/tickets)."""
    groups: list[frozenset[str]] = []
    names = [(s.name, _words(s.name)) for s in specs]
    for w in _query_words(question):
        if len(w) < 4 or w in _GENERIC:
            continue
        found = frozenset(n for n, parts in names
                          if any(w == p or (len(p) >= 4 and _related(w, p)) for p in parts))
        if found and found not in groups:
            groups.append(found)
    return tuple(groups)


def finds_any(specs: Sequence[ToolSpec], query: str) -> bool:
    """Whether :func:`find` would answer ``query`` with a tool: a word of it (not a verb
    every kind of tool has, nor a stop word or another short word of any sentence) in a
    tool's name or description. "How many days are in a week?" found read_file by its
    description's "are" ("Long files are cut"); the embedded model then looked a tool up and
    answered with find_tool's "No tool matches ..."."""
    words = [w for w in _query_words(query) if w not in _GENERIC and w not in _FUNCTION]
    return any(_score(words, s) > 0 for s in specs)
