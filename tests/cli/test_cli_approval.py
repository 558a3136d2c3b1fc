"""Approval as a person meets it: a real ``loopd chat`` / ``loopd run`` in a pseudo-terminal.

Every test runs loopd as its own process (pexpect gives it a terminal) against the scripted
fake llama-server (tests/support/scripted_llama.py) on loopback, with a real tool host
running ``run_command`` in a temporary workspace. The model is told by the user message
which command to run (``TAG :: run_command {"command": ...}``), so whether the command
ran is a file in the workspace, and the log says what was decided.
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
import psutil
import pytest

from actors.session.messages import MISSING_RESULT
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.support.terminal import json_records, leave
from tests.tools.hostkit import short_dir

ROOT = Path(__file__).resolve().parents[2]
ASKED = "wants to run"  # the prompt's first line: "? run_command wants to run (call N)"


class Env:
    """A config, a workspace, a rules file and the fake server for one test."""

    def __init__(self, root: Path, url: str, timeout_s: float = 120) -> None:
        self.root, self.url = root, url
        self.workspace = root / "ws"
        self.workspace.mkdir(parents=True)
        self.rules = root / "rules.toml"
        self.config = root / "loopd.toml"
        self.config.write_text(
            f'[log]\ndir = "{root / "sessions"}"\nfsync = "always"\n'
            f'[tools]\nworkspace = "{self.workspace}"\nstandard = false\n'
            f'rules_file = "{self.rules}"\napproval_timeout_s = {timeout_s}\n'
            "start_timeout_s = 120\n"
            '[[tools.hosts]]\nname = "shell"\ntools = ["run_command", "echo"]\n'
            "[inference]\nretries = 1\nbackoff_s = 0.01\ntimeout_s = 30\n"
        )
        self.children: list[pexpect.spawn] = []

    def argv(self, command: str, *args: str) -> list[str]:
        # --local: in this process, whatever daemon may be running on the machine
        return ["-m", "actors.cli", command, "--config", str(self.config), "--url", self.url,
                "--local", *args]

    def spawn(self, command: str, *args: str) -> pexpect.spawn:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "TERM": "dumb",
               "COLUMNS": "200"}
        child = pexpect.spawn(sys.executable, self.argv(command, *args), cwd=str(ROOT),
                              env=env, encoding="utf-8", timeout=60, dimensions=(50, 200))
        self.children.append(child)
        return child

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``loopd run ...`` without a terminal (stdin a pipe or nothing)."""
        return subprocess.run(
            [sys.executable, *self.argv("run", *args)], cwd=ROOT, capture_output=True,
            text=True, timeout=60, input=stdin, stdin=None if stdin is not None
            else subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000"},
        )

    def records(self, session: str) -> list[dict[str, Any]]:
        return json_records(self.config, session)

    def approvals(self, session: str) -> list[dict[str, Any]]:
        return [r for r in self.records(session) if r["kind"] == "approval"]

    def close(self) -> None:
        for child in self.children:
            if child.isalive():
                child.kill(signal.SIGKILL)
            child.close(force=True)
            _wait_for_hosts_of(child.pid)


def _wait_for_hosts_of(pid: int | None) -> None:
    """The tool hosts a loopd process started exit when it is gone (--parent-pid)."""
    hosts = [p for p in psutil.process_iter(["cmdline"])
             if "actors.tools.host" in (p.info["cmdline"] or [])
             and str(pid) in (p.info["cmdline"] or [])]
    _, alive = psutil.wait_procs(hosts, timeout=15)
    for p in alive:
        p.kill()
    assert not alive, f"tool hosts outlived loopd {pid}: {alive}"


def order(tag: str, command: str) -> str:
    return f"{tag} :: run_command {json.dumps({'command': command})}"


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[Env] = []
    with FakeLlama(agent()) as fake, short_dir() as root:
        def start(timeout_s: float = 120) -> Env:
            env = Env(root / str(len(made)), fake.url, timeout_s)
            made.append(env)
            return env

        start.fake = fake  # type: ignore[attr-defined]
        try:
            yield start
        finally:
            for env in made:
                env.close()


def chat(env: Env, session: str = "s") -> pexpect.spawn:
    child = env.spawn("chat", "--session", session)
    child.expect("Ctrl-D leaves")
    child.expect("> ")
    return child


def ask(child: pexpect.spawn, message: str) -> None:
    child.sendline(message)
    child.expect(ASKED)
    child.expect("Ctrl-C cancels the turn")


def deny(child: pexpect.spawn, reason: str = "") -> None:
    child.send("n")
    child.expect("reason for the model")
    child.sendline(reason)


def answered(child: pexpect.spawn, tag: str) -> str:
    """Wait for the turn's answer and the next prompt; what was shown on the way."""
    child.expect(f"done {tag}\\.")
    shown = child.before
    child.expect("> ")
    return shown


# --- each decision, in loopd chat ----------------------------------------------------------


def test_allow_once_runs_it_and_asks_again_next_time(make: Any) -> None:
    env = make()
    child = chat(env)
    ask(child, order("t1", "touch once.txt"))
    # the prompt shows the tool, its arguments and the choices
    shown = child.before
    assert "command: touch once.txt" in shown
    exactly = "the command `touch once.txt` exactly, nothing added [run_command = touch once.txt]"
    for choice in ("y  allow once", f"s  allow for this session: {exactly}",
                   f"a  always allow: {exactly} (saved in your rules file: every session, every "
                   "workspace, until you remove it)", "n  deny"):
        assert choice in shown, shown
    child.send("y")  # one key, no Enter
    said = answered(child, "t1")
    assert "allowed once" in said
    assert not said.lstrip(" ").startswith("y"), said  # the key is not echoed after the prompt
    assert (env.workspace / "once.txt").exists()
    ask(child, order("t2", "touch once.txt"))  # once is once: asked again
    child.send("y")
    answered(child, "t2")
    leave(child)
    assert [(a["decision"], a["scope"], a["by"]) for a in env.approvals("s")] == [
        ("allow", "once", "person")] * 2


def test_deny_with_a_reason_the_model_reads(make: Any) -> None:
    env = make()
    child = chat(env)
    ask(child, order("t1", "touch denied.txt"))
    deny(child, "use the notes file instead")
    assert "denied (person)" in answered(child, "t1")
    leave(child)
    assert not (env.workspace / "denied.txt").exists()
    (result,) = [r for r in env.records("s") if r["kind"] == "tool_result"]
    assert result["content"] == ("The call was denied: the person said no: use the notes file "
                                 "instead")
    # the model read it: it is the tool message of the request that gave the answer
    assert make.fake.requests[-1]["messages"][-1]["content"] == result["content"]


def test_allow_for_this_session_survives_a_reopen(make: Any) -> None:
    env = make()
    child = chat(env)
    ask(child, order("t1", "touch s1.txt"))
    child.send("s")
    answered(child, "t1")
    (env.workspace / "s1.txt").unlink()
    child.sendline(order("t2", "touch s1.txt"))  # the same words: not asked
    assert ASKED not in answered(child, "t2")
    leave(child)
    assert (env.workspace / "s1.txt").exists()
    child = chat(env)  # a new process reopens the session and re-reads the grant
    child.sendline(order("t3", "touch 's1.txt'"))
    assert ASKED not in answered(child, "t3")
    ask(child, order("t4", "touch s1.txt other.txt"))  # more than the person saw: asked
    deny(child)
    answered(child, "t4")
    leave(child)
    assert not (env.workspace / "other.txt").exists()
    assert [(a["scope"], a["by"], a["rule"]) for a in env.approvals("s")][:3] == [
        ("session", "person", "run_command = touch s1.txt"),
        ("session", "session", "run_command = touch s1.txt"),
        ("session", "session", "run_command = touch s1.txt")]
    assert not env.rules.exists()  # a session answer is not saved as a rule
    # another session is asked again
    other = env.run(order("t5", "touch s5.txt"), "--session", "other")
    assert "there is no terminal to ask" in other.stderr
    assert not (env.workspace / "s5.txt").exists()


def test_always_saves_a_rule_that_other_sessions_use(make: Any) -> None:
    env = make()
    child = chat(env)
    ask(child, order("t1", "touch a1.txt"))
    child.send("a")
    answered(child, "t1")
    leave(child)
    assert 'run_command = touch a1.txt' in env.rules.read_text()
    (env.workspace / "a1.txt").unlink()
    # another session, another process, no terminal: the saved rule allows it
    done = env.run(order("t2", "touch a1.txt"), "--session", "other")
    assert done.returncode == 0, done.stderr
    assert (env.workspace / "a1.txt").exists()
    (a,) = env.approvals("other")
    assert (a["by"], a["rule"]) == ("rule", "run_command = touch a1.txt")


def test_no_answer_in_time_is_a_denial_that_says_so(make: Any) -> None:
    env = make(timeout_s=1)
    child = chat(env)
    ask(child, order("t1", "touch late.txt"))
    child.expect("no answer in time")
    assert "denied (timeout)" in answered(child, "t1")
    leave(child)
    assert not (env.workspace / "late.txt").exists()
    (result,) = [r for r in env.records("s") if r["kind"] == "tool_result"]
    assert "no answer within 1 s (tools.approval_timeout_s)" in result["content"]


def test_ctrl_c_while_waiting_cancels_the_turn_and_nothing_runs(make: Any) -> None:
    env = make()
    child = chat(env)
    ask(child, order("t1", "touch never.txt"))
    child.sendintr()
    child.expect("Cancelled")
    child.expect("> ")
    assert not (env.workspace / "never.txt").exists()
    # the chat goes on: the next turn works, and the cancelled call has the placeholder
    child.sendline("t2")
    answered(child, "t2")
    leave(child)
    kinds = [r["kind"] for r in env.records("s")]
    assert kinds == ["baseline", "user", "assistant", "usage", "approval",
                     "user", "assistant", "usage"]
    (a,) = env.approvals("s")
    assert (a["decision"], a["by"]) == ("deny", "cancel")
    tool_messages = [m for m in make.fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [MISSING_RESULT]


def test_a_crash_while_waiting_reopens_with_the_placeholder_and_the_call_never_ran(
    make: Any,
) -> None:
    env = make()
    child = chat(env)
    ask(child, order("t1", "touch crash.txt"))
    os.kill(child.pid, signal.SIGKILL)
    child.expect(pexpect.EOF)
    child.close()
    assert child.signalstatus == signal.SIGKILL
    _wait_for_hosts_of(child.pid)
    assert [r["kind"] for r in env.records("s")] == ["baseline", "user", "assistant", "usage"]
    # a new command reopens the session: the call is answered with the placeholder
    again = env.run("t2", "--session", "s")
    assert again.returncode == 0, again.stderr
    assert not (env.workspace / "crash.txt").exists()
    tool_messages = [m for m in make.fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [MISSING_RESULT]


# --- loopd run -----------------------------------------------------------------------------


def test_run_on_a_terminal_asks_the_same_way(make: Any) -> None:
    env = make()
    child = env.spawn("run", order("t1", "touch tty.txt"), "--session", "r")
    child.expect(ASKED)
    child.expect("Ctrl-C cancels the turn")
    child.send("y")
    child.expect("done t1\\.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (env.workspace / "tty.txt").exists()


def test_run_without_a_terminal_denies_and_names_the_flag_that_would_allow(make: Any) -> None:
    env = make()
    denied = env.run(order("t1", "touch flag.txt"), "--session", "n")
    assert denied.returncode == 0, denied.stderr  # the model got an answer and answered
    assert "--approve 'run_command = touch flag.txt'" in denied.stderr
    assert not (env.workspace / "flag.txt").exists()
    ops = env.run(order("t2", "touch a.txt && touch b.txt"), "--session", "n")
    assert "only --approve run_command" in ops.stderr
    allowed = env.run(order("t3", "touch flag.txt"), "--session", "n",
                      "--approve", "run_command:touch")
    assert allowed.returncode == 0, allowed.stderr
    assert (env.workspace / "flag.txt").exists()
    bad = env.run("t4", "--approve", "run_command: ls | sh")
    assert bad.returncode == 2 and "--approve: rule" in bad.stderr


def test_run_json_prints_the_request_and_reads_the_answer_on_stdin(make: Any) -> None:
    env = make()
    proc = subprocess.Popen(
        [sys.executable, *env.argv("run", order("t1", "touch j.txt"), "--json")], cwd=ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        events = []
        for line in proc.stdout:
            events.append(json.loads(line))
            if events[-1]["event"] == "approval_requested":
                break
        request = events[-1]
        assert (request["tool"], json.loads(request["arguments"]), request["rule"]) == (
            "run_command", {"command": "touch j.txt"}, "run_command = touch j.txt")
        proc.stdin.write("yes please\n")  # not an answer: said so, and another awaited
        proc.stdin.flush()
        invalid = json.loads(proc.stdout.readline())
        assert invalid["event"] == "approval_invalid" and "not JSON" in invalid["message"]
        proc.stdin.write(json.dumps({"decision": "deny", "reason": "not today"}) + "\n")
        proc.stdin.flush()
        rest = [json.loads(line) for line in proc.stdout]
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    decided = next(e for e in rest if e["event"] == "approval_decided")
    assert (decided["decision"], decided["reason"]) == ("deny", "the person said no: not today")
    assert rest[-1]["event"] == "answer"
    assert not (env.workspace / "j.txt").exists()
