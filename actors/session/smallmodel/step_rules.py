"""What one step of a turn may say, under ``inference.constrained_calls``
(docs/inference.md#small-model-aids).

The grammar (:mod:`actors.session.smallmodel.grammar`) lets a response be the word TOOL
and one call, or ANSWER and text. :func:`next_step` says, for the next response of a turn,
whether it may call (after ``inference.constrained_tool_steps`` steps it may not), whether
it may answer instead, which tools it may not call and which arguments are held to which
values. The rules, each measured with ``make eval`` on the folders never tuned on:

- A question that asks for two or more file tools by their verbs ("Search for backup, then
  read the file you found") gets those calls, in that order, one a step
  (:func:`~actors.session.smallmodel.decision_word.asked_steps`): left the choice after the
  first result, the embedded model answered from it.
- A question that names a file gets a call first, no ANSWER.
- In a small workspace (``inference.workspace_words``: the files the search reads hold at
  most that many bytes), loopd reads what it holds
  (:mod:`actors.session.smallmodel.workspace_words`) at each step and holds the first call
  to it (:func:`_held`).
- In a workspace too big to tell by its words, a question that names a file gets a read
  or an outline of that file first, its path as named (:func:`_named_read`): the model
  called find_definition for a file's text; and a question that names code (``class
  Context``, ``parse_value()``) or asks about the project (what it does, its version) gets a
  call of the tools that read the workspace first (:func:`_code_question`): left the choice
  on a real repository, the embedded model answered 12 of 14 such questions from nothing.
  Of those, a question asking what uses a name (``asks_what_uses``: "Which files use the
  class Whitespace?") gets a search for it (it called find_definition and named the
  defining file), and one asking for the version a search of the project's manifest for
  its version line (:func:`_manifest`: it listed the top folder and gave a file's size).
- A message whose ask needs no tool ("Reply with OK.", "What is 12 plus 30?", a greeting:
  :func:`~actors.session.smallmodel.questions.needs_no_tool`) gets no call, on any
  workspace: the model listed an empty folder before each pasted note ending "Reply with
  OK.". Arithmetic is answered after the word ``ANSWER: ``, not ``ANSWER ``: after the
  latter the model ended a number after its first digit ("9 plus 8" -> "1").
- A question that names one of the session's other tools (an MCP server's) by a word of its
  name ("the weather in Oslo": get_weather) gets a call of one of those tools, one step per
  tool it names (:func:`~actors.tools.search.asked_for`): left the choice, the embedded model
  made up 17 of 19 such answers.
- A first response may look a tool up only when the question has a word some tool's name
  or description holds: "What is the capital of Japan?" was looked up, then answered.
- In a small workspace, a first response to a question none of whose words the files hold,
  that names no file, folder or tool and asks nothing of now (:func:`_knowledge`: "What is
  the capital of Spain?") may not read, list or search: the model searched for "capital"
  and answered "No matches". With no tool's word in it either, it gets no call.
- In an empty workspace a first response may not read, list or search it (the embedded
  model called find_definition for "the capital of Japan"); and when there is nothing to
  read, a question that no tool's name or description has a word of and that asks nothing
  of the present moment (:func:`~actors.session.smallmodel.questions.asks_about_now`: "now",
  "today", "currently") gets no call: "the capital of Japan" called find_customer, the one
  tool left, and answered its "no customer named 'Japan'". "Is it raining in Bergen at the
  moment?" keeps the choice (no tool says "rain", but it asks of now).
- A short follow-up ("And in Lyon?") after a turn that called such a tool gets a call of
  that tool again.
- A question with no verb of writing (:func:`~actors.session.smallmodel.questions.
  asks_to_write`: write, create, save, add, change...) may not call write_file: "How do you
  say thank you in German?" wrote thank-you.md, and answered the denied write.
- A question that names no code (:func:`~actors.session.smallmodel.questions.code_names`)
  may not call find_definition, on any workspace: "Show me error.log." and "What is the
  largest planet?" called it for the system prompt's example name "Parser" and for
  "Planet", and answered from "no definition found".
- A response that only looked a tool up (``find_tool``) does not count as a calling step
  (twice at most): the next one may call what it found, and only that (a tool found with
  ``find_tool`` can be called in the same turn).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from actors.base.config import Config
from actors.base.errors import LoopdError
from actors.log.records import Assistant, Record, ToolResult, User
from actors.session.smallmodel.decision_word import (
    about_the_workspace,
    asked_steps,
    asks_a_size,
    named_files,
    names_a_file,
    place_named,
    refers_back,
)
from actors.session.smallmodel.grammar import REQUIRED, Values
from actors.session.smallmodel.last_listing import listed_entry
from actors.session.smallmodel.questions import (
    about_the_project,
    asks_a_number,
    asks_about_now,
    asks_the_version,
    asks_to_write,
    asks_what_uses,
    code_names,
    follows_on,
    names_the_workspace,
    needs_no_tool,
    refers_to_code,
)
from actors.session.smallmodel.workspace_words import Holdings, workspace_words
from actors.tools.protocol.spec import ToolSpec
from actors.tools.protocol.standard_specs import STANDARD_SPECS
from actors.tools.protocol.workspace import Refused, Workspace
from actors.tools.search import asked_for, finds_any

__all__ = ["Step", "next_step"]


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """What the next response may say: a call (``calls``), text (``text``), not a call of
    the tools in ``exclude``, the arguments in ``values`` held to theirs; ``value``: the
    text is a value, after the word ``ANSWER: `` (decision_word.ANSWER_VALUE)."""

    calls: bool
    text: bool = True
    exclude: frozenset[str] = frozenset()
    values: Values = ()
    value: bool = False


def next_step(
    question: str, done: int, config: Config, specs: Sequence[ToolSpec],
    offered: Iterable[Any], records: Sequence[Record], hidden: Sequence[str],
) -> Step:
    """The next response of a turn that asked ``question`` and has made ``done`` calling
    responses; ``specs``: the registry's tools, ``offered``: the baseline's, ``records``:
    the session's log, ``hidden``: loopd's own places in the workspace."""
    names = {s.name for s in specs} | _offered(offered)
    if needs_no_tool(question):
        return Step(calls=False, value=asks_a_number(question))
    turn = _so_far(records)
    steps = done - min(turn.lookups, _LOOKUPS)
    if turn.found is not None and turn.lookups <= _LOOKUPS:  # it looked a tool up: call it
        found = turn.found & names
        if found:
            return Step(calls=True, text=False,
                        exclude=frozenset(names - found - {"call_tool"}))
        return Step(calls=True, exclude=frozenset({"find_tool"}))
    mine = [s for s in specs if s.name not in STANDARD_SPECS]
    own = asked_for(question, mine)
    again = turn.before & {s.name for s in mine}
    if again and follows_on(question):  # "And in Lyon?" after get_weather: get_weather
        own = (frozenset(again), *own)
    asked = asked_steps(question)
    planned = len(asked) if len(asked) >= 2 and set(asked) <= names else 0
    calls = steps < max(config.inference.constrained_tool_steps, planned, len(own))
    if not calls:
        return Step(calls=False)
    left = [g for g in own if not g & turn.called]
    if left and not planned:  # a tool of its own the question names, not yet called
        allowed = frozenset().union(*left) | {"call_tool"}
        return Step(calls=True, text=False, exclude=frozenset(names - allowed))
    named = names_a_file(question)
    first = steps == 0
    found_words = (workspace_words(config.workspace, hidden, config.inference.workspace_words)
                   if (first or steps < planned) and config.uses_workspace else None)
    held = _held(question, steps, planned, named, found_words, names, records)
    earlier = _earlier(question, records) if first else ()
    if held is None and first and not planned and found_words is None and (
            config.uses_workspace):
        held = (_named_read(question, names) if named
                else _code_question(question, names, config, hidden, earlier))
    values, barred = held or ((), frozenset())
    nothing_there = not _READERS & names or (found_words is not None and not found_words.files)
    unheld = first and held is None and not named and not planned
    if unheld and found_words is not None and _knowledge(question, found_words):
        if not finds_any(specs, question):
            return Step(calls=False, value=asks_a_number(question))  # knowledge
        barred |= _READERS  # a search for words no file holds finds nothing
    if unheld and nothing_there and not (finds_any(specs, question) or asks_about_now(question)):
        return Step(calls=False)  # no tool its words name, no file to read: knowledge
    if first and "find_tool" in names and not finds_any(specs, question):
        barred |= {"find_tool"}  # a lookup its words find nothing with ("capital of Japan")
    if first and nothing_there:
        barred |= _READERS & names  # an empty workspace: nothing to read, list or search
    if not asks_to_write(question):
        barred |= {"write_file"} & names  # "thank you in German" wrote a file
    if not (code_names(question) or earlier):
        barred |= {"find_definition"} & names  # "Show me error.log.": the example's "Parser"
    must = steps < planned or (first and (named or held is not None))
    if steps < planned:  # the step asked for, and no other
        barred = frozenset(names - {asked[steps], "call_tool"})
    return Step(calls=True, text=not must, exclude=barred, values=values,
                value=asks_a_number(question))


def _knowledge(question: str, found: Holdings) -> bool:
    """Whether a question in a small workspace asks what no file can say: none of its words
    is in the files (:func:`about_the_workspace`), it names no file, folder, tool or code, refers
    to no earlier list and asks nothing of the present moment ("What is the capital of
    Spain?", "Who painted the Mona Lisa?"). Left the choice, the embedded model searched
    the files for "capital" or "Mona Lisa" and answered "No matches"."""
    return bool(found.files) and not (
        about_the_workspace(question, found.words) or names_the_workspace(question)
        or code_names(question) or refers_back(question) or asks_about_now(question))


_LOOKUPS = 2  # find_tool responses of a turn that are not counted as its calling steps


@dataclasses.dataclass(frozen=True, slots=True)
class _SoFar:
    """This turn so far: the responses that only looked a tool up, the tools its calls ran
    (call_tool's inner name), and when the last response looked one up, the tools its
    answer named."""

    lookups: int
    called: frozenset[str]
    found: frozenset[str] | None
    before: frozenset[str] = frozenset()  # the tools the turn before this one called


def _so_far(records: Sequence[Record]) -> _SoFar:
    users = [i for i, r in enumerate(records) if isinstance(r, User)]
    start = users[-1] if users else -1
    before = frozenset(c.tool for r in records[users[-2] if len(users) > 1 else 0:start]
                       if isinstance(r, Assistant) for c in r.tool_calls) if users else frozenset()
    lookups, called = 0, set()
    last: list[str] = []  # the last calling response's find_tool call ids
    found: frozenset[str] | None = None
    for r in records[start + 1:]:
        if isinstance(r, Assistant) and r.tool_calls:
            tools = {c.tool for c in r.tool_calls}
            called |= tools
            lookups += tools == {"find_tool"}
            last = [c.id for c in r.tool_calls] if tools == {"find_tool"} else []
            found = None
        elif isinstance(r, ToolResult) and r.tool_call_id in last:
            found = (found or frozenset()) | frozenset(_LISTED.findall(r.content))
    return _SoFar(lookups, frozenset(called), found, before)


_LISTED = re.compile(r"^- ([^\s:]+): ", re.MULTILINE)  # a tool in find_tool's answer


# The tools that read the workspace, which a question about its code or the project may call.
_READERS = frozenset({"read_file", "list_dir", "search_files", "outline_file",
                      "find_definition"})
_TREE = 500  # a workspace with more entries than this: paths are not held


def _earlier(question: str, records: Sequence[Record]) -> tuple[str, ...]:
    """The code names of the question before this one, when this one names code by it
    ("Are the keys of that class case-sensitive?"): left the choice, the embedded model
    called find_definition for "case" and answered with its not-defined sentence."""
    if not refers_to_code(question) or code_names(question):
        return ()
    asked = [r.content for r in records if isinstance(r, User)]
    return code_names(asked[-2]) if len(asked) > 1 else ()


def _code_question(question: str, names: set[str], config: Config, hidden: Sequence[str],
                   earlier: tuple[str, ...] = ()) -> tuple[Values, frozenset[str]] | None:
    """The first call of a question about the code or the project in a workspace too big
    to tell by its words: one of the tools that read the workspace (not a search for a
    tool, not a write); a find_definition or search of the code names it says ("Where is
    the class Context defined?": Context); a read, outline or listing of a file or folder
    that is there (not a made-up path) when the workspace has at most :data:`_TREE` entries;
    a question asking for one of those tools by its verb ("Read the Makefile.") gets that
    one (find_definition was called for the Makefile's test target); one that names no
    code gets no find_definition (it was called for "What is the version of this
    project?", and the answer made up).
    An ``earlier`` question's names ("that class"): its definition, found again.
    None: not such a question."""
    terms = code_names(question) or earlier
    readers = _READERS & names
    if earlier and terms == earlier and "find_definition" in readers:
        readers = frozenset({"find_definition"})
    if not readers or not (terms or about_the_project(question)):
        return None
    asked = asked_steps(question)
    if len(asked) == 1 and asked[0] in readers:  # "Read the Makefile.": that reader only
        readers = frozenset(asked)
    elif terms and asks_what_uses(question) and "search_files" in readers:
        readers = frozenset({"search_files"})  # "Which files use X?": where X is, not its def
    elif not terms and (folders := _named_folders(question, config, hidden)) and (
            "list_dir" in readers):  # "Which Python files are in actors/inference?"
        return (("list_dir", "path" + REQUIRED, folders),), frozenset(
            names - {"list_dir", "call_tool"})
    elif not terms and len(readers) > 1:  # no name to find ("What is the version?")
        readers -= {"find_definition"}
        manifest = _manifest(config, hidden) if asks_the_version(question) else None
        if manifest and "search_files" in readers:  # the version: its line in the manifest
            return ((("search_files", "pattern", (_VERSION_LINE,)),
                     ("search_files", "path" + REQUIRED, (manifest,))),
                    frozenset(names - {"search_files", "call_tool"}))
    values: Values = ()
    if terms:
        values += (("find_definition", "name", terms), ("find_definition", "path", ()),
                   ("search_files", "pattern", terms))
    try:
        entries, more = Workspace(config.workspace, hidden).tree(_TREE)
    except (OSError, LoopdError):
        entries, more = [], True
    files = tuple(e.path for e in entries if e.size is not None)
    if not more and files:
        folders = (".", *(e.path for e in entries if e.size is None))
        values += (("read_file", "path", files), ("outline_file", "path", files),
                   ("list_dir", "path", folders), ("search_files", "path", folders))
    return values, frozenset(names - readers - {"call_tool"})


# The files that say a project's version, in the order one is read: its manifest (in a
# source distribution, PKG-INFO), at the workspace's top.
_MANIFESTS = ("pyproject.toml", "package.json", "Cargo.toml", "setup.cfg", "setup.py",
              "PKG-INFO", "build.gradle", "build.gradle.kts", "composer.json", "mix.exs")


def _manifest(config: Config, hidden: Sequence[str]) -> str | None:
    """The first of :data:`_MANIFESTS` at the workspace's top, or None."""
    try:
        entries, _ = Workspace(config.workspace, hidden).tree(_TOP)
    except (OSError, LoopdError):
        return None
    top = {e.path for e in entries if e.size is not None and "/" not in e.path}
    return next((m for m in _MANIFESTS if m in top), None)


_TOP = 256  # entries looked at for a manifest (breadth first: the top level's come first)
# A manifest's version line: "Version: 0.15.3" (PKG-INFO), version = "0.1.0" (TOML, setup.cfg),
# "version": "1.2.0" (JSON), version="2.0" (a setup script), not "Metadata-Version: 2.4". Read
# whole, a PKG-INFO holding the README gave the TOML spec's "1.1.0" as the version.
_VERSION_LINE = r"""^\s*["']?(?:__)?version(?:__)?["']?\s*[:=]"""


# a folder as a question names it: a path with a slash (actors/inference, src/), or a word
# before "folder" or "directory" (the tests folder)
_FOLDER = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]*|[\w.-]+(?=\s+(?:folder|directory|"
                     r"dir)\b))", re.IGNORECASE)


def _named_folders(question: str, config: Config, hidden: Sequence[str]) -> tuple[str, ...]:
    """The folders ``question`` names that are there ("Which Python files are in
    actors/inference?": actors/inference). Left the choice on a real repository, the
    embedded model listed the top folder and named its entries as that folder's files."""
    out: list[str] = []
    workspace = Workspace(config.workspace, hidden)
    for name in _FOLDER.findall(question):
        path = name.strip("/").removeprefix("./")
        if not path or path in out:
            continue
        try:
            workspace.open_dir(path).close()
        except (OSError, LoopdError, Refused):  # not a folder, not there, outside, hidden
            continue
        out.append(path)
    return tuple(out)


def _named_read(question: str, names: set[str]) -> tuple[Values, frozenset[str]] | None:
    """The first call of a question that names a file, in a workspace too big to tell by
    its words: a read or an outline of that file (a read when it says "read"), as named (it
    may not be there; the tool says so), and no other call. None: it asks for another tool
    or several by their verbs, or for a size.
    Left the choice, the embedded model called find_definition for a file's text and
    answered from nothing."""
    paths = tuple(dict.fromkeys(p.removeprefix("./") for p in named_files(question)))
    asked = asked_steps(question)
    allowed = ({"read_file"} if asked else {"read_file", "outline_file"}) & names
    if not paths or not allowed or asked not in ((), ("read_file",)) or asks_a_size(question):
        return None
    values: Values = (("read_file", "path", paths), ("outline_file", "path", paths))
    return values, frozenset(names - allowed - {"call_tool"})


def _held(
    question: str, done: int, planned: int, named: bool, found: Holdings | None,
    names: set[str], records: Sequence[Record],
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
    if not (first or done < planned) or found is None:
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
