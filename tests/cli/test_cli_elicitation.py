"""An MCP server's question mid-call (elicitation) as the person meets it: a real ``loopd
chat`` in a pseudo-terminal, and ``loopd run`` with no terminal.

The server is tests/tools/mcp_test_server.py (the official SDK's server API): its ``greet``
tool asks "Whom shall I greet?" with a form of one field, ``name``, default "Ada", and says
hello to whoever the answer names. The model (the scripted fake llama-server) calls it as
the user message orders; the tool result in the log says what the server was told.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.support.terminal import json_records, leave
from tests.tools.hostkit import short_dir

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "tools" / "mcp_test_server.py"


class Env:
    """A config naming the MCP server as the only tool host, and the fake model server."""

    def __init__(self, root: Path, url: str) -> None:
        self.url, self.config = url, root / "loopd.toml"
        (root / "ws").mkdir()
        self.config.write_text(
            f'[log]\ndir = "{root / "sessions"}"\nfsync = "always"\n'
            f'[tools]\nworkspace = "{root / "ws"}"\nstandard = false\n'
            f'rules_file = "{root / "rules.toml"}"\nstart_timeout_s = 120\n'
            '[[tools.hosts]]\nname = "greeter"\nkind = "mcp"\n'
            f"command = {json.dumps([sys.executable, str(SERVER)])}\n"
            "[inference]\nretries = 1\nbackoff_s = 0.01\ntimeout_s = 30\n"
        )
        self.children: list[pexpect.spawn] = []

    def argv(self, command: str, *args: str) -> list[str]:
        return ["-m", "actors.cli", command, "--config", str(self.config), "--url", self.url,
                "--local", *args]

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``loopd run ...`` without a terminal."""
        return subprocess.run(
            [sys.executable, *self.argv("run", *args)], cwd=ROOT, capture_output=True,
            text=True, timeout=120, input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000"},
        )

    def chat(self, session: str) -> pexpect.spawn:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "TERM": "dumb",
               "COLUMNS": "200"}
        child = pexpect.spawn(sys.executable, self.argv("chat", "--session", session),
                              cwd=str(ROOT), env=env, encoding="utf-8", timeout=60,
                              dimensions=(50, 200))
        self.children.append(child)
        child.expect("Ctrl-D leaves")
        child.expect("> ")
        return child

    def records(self, session: str) -> list[dict[str, Any]]:
        return json_records(self.config, session)


@pytest.fixture
def env() -> Iterator[Env]:
    with FakeLlama(agent()) as fake, short_dir() as root:
        made = Env(root, fake.url)
        try:
            yield made
        finally:
            for child in made.children:
                if child.isalive():
                    child.kill(signal.SIGKILL)
                child.close(force=True)


def results(env: Env, session: str) -> list[str]:
    return [r["content"] for r in env.records(session) if r["kind"] == "tool_result"]


def test_the_person_answers_a_servers_question_in_chat(env: Env) -> None:
    child = env.chat("s")
    child.sendline('t1 :: greet {}')
    child.expect("asks")
    child.expect("Ctrl-C cancels the turn")
    shown = child.before
    # the server, its message, the field with its default, the choices
    assert "during greet" in shown and "Whom shall I greet?" in shown, shown
    assert "name: " in shown and "default: Ada" in shown, shown
    for choice in ("a  answer", "n  decline", "c  cancel"):
        assert choice in shown, shown
    child.send("a")
    child.expect_exact("name [Ada]: ")
    child.sendline("Grace")
    child.expect("done t1\\.")
    assert "answered (person)" in child.before
    child.expect("> ")
    child.sendline('t2 :: greet {}')
    child.expect("Ctrl-C cancels the turn")
    child.send("a")
    child.expect_exact("name [Ada]: ")
    child.sendline("")  # Enter keeps the default
    child.expect("done t2\\.")
    child.expect("> ")
    child.sendline('t3 :: greet {}')
    child.expect("Ctrl-C cancels the turn")
    child.send("n")
    child.expect("done t3\\.")
    assert "declined (person)" in child.before
    child.expect("> ")
    leave(child)
    assert results(env, "s") == ["hello Grace", "hello Ada", "nobody to greet (decline)"]


def test_loopd_run_without_a_terminal_declines(env: Env) -> None:
    done = env.run("--session", "r", "t1 :: greet {}")
    assert done.returncode == 0, done.stderr
    assert results(env, "r") == ["nobody to greet (decline)"]


def test_json_answers_on_stdin(env: Env) -> None:
    answer = json.dumps({"action": "accept", "content": {"name": "Lin"}})
    done = env.run("--session", "j", "--json", "t1 :: greet {}", stdin=answer + "\n")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    (asked,) = [e for e in events if e["event"] == "elicitation_requested"]
    assert asked["message"] == "Whom shall I greet?"
    assert json.loads(asked["fields"])["properties"]["name"]["default"] == "Ada"
    assert [e["action"] for e in events if e["event"] == "elicitation_answered"] == ["accept"]
    assert results(env, "j") == ["hello Lin"]




def test_an_mcp_servers_progress_is_shown_live_and_in_json(env: Env) -> None:
    done = env.run("--session", "p", "--json", "t1 :: steps {}")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    progress = [e for e in events if e["event"] == "tool_progress"]
    assert [(e["tool"], e["done"], e["total"], e["message"]) for e in progress] == [
        ("steps", i, 3, f"step {i}") for i in (1, 2, 3)]
    assert names.index("tool_progress") < names.index("tool_result")
    shown = env.run("--session", "q", "t1 :: steps {}")
    assert shown.returncode == 0, shown.stderr
    assert "… steps 2/3: step 2" in shown.stdout + shown.stderr


def test_a_typed_value_is_read_as_its_fields_type() -> None:
    from actors.cli.approvers import Problem, describe, read_value

    age = {"type": "integer", "description": "Your age", "default": 30}
    assert describe(age, True) == "Your age (integer, required) default: 30"
    assert read_value("", age, True) == 30  # Enter keeps the default
    assert read_value("41", age, True) == 41
    assert isinstance(read_value("forty", age, True), Problem)
    assert isinstance(read_value("", {"type": "string"}, True), Problem)  # required, no default
    assert read_value("yes", {"type": "boolean"}, False) is True
    colour = {"type": "string", "enum": ["red", "blue"]}
    assert read_value("blue", colour, False) == "blue"
    assert isinstance(read_value("green", colour, False), Problem)
