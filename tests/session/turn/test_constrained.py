"""inference.constrained_calls: requests carry the answer grammar, and both call paths work.

Against the fake llama-server, which records every request body: with the setting on, each
request of a turn carries ``grammar`` (naming every tool that can be called) with
``tool_choice: "none"`` and the same ``tools`` and messages as without it; off, neither
field is sent. Both ways a call can come back still work: a call the model wrote as bare
JSON in the content (what the grammar makes it write) runs as that call, and the native
``tool_calls`` of the recordings in tests/fixtures/http run as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from actors.base.config import GENERAL_SYSTEM, parse
from actors.base.events import Content
from actors.log.records import Assistant, ToolResult
from actors.session.smallmodel import grammar as grammar_module
from actors.session.smallmodel.grammar import TOTAL_CAP
from actors.tools.port import HostLauncher, PortSettings, ToolPort, start_port
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass
from actors.tools.protocol.standard_specs import STANDARD_SPECS
from actors.tools.registry import META_TOOLS, Registry
from tests.support.fake_llama import FakeLlama, answer, replay
from tests.support.recordings import FIXTURES
from tests.support.turn_rig import Rig, ScriptedPort

Make = Callable[..., Rig]


def _constrained(r: Rig, on: bool = True) -> Rig:
    word = "on" if on else "off"
    r.config = r.config.replace("inference", constrained_calls=word, bare_json_tool_calls=word)
    r.runtime = dataclasses.replace(r.runtime, config=r.config)
    return r


def test_every_request_carries_the_grammar_when_the_config_asks(rig: Make) -> None:
    # what the grammar makes the model write: the decision word, then the call or the text
    bare = '{"name": "call_tool", "arguments": {"name": "echo", "arguments": {"text": "hi"}}}'
    r = _constrained(rig([answer("TOOL " + bare), answer("ANSWER It said hi.")]))
    outcome = r.turn("Echo hi.")
    assert outcome.content == "It said hi."
    # the word is loopd's: neither the log nor the streamed answer has it, and the call
    # after TOOL is a call, never answer text
    said = [x.content for x in r.records if isinstance(x, Assistant)]
    assert said == [None, "It said hi."]
    assert "".join(e.text for e in r.events if isinstance(e, Content)) == "It said hi."
    assert len(r.fake.requests) == 2
    for body in r.fake.requests:
        assert body["tool_choice"] == "none" and "grammar" in body
        assert body["tools"] == [dict(t) for t in json.loads(json.dumps(META_TOOLS))]
    grammar = r.fake.requests[0]["grammar"]
    assert grammar.startswith('root ::= "TOOL " call | "ANSWER " text\n')
    for name in ("find_tool", "call_tool", "echo"):
        assert f'"{{\\"name\\": \\"{name}\\", \\"arguments\\": "' in grammar, name
    # the bare-JSON call ran: its result is what the second request ends with
    (result,) = [x for x in r.records if isinstance(x, ToolResult)]
    assert result.content == "hi"
    assert r.fake.requests[1]["messages"][-1]["content"] == "hi"


def test_no_grammar_and_no_tool_choice_when_the_setting_is_off(rig: Make) -> None:
    r = _constrained(rig([answer("Hello.")]), on=False)
    r.turn("Hi")
    (body,) = r.fake.requests
    assert "grammar" not in body and "tool_choice" not in body


def test_the_grammar_changes_nothing_else_in_the_request(rig: Make) -> None:
    on = _constrained(rig([answer("Hello.")]))
    off = _constrained(rig([answer("Hello.")]), on=False)
    on.turn("Hi")
    off.turn("Hi")
    with_grammar = {k: v for k, v in on.fake.requests[0].items()
                    if k not in ("grammar", "tool_choice")}
    assert with_grammar == off.fake.requests[0]


def test_the_native_tool_call_path_still_works_with_the_grammar_on(rig: Make) -> None:
    # tool_session.http: the real model's find_tool and call_tool as native tool_calls,
    # then an answer that repeats calls as JSON lines (not one call: it stays the answer).
    r = _constrained(rig(replay(FIXTURES / "tool_session.http"), Registry([ScriptedPort()])))
    outcome = r.turn("What is in notes.txt?")
    calls = [c.name for x in r.records if isinstance(x, Assistant) for c in x.tool_calls]
    assert calls == ["find_tool", "call_tool"]
    assert outcome.tool_calls == 2 and outcome.content.startswith('{"name": "find_tool"')
    assert all("grammar" in body for body in r.fake.requests)


def test_the_native_path_without_the_grammar(rig: Make) -> None:
    r = _constrained(rig(replay(FIXTURES / "tool_session.http"), Registry([ScriptedPort()])),
                     on=False)
    r.turn("What is in notes.txt?")
    calls = [c.name for x in r.records if isinstance(x, Assistant) for c in x.tool_calls]
    assert calls == ["find_tool", "call_tool"]
    assert not any("grammar" in body for body in r.fake.requests)


def test_a_registry_tool_called_by_its_own_name_goes_through_call_tool(rig: Make) -> None:
    port = ScriptedPort()
    r = _constrained(rig([answer('{"name": "echo", "arguments": {"text": "yo"}}'),
                          answer("Done.")], Registry([port])))
    r.turn("Echo yo.")
    assert [c[2:] for c in port.calls] == [("echo", {"text": "yo"})]
    (asked,) = [x for x in r.records if isinstance(x, Assistant) and x.tool_calls]
    assert asked.tool_calls[0].name == "call_tool" and asked.content is None


def test_auto_is_off_for_a_server_named_by_url_and_on_turns_on_bare_json(tmp_path: Path) -> None:
    from actors.session.world import start_world

    with FakeLlama([]) as fake:
        base = parse({"log": {"dir": str(tmp_path / "s")}, "tools": {"standard": False},
                      "inference": {"url": fake.url}})
        with start_world(base) as world:
            inference = world.runtime.config.inference
            assert not inference.constrained_calls and not inference.bare_json_tool_calls
        on = base.replace("inference", constrained_calls="on", bare_json_tool_calls="off")
        with start_world(on) as world:
            inference = world.runtime.config.inference
            assert inference.constrained_calls and inference.bare_json_tool_calls


def _steps(r: Rig, steps: int) -> Rig:
    inference = dataclasses.replace(r.config.inference, constrained_tool_steps=steps)
    config = dataclasses.replace(r.config, inference=inference)
    r.runtime = dataclasses.replace(r.runtime, config=config)
    return r


def _echo(text: str) -> str:
    return json.dumps({"name": "echo", "arguments": {"text": text}})


def test_after_the_allowed_tool_steps_the_grammar_asks_for_text_only(rig: Make) -> None:
    r = _steps(_constrained(rig([answer(_echo("a")), answer("It said a.")])), 1)
    assert r.turn("Echo a.").content == "It said a."
    first, second = (body["grammar"] for body in r.fake.requests)
    assert first.startswith('root ::= "TOOL " call | "ANSWER " text\n')
    assert second.startswith('root ::= "ANSWER " text\n') and "call-echo" not in second
    # a new turn may call a tool again
    r2 = _steps(_constrained(rig([answer(_echo("a")), answer(_echo("b")), answer("Done.")])), 2)
    r2.turn("Echo a, then b.")
    grammars = [body["grammar"].split("\n", 1)[0] for body in r2.fake.requests]
    calls, text = 'root ::= "TOOL " call | "ANSWER " text', 'root ::= "ANSWER " text'
    assert grammars == [calls, calls, text]


def test_the_embedded_model_gets_its_own_system_prompt_and_pinned_tools(rig: Make) -> None:
    from actors.session.world import World
    from actors.tools.protocol.standard_specs import STANDARD_SPECS

    r = rig([], Registry([ScriptedPort(specs=list(STANDARD_SPECS.values()))]))
    # the workspace map after the prompt is tests/session/test_world.py's
    config = r.config.replace("session", pinned=["echo"]).replace("embedded", workspace_map=0)
    runtime = dataclasses.replace(r.runtime, config=config)
    names = lambda b: [t["function"]["name"] for t in b.tools]  # noqa: E731
    small = World(runtime=runtime, model="m", embedded=True).baseline()
    assert small.system == config.embedded.system
    assert names(small) == ["find_tool", "call_tool", *config.embedded.pinned, "echo"]
    other = World(runtime=runtime, model="m").baseline()
    assert other.system == GENERAL_SYSTEM and names(other) == ["find_tool", "call_tool", "echo"]
    none = dataclasses.replace(runtime, config=config.replace("embedded", system="", pinned=[]))
    plain = World(runtime=none, model="m", embedded=True).baseline()
    assert plain.system == GENERAL_SYSTEM and names(plain) == names(other)
    # a system prompt of the person's own is used on the embedded model too
    own = dataclasses.replace(runtime, config=config.replace("session", system="Be terse."))
    assert World(runtime=own, model="m", embedded=True).baseline().system == "Be terse."


def test_a_question_naming_a_file_gets_a_call_first(rig: Make) -> None:
    r = _constrained(rig([answer("TOOL " + _echo("a")), answer("ANSWER It says a.")]))
    assert r.turn("What does a.txt say?").content == "It says a."
    first, second = (body["grammar"].split("\n", 1)[0] for body in r.fake.requests)
    assert first == 'root ::= "TOOL " call'  # no text: the model may not guess the file
    assert second == 'root ::= "ANSWER " text'
    r2 = _constrained(rig([answer("ANSWER Nothing new.")]))
    r2.turn("What is the news today?")  # no file named: the choice
    assert r2.fake.requests[0]["grammar"].startswith('root ::= "TOOL " call | "ANSWER " text')



def _listed(tool: str, arguments: Mapping[str, Any]) -> wire.Answer:
    """list_dir's answer as the standard tool writes it (any other tool: "ran")."""
    text = "new.txt  6\nstaff.csv  30" if tool == "list_dir" else "ran"
    return wire.Result(id=0, content=text, class_=ResultClass.PUBLIC, untrusted=False)


def test_a_question_with_a_word_of_a_small_workspace_gets_a_call_of_what_it_holds_first(
    rig: Make, tmp_path: Path
) -> None:
    """"In which city does Omar Haddad work?" names no file, but staff.csv holds "Omar":
    the first answer may only be a call. A question whose words no file holds keeps the
    choice, and so does every question when the folder is past inference.workspace_words."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "staff.csv").write_text("name,city\nOmar Haddad,Lyon\n")

    def grammar(question: str, cap: int = 65536) -> str:
        r = _constrained(rig([answer("TOOL " + _echo("a")), answer("ANSWER Done.")],
                             Registry([ScriptedPort(specs=list(STANDARD_SPECS.values()))])))
        r.config = r.config.replace("tools", workspace=str(ws)).replace(
            "inference", workspace_words=cap)
        r.runtime = dataclasses.replace(r.runtime, config=r.config)
        r.turn(question)
        return str(r.fake.requests[0]["grammar"])

    def first(question: str, cap: int = 65536) -> str:
        return grammar(question, cap).split("\n", 1)[0]

    call_only, choice = 'root ::= "TOOL " call', 'root ::= "TOOL " call | "ANSWER " text'
    assert first("In which city does Omar Haddad work?") == call_only
    # no word of it in the files, nor in a tool's: knowledge, no call (the embedded model
    # searched for "capital" and answered "No matches")
    assert first("What is the capital of France?") == 'root ::= "ANSWER " text'
    assert first("Which file says where Omar Haddad works?") == call_only
    assert first("In which city does Omar Haddad work?", cap=10) == choice  # too big to tell
    assert first("In which city does Omar Haddad work?", cap=0) == choice  # off
    (ws / "new.txt").write_text("Berlin")  # a file written since counts at the next turn
    assert first("Who lives in Berlin?") == call_only
    assert first("What does the second one say?") == call_only  # an earlier list's file
    # after a listing, "the second one" is its second entry: the only file it may read
    r = _constrained(rig([answer("TOOL " + json.dumps({"name": "list_dir", "arguments": {}})),
                          answer("ANSWER staff.csv and new.txt."),
                          answer("TOOL " + _echo("a")), answer("ANSWER Done.")],
                         Registry([ScriptedPort(_listed, list(STANDARD_SPECS.values()))])))
    r.config = r.config.replace("tools", workspace=str(ws)).replace(
        "inference", workspace_words=65536)
    r.runtime = dataclasses.replace(r.runtime, config=r.config)
    r.turn("Which files are there?")
    r.turn("What does the second one say?")
    third = dict(line.split(" ::= ", 1) for line in r.fake.requests[2]["grammar"].splitlines()
                 if " ::= " in line)
    assert third["read-file-args-path"] == '"\\"staff.csv\\""'  # the listing's second
    assert third["call"] == "call-call-tool | call-read-file"
    # the call is a search for one of those words, or of a file or folder that is there:
    # not the examples' "apples" nor a made-up path; and no search for a tool
    rules = dict(line.split(" ::= ", 1) for line in grammar(
        "In which city does Omar Haddad work?").splitlines() if " ::= " in line)
    assert rules["search-files-args-pattern"] == (
        '"\\"city\\"" | "\\"Omar\\"" | "\\"Haddad\\"" | "\\"Omar Haddad\\""')
    assert rules["call"] == "call-call-tool | call-search-files"  # not read any file
    assert rules["search-files-args-path"] == '"\\".\\""'
    (ws / "more.txt").write_text("Omar Haddad moved.")  # "city" is now the rarest word
    rules = dict(line.split(" ::= ", 1) for line in grammar(
        "In which city does Omar Haddad work?").splitlines() if " ::= " in line)
    assert rules["search-files-args-pattern"] == '"\\"city\\""'
    (ws / "more.txt").unlink()
    # a question that refers back may read a file that is there (and no other)
    back = dict(line.split(" ::= ", 1) for line in grammar(
        "What does the second one say?").splitlines() if " ::= " in line)
    assert back["read-file-args-path"] == '"\\"new.txt\\"" | "\\"staff.csv\\""'
    assert "call-find-tool" not in back["call"]
    free = dict(line.split(" ::= ", 1) for line in grammar(
        "Is the capital of France in the repo?").splitlines() if " ::= " in line)
    assert free["search-files-args"].startswith('"{" "\\"pattern\\": " string')
    # no lookup either: no tool's name or description holds its words (tests/session/turn/
    # test_step_rules.py); a question with such a word may look one up
    assert "call-find-tool" not in free["call"]
    looked = dict(line.split(" ::= ", 1) for line in grammar(
        "Can you fetch a web page for me?").splitlines() if " ::= " in line)
    assert "call-find-tool" in looked["call"]


def test_a_question_naming_a_file_that_is_there_reads_it_first(rig: Make, tmp_path: Path) -> None:
    """"Which city is in staff.csv?" may only read staff.csv first (not list the folder nor
    search for the examples' "apples"). A file that is not there, a size, or a step asked
    for by its verb leave the call free."""
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "staff.csv").write_text("name,city\nOmar Haddad,Lyon\n")
    (ws / "notes.txt").write_text("hello")

    def rules(question: str) -> dict[str, str]:
        r = _constrained(rig([answer("TOOL " + _echo("a")), answer("ANSWER Done.")],
                             Registry([ScriptedPort(specs=list(STANDARD_SPECS.values()))])))
        r.config = r.config.replace("tools", workspace=str(ws)).replace(
            "inference", workspace_words=65536)
        r.runtime = dataclasses.replace(r.runtime, config=r.config)
        r.turn(question)
        grammar = str(r.fake.requests[0]["grammar"])
        return dict(line.split(" ::= ", 1) for line in grammar.splitlines() if " ::= " in line)

    held = rules("Which city is in staff.csv?")  # by a file name only one file has
    assert held["root"] == '"TOOL " call'
    assert held["call"] == "call-call-tool | call-read-file"
    assert held["call-tool-arguments"] == "call-read-file"
    assert held["read-file-args-path"] == '"\\"data/staff.csv\\""'
    assert held["read-file-args"] == '"{" "\\"path\\": " read-file-args-path "}"'  # no offset
    for free in ("Read prices.csv.", "How big is data/staff.csv?",
                 "Open notes.txt."):
        found = rules(free)
        assert found["read-file-args-path"].startswith('"\\"" ['), free
        assert "call-list-dir" in found["call"], free


def test_a_question_asking_for_two_tools_gets_those_calls_in_that_order(rig: Make) -> None:
    """"Search ..., then read ..." (inference.constrained_tool_steps = 1): the first answer
    may only be a search, the second only a read; then text. One tool asked for keeps the
    usual grammar."""
    port = ScriptedPort(specs=list(STANDARD_SPECS.values()))
    search = json.dumps({"name": "search_files", "arguments": {"pattern": "a"}})
    read = json.dumps({"name": "read_file", "arguments": {"path": "a.txt"}})
    r = _steps(_constrained(rig([answer("TOOL " + search), answer("TOOL " + read),
                                 answer("ANSWER Done.")], Registry([port]))), 1)
    assert r.turn("Search for a, then read the file you found.").content == "Done."
    first, second, third = (
        dict(line.split(" ::= ", 1) for line in body["grammar"].splitlines() if " ::= " in line)
        for body in r.fake.requests)
    assert first["root"] == second["root"] == '"TOOL " call'
    assert first["call"] == "call-call-tool | call-search-files"
    assert second["call"] == "call-call-tool | call-read-file"
    assert third["root"] == '"ANSWER " text'
    r1 = _steps(_constrained(rig([answer("TOOL " + search), answer("ANSWER Done.")],
                                 Registry([port]))), 1)
    r1.turn("Search for a and tell me.")
    first, second = (body["grammar"] for body in r1.fake.requests)
    assert first.startswith('root ::= "TOOL " call | "ANSWER " text\n')
    assert second.startswith('root ::= "ANSWER " text\n')


@contextlib.contextmanager
def _hostile_port() -> Iterator[ToolPort]:
    """A real tool port to :mod:`tests.support.hostile_host` in its own process."""
    workdir = Path(tempfile.mkdtemp(prefix="lt-", dir="/tmp"))
    endpoint = f"ipc://{workdir}/host.sock"
    argv = (sys.executable, "-m", "tests.support.hostile_host", "--bind", endpoint,
            "--parent-pid", str(os.getpid()))
    settings = PortSettings(name="hostile", endpoint=endpoint, timeout_s=10)
    port = start_port(settings, launcher=HostLauncher(argv=argv, log_path=workdir / "host.log"))
    try:
        assert port.wait_ready(60), (workdir / "host.log").read_text(errors="replace")
        yield port
    finally:
        port.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.timeout(300)
def test_a_tool_host_advertising_hostile_schemas_cannot_stall_the_turn(
    rig: Make, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The attack: a host whose tool has 10,000 optional properties (the old grammar was
    quadratic: the turn never finished and ignored SIGTERM), one nested 28 levels deep
    (exponential) and one with required: 5 (a TypeError that ended the turn). The turn
    answers; every request's grammar is capped, the hostile tools' arguments are plain JSON
    (said once), the ordinary tool is still held to its schema; and the grammar is built
    once for the turn's requests, not per request."""
    builds = []
    real = grammar_module.build_grammar
    monkeypatch.setattr(grammar_module, "build_grammar",
                        lambda *a, **k: builds.append(1) or real(*a, **k))
    monkeypatch.setattr(grammar_module, "_SAID", set())  # said once per process: this one
    call = '{"name": "call_tool", "arguments": {"name": "fine", "arguments": {"text": "x"}}}'
    with _hostile_port() as port:
        assert {s.name for s in port.specs()} == {"wide", "deep", "odd", "fine"}
        r = _constrained(rig([answer("TOOL " + call), answer("ANSWER Done.")], Registry([port])))
        r.config = r.config.replace("inference", constrained_tool_steps=2)
        r.runtime = dataclasses.replace(r.runtime, config=r.config)
        with caplog.at_level(logging.WARNING, logger="loopd.grammar"):
            assert r.turn("Echo x.").content == "Done."
    assert len(r.fake.requests) == 2 and len(builds) == 1
    grammar = r.fake.requests[0]["grammar"]
    assert grammar == r.fake.requests[1]["grammar"]
    assert len(grammar) < TOTAL_CAP + 8192
    assert 'call-wide ::= "{\\"name\\": \\"wide\\", \\"arguments\\": " object "}"' in grammar
    assert 'odd-args ::= "{" ( "\\"a\\": " string )? "}"' in grammar  # required: 5 ignored
    assert "deep-args-x ::=" in grammar  # held to its shape, built once per level
    assert 'fine-args ::= "{" "\\"text\\": " string "}"' in grammar
    said = [rec.getMessage() for rec in caplog.records]
    assert said == ["constrained calls: plain JSON for the arguments of wide: its schema has "
                    "more than 4096 parts"]  # once, for the two requests
    (result,) = [x for x in r.records if isinstance(x, ToolResult)]
    assert result.content == "fine ran"
