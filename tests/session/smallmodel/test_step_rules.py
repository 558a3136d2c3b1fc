"""The step rules for any tools (actors/session/smallmodel/step_rules.py), against the fake
llama-server: each request's grammar says what that response may be.

- a message that needs no tool ("Reply with OK." after pasted notes, arithmetic, a
  greeting) gets no call, on an empty workspace and on one whose files hold its words;
- a tool found with find_tool can be called in the same turn, and only what it found;
- a question that names tools of the person's own gets a call of each, one step each;
- on a workspace too big to tell by its words, a question about the code or the project
  gets a call of the tools that read the workspace first, the names it says held;
- the embedded system prompt has no worked answer a model could copy.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from actors.base.config import EmbeddedConfig
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.tools.protocol.standard_specs import STANDARD_SPECS
from actors.tools.registry import Registry
from tests.support.fake_llama import answer
from tests.support.turn_rig import Rig, ScriptedPort

Make = Callable[..., Rig]

_ONE = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
OWN = [
    ToolSpec("get_weather", "The weather now in a city.", _ONE),
    ToolSpec("list_tickets", "Support tickets with a status.",
             {"type": "object", "properties": {"status": {"type": "string"}}}),
    ToolSpec("convert_units", "Convert a value between units.",
             {"type": "object", "properties": {"value": {"type": "number"}}}),
]


def _ran(tool: str, arguments: Mapping[str, Any]) -> wire.Answer:
    return wire.Result(id=0, content=f"{tool} ran", class_=ResultClass.PUBLIC, untrusted=False)


def _rig(rig: Make, script: list[Any], workspace: Path, specs: list[ToolSpec],
         cap: int = 65536) -> tuple[Rig, ScriptedPort]:
    port = ScriptedPort(_ran, specs)
    r = rig(script, Registry([port]))
    workspace.mkdir(exist_ok=True)  # not the rig's folder: its log would count as a file
    r.config = r.config.replace("inference", constrained_calls="on", bare_json_tool_calls="on",
                                workspace_words=cap).replace("tools", workspace=str(workspace))
    r.runtime = dataclasses.replace(r.runtime, config=r.config)
    return r, port


def _rules(body: Mapping[str, Any]) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in str(body["grammar"]).splitlines()
                if " ::= " in line)


def _call(name: str, **arguments: Any) -> str:
    return "TOOL " + json.dumps({"name": name, "arguments": arguments})


TEXT_ONLY, CALL_ONLY, VALUE_ONLY = '"ANSWER " text', '"TOOL " call', '"ANSWER: " text'
CHOICE = '"TOOL " call | "ANSWER " text'
NOTES = ("Notes from Monday: the red box on shelf 12 holds 33 screws, the blue box on shelf "
         "3 holds nails, and Omar Haddad checks the stock on Fridays. ")


def test_a_message_that_needs_no_tool_gets_no_call(rig: Make, tmp_path: Path) -> None:
    empty, small = tmp_path / "empty", tmp_path / "small"
    small.mkdir()
    (small / "staff.csv").write_text("name,city\nOmar Haddad,Lyon\n")

    def first(question: str, workspace: Path) -> str:
        r, _ = _rig(rig, [answer("ANSWER OK.")], workspace, list(STANDARD_SPECS.values()))
        r.turn(question)
        return _rules(r.fake.requests[0])["root"]

    for workspace in (empty, small):
        for question in (NOTES + "Reply with OK.", "Hello!", NOTES + "Good morning!",
                         "Just answer with yes or no.",
                         "Thanks, that helps. No need to look anything up: just say OK.",
                         "Don't search anything, just reply with yes."):
            assert first(question, workspace) == TEXT_ONLY, (question, workspace)
        # arithmetic: a value after "ANSWER: " (after "ANSWER " the embedded model ended a
        # number after its first digit: "What is 9 plus 8?" -> "1")
        for question in ("What is 12 plus 30?", "What is 15 minus 6?", NOTES + "What is 3 * 11?"):
            assert first(question, workspace) == VALUE_ONLY, (question, workspace)
    # a question about the notes' words is still about the files (a call first)
    assert first("Where does Omar Haddad work?", small) == CALL_ONLY
    # an ask that names a file or a tool's verb is not one that needs none
    for question in ("Reply with what staff.csv says.", "Say which files are there.",
                     "Read the notes, then reply with OK."):
        assert first(question, small) != TEXT_ONLY, question


def test_a_tool_found_with_find_tool_can_be_called_in_the_same_turn(
    rig: Make, tmp_path: Path
) -> None:
    script = [answer(_call("find_tool", query="weather")),
              answer(_call("get_weather", city="Oslo")), answer("ANSWER It rains in Oslo.")]
    r, port = _rig(rig, script, tmp_path / "ws", OWN)
    assert r.turn("Is it raining in Oslo?").content == "It rains in Oslo."
    assert [c[2] for c in port.calls] == ["get_weather"]
    first, second, third = (_rules(body) for body in r.fake.requests)
    assert first["root"] == CHOICE  # "raining" names no tool: the model looks one up
    # what find_tool found (its answer names get_weather) may be called, and nothing else
    assert second["root"] == CALL_ONLY
    assert second["call"] == "call-call-tool | call-get-weather"
    assert third["root"] == TEXT_ONLY
    # a lookup that found nothing: the model may answer, or call anything but find_tool
    r2, _ = _rig(rig, [answer(_call("find_tool", query="zzz")), answer("ANSWER No such tool.")],
                 tmp_path / "ws", OWN)
    r2.turn("Is there a tool for zzz?")
    after = _rules(r2.fake.requests[1])
    assert after["root"] == CHOICE and "call-find-tool" not in after["call"]


def test_a_question_naming_tools_of_its_own_gets_a_call_of_each(
    rig: Make, tmp_path: Path
) -> None:
    script = [answer(_call("get_weather", city="Paris")), answer(_call("list_tickets")),
              answer("ANSWER Cloudy; 3 tickets.")]
    r, port = _rig(rig, script, tmp_path / "ws", OWN)
    r.turn("What is the weather in Paris, and how many tickets are open?")
    assert [c[2] for c in port.calls] == ["get_weather", "list_tickets"]
    first, second, third = (_rules(body) for body in r.fake.requests)
    assert first["root"] == second["root"] == CALL_ONLY
    assert first["call"] == "call-call-tool | call-get-weather | call-list-tickets"
    assert second["call"] == "call-call-tool | call-list-tickets"  # the one not yet called
    assert third["root"] == TEXT_ONLY
    # a short follow-up asks the last turn's tool again ("And in Lyon?")
    r3, port3 = _rig(rig, [answer(_call("get_weather", city="Oslo")), answer("ANSWER Rain."),
                           answer(_call("get_weather", city="Lyon")), answer("ANSWER Sun.")],
                     tmp_path / "ws", OWN)
    r3.turn("What is the weather in Oslo?")
    r3.turn("And in Lyon?")
    again = _rules(r3.fake.requests[2])
    assert again["root"] == CALL_ONLY and again["call"] == "call-call-tool | call-get-weather"
    assert [c[3] for c in port3.calls] == [{"city": "Oslo"}, {"city": "Lyon"}]
    # a question that names none of them and asks nothing of now, with nothing to read,
    # gets no call (it called the one tool left); one that asks of now keeps the choice,
    # but a lookup its words cannot find anything with is not offered
    r2, _ = _rig(rig, [answer("ANSWER Tokyo.")], tmp_path / "ws", OWN)
    r2.turn("What is the capital of Japan?")
    assert _rules(r2.fake.requests[0])["root"] == TEXT_ONLY
    r6, _ = _rig(rig, [answer("ANSWER Rain.")], tmp_path / "ws", OWN)
    r6.turn("Is it windy in Bergen at the moment?")
    free = _rules(r6.fake.requests[0])
    assert free["root"] == CHOICE and "call-find-tool" not in free["call"]
    # an empty workspace has nothing to read, list or search
    r5, _ = _rig(rig, [answer("ANSWER Tokyo.")], tmp_path / "empty",
                 [*STANDARD_SPECS.values(), *OWN])
    r5.turn("Is the printer on floor 2 fixed today?")
    assert not {"call-read-file", "call-list-dir", "call-search-files",
                "call-find-definition"} & set(_rules(r5.fake.requests[0])["call"].split(" | "))
    for question in ("What is the capital of Japan?", "Who wrote Hamlet?"):
        r7, _ = _rig(rig, [answer("ANSWER Tokyo.")], tmp_path / "empty",
                     [*STANDARD_SPECS.values(), *OWN])
        r7.turn(question)
        assert _rules(r7.fake.requests[0])["root"] == TEXT_ONLY, question
    # a workspace with files keeps the choice: its files may hold the answer
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "atlas.md").write_text("Japan: Tokyo\n")
    r8, _ = _rig(rig, [answer("ANSWER Tokyo.")], tmp_path / "full",
                 [*STANDARD_SPECS.values(), *OWN])
    r8.turn("What is the capital of Japan?")
    assert _rules(r8.fake.requests[0])["root"] != TEXT_ONLY
    r4, _ = _rig(rig, [answer("ANSWER Fine.")], tmp_path / "ws", OWN)
    r4.turn("Which city is it sunny in?")  # "city": get_weather's description: a lookup
    assert "call-find-tool" in _rules(r4.fake.requests[0])["call"]


def test_a_code_question_on_a_big_workspace_reads_the_workspace_first(
    rig: Make, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "parser.py").write_text("class Context:\n    pass\n")
    (ws / "README.md").write_text("A parser.\n")
    specs = [*STANDARD_SPECS.values(), *OWN]

    def first(question: str) -> dict[str, str]:
        # workspace_words 10: too big to tell by its words, as a real repository is
        r, _ = _rig(rig, [answer(_call("list_dir")), answer("ANSWER Done.")], ws, specs, cap=10)
        r.turn(question)
        return _rules(r.fake.requests[0])

    where = first("Where is the class Context defined?")
    assert where["root"] == CALL_ONLY
    assert set(where["call"].split(" | ")) == {
        "call-call-tool", "call-find-definition", "call-list-dir", "call-outline-file",
        "call-read-file", "call-search-files"}  # not a write, a lookup nor a tool of its own
    assert where["find-definition-args-name"] == '"\\"Context\\""'
    assert where["read-file-args-path"] == '"\\"README.md\\"" | "\\"pkg/parser.py\\""'
    project = first("What does this project do?")
    assert project["root"] == CALL_ONLY and "call-write-file" not in project["call"]
    # no name to find: no find_definition (it was called for the version)
    assert "call-find-definition" not in project["call"]
    assert "call-find-definition" not in first("What is the version of this project?")["call"]
    # a folder it names that is there: a listing of that folder, its path given (left the
    # choice, the model listed the top folder and named its entries as the folder's files)
    for question in ("Which files are in the pkg folder?", "Which Python files are in pkg/?"):
        folder = first(question)
        assert folder["root"] == CALL_ONLY and folder["call"] == "call-call-tool | call-list-dir"
        assert folder["list-dir-args-path"] == '"\\"pkg\\""'
        assert ")?" not in folder["list-dir-args"]
    assert "call-read-file" in first("Which files are in the src folder?")["call"]  # not there
    assert first("What is the capital of France?")["root"] == CHOICE
    assert first("What is 3 plus 4?")["root"] == VALUE_ONLY
    # a file the question names is read (or outlined) as named, and nothing else is called:
    # it may not be there, and the tool says so (find_definition was called for one)
    shown = first("Show me docs/roadmap.md.")
    assert shown["root"] == CALL_ONLY
    assert set(shown["call"].split(" | ")) == {"call-call-tool", "call-read-file",
                                               "call-outline-file"}
    assert shown["read-file-args-path"] == '"\\"docs/roadmap.md\\""'
    assert first("How big is pkg/parser.py?")["root"] == CALL_ONLY  # a size: a listing may say
    # one reader asked for by its verb: that one ("Read the Makefile." called find_definition)
    made = first("Which command does the test target run? Read the Makefile.")
    assert made["root"] == CALL_ONLY and made["call"] == "call-call-tool | call-read-file"
    readme = first("Read README.md and tell me what it is for.")
    assert readme["call"] == "call-call-tool | call-read-file"
    assert readme["read-file-args-path"] == '"\\"README.md\\""'
    assert "call-list-dir" in first("How big is pkg/parser.py?")["call"]


def test_the_embedded_system_prompt_has_no_worked_answer_to_copy() -> None:
    system = EmbeddedConfig().system
    examples = [line for line in system.splitlines() if line.startswith("Q: ")]
    assert len(examples) >= 6
    # a call, or the word ANSWER alone: never text a reply could copy
    assert all(" A: TOOL {" in line or line.endswith(" A: ANSWER") for line in examples)
    assert any(line.endswith(" A: ANSWER") for line in examples)
    assert not re.search(r"A: ANSWER \S", system)
    for leaked in ("2 plus 2 is 4", "Shakespeare", "Grass is green", "gracias", "Hamlet was"):
        assert leaked not in system
    assert "only when the question is about the workspace" not in system
    # the rule "a fact you cannot know yourself ... answer everything else yourself" made the
    # model describe a file it had read in made-up words instead of what it says
    assert "cannot know yourself" not in system
    assert "reply yourself" in system  # "reply" alone: "What is 5 plus 7?" -> "10"


def _one_file(tmp_path: Path, name: str, text: str) -> Path:
    """A small workspace of one file."""
    small = tmp_path / "small"
    small.mkdir()
    (small / name).write_text(text)
    return small


def _first_rules(rig: Make, workspace: Path, question: str, cap: int = 65536) -> dict[str, str]:
    """The grammar rules of the first request of a turn asking ``question`` on ``workspace``
    with the standard tools (``cap``: inference.workspace_words)."""
    r, _ = _rig(rig, [answer("ANSWER Fine.")], workspace, list(STANDARD_SPECS.values()), cap=cap)
    r.turn(question)
    return _rules(r.fake.requests[0])


def test_that_class_is_the_class_of_the_question_before(rig: Make, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "models.py").write_text("class Headers:\n    pass\n")
    found = answer("TOOL " + json.dumps({"name": "find_definition",
                                         "arguments": {"name": "Headers"}}))
    script = [found, answer("ANSWER In models.py."), found, answer("ANSWER No.")]
    r, _ = _rig(rig, script, ws, list(STANDARD_SPECS.values()), cap=10)
    r.turn("Where is the class Headers defined?")
    r.turn("Are the keys of that class case-sensitive?")
    # its definition again, the only call (the embedded model called find_definition for
    # "case", from "class case-sensitive", and answered with its not-defined sentence)
    follow = _rules(r.fake.requests[2])
    assert follow["root"] == CALL_ONLY
    assert follow["call"] == "call-call-tool | call-find-definition"
    assert follow["find-definition-args-name"] == '"\\"Headers\\""'


def test_a_question_no_file_of_a_small_workspace_can_answer_reads_nothing(
    rig: Make, tmp_path: Path
) -> None:
    small = _one_file(tmp_path, "staff.csv", "name,city\nOmar Haddad,Lyon\n")
    # none of its words in the files, none in a tool's: the embedded model searched for
    # "capital" or "Mona Lisa", or looked a tool up, and answered "No matches"
    for question in ("What is the capital of Spain?", "Who painted the Mona Lisa?"):
        assert _first_rules(rig, small, question)["root"] == TEXT_ONLY, question
    # a number of units in another: a value, after "ANSWER: " (the 0.5B cut "120" to "12")
    assert _first_rules(rig, small, "How many days are in a week?")["root"] == VALUE_ONLY
    ws = tmp_path / "big"
    ws.mkdir()
    (ws / "a.py").write_text("x = 1\n")
    r, _ = _rig(rig, [answer("ANSWER: 120")], ws, list(STANDARD_SPECS.values()), cap=1)
    r.turn("How many minutes are in two hours?")  # too big to tell: the choice, a value
    assert _rules(r.fake.requests[0])["root"] == '"TOOL " call | "ANSWER: " text'
    assert _first_rules(rig, small, "How many files are in the folder?")["root"] == CHOICE
    # a word the files hold, a file, folder or tool named, an earlier list, the present
    # moment: the choice (or a call) as before
    for question in ("Where does Omar Haddad work?", "What is in the folder?",
                     "What does the second one say?", "Is it raining in Lyon right now?",
                     "Search for the capital of Spain."):
        assert _first_rules(rig, small, question)["root"] != TEXT_ONLY, question
    # a word of a tool's description but none of the files: no reading, the rest may be
    rules = _first_rules(rig, small, "Run the command date.")
    assert "call-run-command" in rules["call"] and "call-read-file" not in rules["call"]
    fetch = _first_rules(rig, small, "What does the page at example.org say?")
    assert fetch["root"] != TEXT_ONLY


def test_a_question_without_a_verb_of_writing_may_not_call_write_file(
    rig: Make, tmp_path: Path
) -> None:
    small = _one_file(tmp_path, "todo.txt", "[ ] book a dentist appointment\n")

    # the embedded model wrote thank-you.md for this one and answered the denied write
    german = _first_rules(rig, small, "How do you say thank you in German?")
    assert german["root"] == CHOICE and "call-write-file" not in german["call"]
    assert "call-read-file" not in german["call"]  # no word of it in the files
    for question in ("Save the text call mum to reminder.txt.",
                     "Make a file list.txt with the text: eggs",
                     "Create a file hello.txt with the text: Hello, world"):
        assert "call-write-file" in _first_rules(rig, small, question)["call"], question


def test_a_question_that_names_no_code_may_not_call_find_definition(
    rig: Make, tmp_path: Path
) -> None:
    small = _one_file(tmp_path, "app.log", "10:42 database down\n")

    # the embedded model called find_definition("Parser"), the system prompt's example, for
    # the first and find_definition("Planet") for the second
    rules = _first_rules(rig, small, "Show me error.log.")
    assert "call-find-definition" not in rules["call"] and "call-read-file" in rules["call"]
    # (the planet: no word of it in the files, nor in a tool's: no call at all)
    assert _first_rules(rig, small, "What is the largest planet?")["root"] == TEXT_ONLY
    code = _first_rules(rig, small, "Where is the class Parser defined?")
    assert "call-find-definition" in code["call"]


def _big_first(rig: Make, workspace: Path, question: str) -> dict[str, str]:
    """The first request's rules for ``question`` on ``workspace`` as a workspace too big to
    tell by its words (a real repository), with the standard tools."""
    return _first_rules(rig, workspace, question, cap=10)


def test_a_question_about_what_uses_a_name_gets_a_search(rig: Make, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "items.py").write_text("class Whitespace:\n    pass\n")
    (ws / "pkg" / "api.py").write_text("from pkg.items import Whitespace\n")

    # the embedded model called find_definition for it and answered with the defining file
    for question in ("Which files use the class Whitespace?", "Where is Whitespace used?",
                     "What imports Whitespace?"):
        rules = _big_first(rig, ws, question)
        assert rules["root"] == CALL_ONLY, question
        assert rules["call"] == "call-call-tool | call-search-files", question
        assert rules["search-files-args-pattern"] == '"\\"Whitespace\\""', question
    assert "call-find-definition" in _big_first(rig, ws, "Where is Whitespace defined?")["call"]
    # what it is for is its definition's docstring, not its uses
    for question in ("What is the class Whitespace used for?", "What can I use Whitespace for?"):
        assert "call-find-definition" in _big_first(rig, ws, question)["call"], question


def test_a_question_about_the_version_searches_the_manifest(rig: Make, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "setup.py").write_text("version = '9'\n")  # not at the top: not this one
    (ws / "README.md").write_text("A parser.\n")
    (ws / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.4.2\n")

    # left the choice, the embedded model listed the top folder and answered with a size;
    # given PKG-INFO whole (the README in it), it answered the TOML spec's version
    rules = _big_first(rig, ws, "What is the version of this project?")
    assert rules["root"] == CALL_ONLY and rules["call"] == "call-call-tool | call-search-files"
    assert rules["search-files-args-path"] == '"\\"PKG-INFO\\""'
    # the path must be given: left out, the search ran over every file (136 lines, "1.4.2")
    assert ")?" not in rules["search-files-args"]
    literal = rules["search-files-args-pattern"]  # a GBNF literal of the JSON string
    pattern = json.loads(re.sub(r"\\(.)", r"\1", literal[1:-1]))
    assert re.search(pattern, "Version: 1.4.2", re.IGNORECASE)
    assert not re.search(pattern, "Metadata-Version: 2.1", re.IGNORECASE)
    for line in ('version = "0.1.0"', '  "version": "1.2.0",', '    version="2.0",',
                 '__version__ = "1.0"'):
        assert re.search(pattern, line, re.IGNORECASE), line
    (ws / "pyproject.toml").write_text('[project]\nversion = "1.4.2"\n')
    rules = _big_first(rig, ws, "Which version is this?")
    assert rules["search-files-args-path"] == '"\\"pyproject.toml\\""'
    # a version the project needs is no version line ("Requires-Python: >=3.10"), nor is
    # a version the question names
    for question in ("Which Python version does it require?", "What changed in version 2.0?"):
        assert "call-read-file" in _big_first(rig, ws, question)["call"], question
    (ws / "pyproject.toml").unlink()
    (ws / "PKG-INFO").unlink()
    # no manifest: any reader but find_definition, as before
    rules = _big_first(rig, ws, "What is the version of this project?")
    assert "call-list-dir" in rules["call"] and "call-find-definition" not in rules["call"]
