"""What one step of a turn may say, under ``inference.constrained_calls``
(docs/inference.md#small-model-aids).

The grammar (:mod:`actors.inference.smallmodel.grammar`) lets a response be the word TOOL
and one call, or ANSWER and text. :func:`next_step` says, for the next response of a turn,
whether it may call (after ``inference.constrained_tool_steps`` steps it may not), whether
it may answer instead, which tools it may not call and which arguments are held to which
values. The rules, each measured with ``make eval`` on the folders never tuned on:

- A question that asks for two or more file tools by their verbs ("Search for backup, then
  read the file you found") gets those calls, in that order, one a step
  (:func:`~actors.inference.smallmodel.decision.asked_steps`): left the choice after the
  first result, the embedded model answered from it.
- A question that names a file gets a call first, no ANSWER.
- In a small workspace (``inference.workspace_words``: the files the search reads hold at
  most that many bytes), loopd reads what it holds (:mod:`actors.tools.workspace_words`) at
  each step and holds the first call to it (:func:`_held`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from actors.base.config import Config
from actors.inference.smallmodel.decision import (
    about_the_workspace,
    asked_steps,
    asks_a_size,
    named_files,
    names_a_file,
    place_named,
    refers_back,
)
from actors.inference.smallmodel.grammar import Values
from actors.log.records import Record
from actors.session.listing import listed_entry
from actors.tools.protocol.spec import ToolSpec
from actors.tools.toolbox import uses_workspace
from actors.tools.workspace_words import Holdings, workspace_words

__all__ = ["Step", "next_step"]


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """What the next response may say: a call (``calls``), text (``text``), not a call of
    the tools in ``exclude``, the arguments in ``values`` held to theirs."""

    calls: bool
    text: bool = True
    exclude: frozenset[str] = frozenset()
    values: Values = ()


def next_step(
    question: str, done: int, config: Config, specs: Sequence[ToolSpec],
    offered: Iterable[Any], records: Sequence[Record], hidden: Sequence[str],
) -> Step:
    """The next response of a turn that asked ``question`` and has made ``done`` calling
    responses; ``specs``: the registry's tools, ``offered``: the baseline's, ``records``:
    the session's log, ``hidden``: loopd's own places in the workspace."""
    names = {s.name for s in specs} | _offered(offered)
    asked = asked_steps(question)
    planned = len(asked) if len(asked) >= 2 and set(asked) <= names else 0
    calls = done < max(config.inference.constrained_tool_steps, planned)
    if not calls:
        return Step(calls=False)
    named = names_a_file(question)
    held = _held(question, done, planned, named, config, names, records, hidden)
    values, barred = held or ((), frozenset())
    must = done < planned or (done == 0 and (named or held is not None))
    if done < planned:  # the step asked for, and no other
        barred = frozenset(names - {asked[done], "call_tool"})
    return Step(calls=True, text=not must, exclude=barred, values=values)


def _held(
    question: str, done: int, planned: int, named: bool, config: Config, names: set[str],
    records: Sequence[Record], hidden: Sequence[str],
) -> tuple[Values, frozenset[str]] | None:
    """What the file tools' arguments are held to in this step, and the tools it may not
    call; None: as the schemas say. Only in a small workspace (inference.workspace_words),
    read at each step so a file written earlier counts:

    - the first response to a question that names a file that is there and asks for no
      tool by its verb nor for a size ("Which page gave a 404 in access.log?"): a read of
      that file, the only call it may make (left the choice, the embedded model listed the
      folder for a CSV's columns, or searched for the examples' "apples");
    - the first response to a question that names a place in the session's last listing
      ("What does the second one say?") when that entry is a file: a read of that file,
      the only call it may make (the model cannot count: it read the fourth file for "the
      third one");
    - the first response to a question that refers back to an earlier answer's list
      (:func:`refers_back`), and each step a question asks for, unless it names a file: a
      search for the question's words that the fewest files hold, a read or listing of a
      file or folder that is there (not the system prompt's example nor a made-up path),
      no search for a tool;
    - the first response to a question with words the files hold
      (:func:`about_the_workspace`): a search for the one(s) the fewest files hold, or a
      listing when all it names is a folder (left a read of any file, the embedded model
      read the first file of the folder).
    """
    first = done == 0
    if not (first or done < planned) or not uses_workspace(config):
        return None
    found = workspace_words(config.workspace, hidden, config.inference.workspace_words)
    if found is None:
        return None
    if named:
        there = _files_named(named_files(question), found.files)
        if first and there and not planned and not asked_steps(question) and not asks_a_size(
                question):
            return _only_read(there, names)
        return None
    place = place_named(question) if first else None
    entry = listed_entry(records, place) if place else None
    if entry in found.files:  # "the second one" of the last listing: that file
        return _only_read((entry,), names)
    terms = about_the_workspace(question, found.words)
    if done < planned or refers_back(question):
        return _anything_there(found, terms), frozenset({"find_tool"})
    if not terms:
        return None
    # a fact the question does not say where to find: a search for its most telling word,
    # or a listing when all it names is a folder
    folders = tuple(t for t in terms if t in found.folders)
    allowed = {"search_files", "call_tool"} | ({"list_dir"} if folders == terms else set())
    held: Values = (("search_files", "path", found.folders),
                    ("search_files", "pattern", found.rarest(terms)),
                    ("list_dir", "path", folders or found.folders))
    return held, frozenset(names - allowed)


def _only_read(paths: tuple[str, ...], names: set[str]) -> tuple[Values, frozenset[str]]:
    return (*_READ, ("read_file", "path", paths)), frozenset(names - {"read_file", "call_tool"})


# A held read starts at the file's start and reads it whole (a small workspace's file): the
# embedded model wrote the listing's size as the offset ("offset": 176 for a 176-byte file)
# and read nothing.
_READ: Values = (("read_file", "offset", ()), ("read_file", "start_line", ()),
                 ("read_file", "end_line", ()))


def _anything_there(found: Holdings, terms: tuple[str, ...]) -> Values:
    held: Values = (*_READ, ("read_file", "path", found.files),
                    ("list_dir", "path", found.folders), ("search_files", "path", found.folders))
    return (*held, ("search_files", "pattern", found.rarest(terms))) if terms else held


def _files_named(names: list[str], files: tuple[str, ...]) -> tuple[str, ...]:
    """The workspace's files that ``names`` name: by their path, or by a file name that
    only one of them has."""
    out: list[str] = []
    for name in names:
        path = name.removeprefix("./")
        alike = [f for f in files if f.rsplit("/", 1)[-1] == path]
        if path in files:
            out.append(path)
        elif len(alike) == 1:
            out.append(alike[0])
    return tuple(dict.fromkeys(out))


def _offered(tools: Iterable[Any]) -> set[str]:
    """The names of a baseline's offered tools."""
    return {t["function"]["name"] for t in tools if isinstance(t, dict) and "function" in t}
