"""What a newcomer met in their first hour, as the person or a script receives it.

Each test runs the real command (``main`` in-process, or ``python -m actors.cli`` in its own
process where a pipe or exit matters) against the fake llama-server on loopback, or against
no server at all where the point is that nothing starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest

from actors.cli.main import main
from tests.cli.clikit import cli_env
from tests.support.fake_llama import FakeLlama, answer, context_full

ROOT = Path(__file__).resolve().parents[2]
NOBODY = "http://127.0.0.1:9"  # nothing listens there: any contact with it is said on stderr


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Any]:
    return cli_env(tmp_path)


def loopd(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, **kw)


# --- bad usage is said at once, with the usage of the command it was given to ---------------


def test_an_unknown_option_shows_the_usage_of_its_own_command(env: dict[str, Any]) -> None:
    proc = loopd("run", "hi", "--sesion", "x", "--config", env["config"])
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: loopd run "), proc.stderr
    assert "unrecognized arguments: --sesion x" in proc.stderr
    shown = loopd("log", "show", "s", "--jsn", "--config", env["config"])
    assert shown.returncode == 2 and shown.stderr.startswith("usage: loopd log show ")


def test_a_bad_session_name_is_bad_usage_said_before_anything_starts(
    env: dict[str, Any], capsys: Any
) -> None:
    code = main(["run", "hi", "--session", "a/b", "--config", env["config"], "--url", NOBODY])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "session name 'a/b' is not allowed" in err
    assert "/props" not in err and "tool hosts" not in err  # no server asked, no host started
    assert not env["dir"].exists()


def test_a_missing_workspace_is_said_before_anything_starts(
    env: dict[str, Any], capsys: Any
) -> None:
    missing = env["tmp"] / "no-such-dir"
    code = main(["run", "hi", "--config", env["config"], "--url", NOBODY, "--workspace",
                 str(missing)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{missing} is not a directory" in err
    assert "/props" not in err and "tool hosts" not in err


def test_stop_without_a_daemon_says_so_and_is_no_server_failure(
    env: dict[str, Any], capsys: Any
) -> None:
    assert main(["stop", "--config", env["config"]]) == 0
    assert "no loopd daemon is running" in capsys.readouterr().err


# --- lines are never broken by the printer ---------------------------------------------------


def test_an_error_line_keeps_its_url_whole(env: dict[str, Any], capsys: Any) -> None:
    assert main(["run", "hi", "--config", env["config"], "--url", NOBODY]) == 4
    err = capsys.readouterr().err
    assert f"could not connect to {NOBODY}/props" in err, err
    for line in err.splitlines():
        assert not line.rstrip().endswith("connect to"), err


def test_log_show_into_a_file_gives_one_line_per_record(env: dict[str, Any]) -> None:
    long = "A long question about the garden beds " * 4
    with FakeLlama([answer("Short answer.")]) as fake:
        assert main(["run", long, "--config", env["config"], "--url", fake.url,
                     "--session", "s"]) == 0
    proc = loopd("log", "show", "s", "--config", env["config"], env={"COLUMNS": "80",
                 "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[3] for line in lines] == ["baseline", "user", "assistant", "usage"]
    assert long[:150].strip() in lines[1]


# --- a closed stdout ends the command quietly ------------------------------------------------


def test_run_json_into_a_reader_that_goes_away_ends_quietly(env: dict[str, Any]) -> None:
    """``loopd run --json | head -1``: the first line is read, the pipe closes; the command
    ends without a traceback (the turn cancelled, as by Ctrl-C)."""
    with FakeLlama([answer("word " * 20_000, chunk=1)]) as fake:
        proc = subprocess.Popen(
            [sys.executable, "-m", "actors.cli", "run", "hi", "--json", "--config",
             env["config"], "--url", fake.url, "--session", "piped"],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None and proc.stderr is not None
            first = json.loads(proc.stdout.readline())
            assert first["event"]
            proc.stdout.close()  # what `head -1` does after its line
            code = proc.wait(timeout=60)
            err = proc.stderr.read()
        finally:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err.strip() == "", err
    assert code == 130


# --- where loopd is, and a chat on the example workspace --------------------------------------


def test_the_readme_says_where_loopd_is_and_make_chat_chats_on_the_example() -> None:
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/loopd" in readme and ". .venv/bin/activate" in readme
    dry = subprocess.run(["make", "-n", "chat"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", "VIRTUAL_ENV": ""})
    assert dry.returncode == 0, dry.stderr
    assert ".venv/bin/loopd chat --workspace examples/workspace" in dry.stdout


# --- a call written as text never reaches the person or a script as answer text -------------

CALL = '{"name": "read_file", "arguments": {"path": "notes.txt"}}'


@pytest.mark.parametrize(("setting", "written"), [
    ("bare_json_tool_calls", CALL),  # a small model's bare JSON call
    ("constrained_calls", f"TOOL {CALL}"),  # the decision word, then the call
])
def test_a_call_written_as_text_is_never_content_in_json_output(
    env: dict[str, Any], capsys: Any, setting: str, written: str
) -> None:
    config = Path(env["config"])
    config.write_text(config.read_text() + f'{setting} = "on"\n')
    script = [answer(written, chunk=3), answer("ANSWER It says to buy seeds." if
                                               setting == "constrained_calls" else
                                               "It says to buy seeds.", chunk=3)]
    with FakeLlama(script) as fake:
        assert main(["run", "What does notes.txt say?", "--json", "--config", env["config"],
                     "--url", fake.url]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    shown = "".join(e["text"] for e in lines if e["event"] == "content")
    assert shown == "It says to buy seeds."
    started = [e for e in lines if e["event"] == "tool_call_started"]
    assert len(started) == 1 and "notes.txt" in started[0]["arguments"]  # shown as a call
    assert lines[-1]["event"] == "answer" and lines[-1]["content"] == "It says to buy seeds."


@pytest.mark.parametrize(("setting", "written"), [
    ("bare_json_tool_calls", CALL),
    ("constrained_calls", f"TOOL {CALL}"),
])
def test_a_call_written_as_text_is_never_answer_text_in_chat(
    env: dict[str, Any], setting: str, written: str
) -> None:
    """What the person sees in a terminal (a pty): the call shown once, as a call (→ and the
    tool), never its JSON or the word TOOL as answer text before it, then the answer."""
    config = Path(env["config"])
    config.write_text(config.read_text() + f'{setting} = "on"\n')
    final = "ANSWER It says to buy seeds." if setting == "constrained_calls" else \
        "It says to buy seeds."
    with FakeLlama([answer(written, chunk=3), answer(final, chunk=3)]) as fake:
        child = pexpect.spawn(
            sys.executable, ["-m", "actors.cli", "chat", "--config", env["config"], "--url",
                             fake.url, "--local", "--session", "c"],
            cwd=str(ROOT), env={**os.environ, "NO_COLOR": "1", "TERM": "dumb",
                                "PYTHONPATH": str(ROOT)},
            encoding="utf-8", timeout=60, dimensions=(50, 200))
        try:
            child.expect_exact("> ")
            child.sendline("What does notes.txt say?")
            child.expect("1 tool call")
            seen = child.before
            child.expect_exact("> ")
            child.sendeof()
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
    lines = [line.strip() for line in seen.splitlines() if line.strip()]
    # the question, the call (read_file through call_tool: not pinned), its result, the answer
    assert lines[:4] == ["What does notes.txt say?", f"→ call_tool {CALL}",
                         "← call_tool: result, public", "It says to buy seeds."], lines
    assert "TOOL" not in seen and "ANSWER" not in seen, seen


# --- a session never queues behind itself ----------------------------------------------------


def test_a_tool_turn_of_one_session_is_never_queued(env: dict[str, Any], tmp_path: Path) -> None:
    """A call written as text is, to the server, an answer without tool calls. Its state must
    not be saved (and the turn's next request held up behind that save, "queued") before the
    turn ends. The fake server's saves are held until the answer is out, so a save in the
    middle of the turn would show as a queued line (or never end)."""
    save_dir = tmp_path / "slots"
    save_dir.mkdir()
    config = Path(env["config"])
    config.write_text(config.read_text() + 'bare_json_tool_calls = "on"\n'
                      f'[slots]\nsave_dir = "{save_dir}"\nsave_after_turn = "on"\n')
    replies = [answer(CALL), answer("It says to buy seeds.")]

    def script(body: dict[str, Any]) -> Any:
        fake.slot_gate.clear()  # from the turn's first request on (not the start's probe)
        return replies.pop(0)

    with FakeLlama(script, save_dir=save_dir) as fake:
        proc = subprocess.Popen(
            [sys.executable, "-m", "actors.cli", "run", "What does notes.txt say?", "--json",
             "--config", env["config"], "--url", fake.url],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        events = []
        try:
            assert proc.stdout is not None and proc.stderr is not None
            for line in proc.stdout:
                events.append(json.loads(line))
                if events[-1]["event"] in ("answer", "queued", "error"):
                    break
            fake.slot_gate.set()  # the save after the turn may go now
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
        finally:
            fake.slot_gate.set()
            proc.kill()
            proc.wait()
    names = [e["event"] for e in events]
    assert "queued" not in names, events
    assert names[-1] == "answer" and [c[0] for c in fake.slot_calls][-1:] == ["save"]


# --- a session keeps its workspace -------------------------------------------------------------


def _listing() -> Any:
    """A model that lists the workspace, then answers with what the listing said."""
    def script(body: dict[str, Any]) -> Any:
        messages = body["messages"]
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        results = [m for m in messages[last_user:] if m.get("role") == "tool"]
        if not results:
            return answer(tool_calls=[("list_dir", json.dumps({"path": "."}))])
        return answer("Listed: " + results[-1]["content"].replace("\n", " "))
    return script


def test_a_session_keeps_the_workspace_it_was_made_with(env: dict[str, Any], capsys: Any) -> None:
    other = env["tmp"] / "garden"
    other.mkdir()
    (other / "beds.csv").write_text("bed,plant\n")
    with FakeLlama(_listing()) as fake:
        base = ["--config", env["config"], "--url", fake.url, "--session", "d1"]
        assert main(["run", "What is here?", *base, "--workspace", str(other)]) == 0
        assert "beds.csv" in capsys.readouterr().out
        # no --workspace: the session's own, said; not the config's (which has notes.txt)
        assert main(["run", "And now?", *base]) == 0
        out, err = capsys.readouterr()
        assert "beds.csv" in out and "notes.txt" not in out
        assert f"session d1 works on {other}, the workspace it was made with" in err
        # another --workspace: refused before anything starts (exit 2)
        assert main(["run", "Here?", *base, "--workspace", str(env["workspace"])]) == 2
        err = capsys.readouterr().err
        assert f"session d1 works on {other}" in err and "--session NEW-NAME" in err
        assert "tool hosts" not in err
        assert len(fake.requests) == 4  # two turns of two requests; none for the refusal


def test_sessions_lists_each_one_with_its_size_and_workspace(
    env: dict[str, Any], capsys: Any
) -> None:
    with FakeLlama([answer("One.")]) as fake:
        assert main(["run", "first", "--config", env["config"], "--url", fake.url,
                     "--session", "alpha"]) == 0
    capsys.readouterr()
    assert main(["sessions", "--config", env["config"]]) == 0  # on the embedded model
    (line,) = capsys.readouterr().out.splitlines()
    name, tokens, word, of, context, share, workspace = line.split()
    assert (name, word, of, context, workspace) == (
        "alpha", "tokens", "of", "8,192", str(env["workspace"]))
    assert share == f"({int(tokens) / 8192:.0%})" and int(tokens) > 0
    assert main(["sessions", "--json", "--config", env["config"], "--url", NOBODY]) == 0
    (row,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert row == {"name": "alpha", "tokens": int(tokens), "context": 0,
                   "workspace": str(env["workspace"])}  # context: not known offline for a url


# --- loopd run says how full the conversation is, and the ways on at the wall ---------------


def test_run_says_when_the_conversation_nears_full_and_json_gives_its_size(
    env: dict[str, Any], capsys: Any
) -> None:
    big = answer("ok", usage={"prompt_tokens": 800, "completion_tokens": 2, "total_tokens": 802})
    # the third turn passes session.compact_at (0.8): the conversation is compacted first,
    # the model writing the summary (a server named by url)
    replies = [answer("ok"), big, answer("They said small and big."), big]
    with FakeLlama(replies, props={"n_ctx": 1000}) as fake:
        base = ["--config", env["config"], "--url", fake.url, "--session", "s"]
        assert main(["run", "small", *base]) == 0
        assert "filling up" not in capsys.readouterr().err  # nothing to say below 75%
        assert main(["run", "big", *base]) == 0
        out, err = capsys.readouterr()
        assert out.strip() == "ok"
        flat = " ".join(err.split())
        assert "session s is filling up: 802 of 1,000 tokens (80%)" in flat, err
        assert ("Ways on: --session NEW-NAME starts a new session (session s stays as it is); "
                "loopd rewind s takes back the last turn") in flat, err
        assert main(["run", "big again", *base, "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    last = lines[-1]
    assert last["event"] == "answer" and (last["tokens"], last["context"]) == (802, 1000)
    assert "conversation compacted" in last["summary"]
    (done,) = [x for x in lines if x["event"] == "compacted"]
    assert done["why"] == "auto" and done["tokens_after"] < done["tokens_before"]


def test_run_refused_for_a_full_context_names_the_ways_on(
    env: dict[str, Any], capsys: Any
) -> None:
    with FakeLlama([context_full(n_prompt_tokens=1200, n_ctx=1000)],
                   props={"n_ctx": 1000}) as fake:
        assert main(["run", "huge", "--config", env["config"], "--url", fake.url,
                     "--session", "s"]) == 3
    flat = " ".join(capsys.readouterr().err.split())
    assert "The conversation is full" in flat
    assert "Ways on: --session NEW-NAME starts a new session" in flat, flat
    assert "loopd rewind s takes back the last turn" in flat
    assert "embedded.ctx_size" in flat


def test_a_message_refused_for_a_full_context_is_never_answered_later(
    env: dict[str, Any], capsys: Any
) -> None:
    """The refused message was logged and sent with the next one once the context was raised,
    so the model answered a message typed while full: now the turn is taken back (a Rewind
    saying why, shown by log show) and the person is told."""
    base = ["--config", env["config"], "--session", "s"]
    with FakeLlama([context_full(n_prompt_tokens=1200, n_ctx=1000)],
                   props={"n_ctx": 1000}) as fake:
        assert main(["run", "summarise every file", *base, "--url", fake.url]) == 3
    flat = " ".join(capsys.readouterr().err.split())
    assert "Your message was taken back: it stays in the log and is never answered" in flat
    with FakeLlama([answer("hello")], props={"n_ctx": 4000}) as fake:  # a larger context
        assert main(["run", "just say hello", *base, "--url", fake.url]) == 0
        (sent,) = fake.requests
    assert [m["content"] for m in sent["messages"][1:]] == ["just say hello"]
    assert capsys.readouterr().out.strip() == "hello"
    assert main(["log", "show", "s", "--config", env["config"]]) == 0
    shown = capsys.readouterr().out
    assert "refused for a full context: the prompt is 1200 tokens" in " ".join(shown.split())
