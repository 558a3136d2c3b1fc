"""The ``loopd`` command: every command and every exit code, against the fake llama-server.

In-process runs (``main([...])``) for most; real subprocesses where a signal or a terminal
matters (Ctrl-C cancels, ``chat`` reads stdin). Tool hosts are real processes throughout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.cli.main import main
from actors.log.file import SessionLog
from tests.cli.clikit import cli_env
from tests.support.fake_llama import FakeLlama, answer, hang, http_error
from tests.support.recordings import FIXTURES
from tests.support.turn_rig import baseline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Any]:
    return cli_env(tmp_path, standard=False)  # the file tools are all these tests call


def run(env: dict[str, Any], url: str, *args: str) -> int:
    return main([*args[:1], "--config", env["config"], "--url", url, *args[1:]])


def test_run_answers_on_stdout_and_exits_0(env: dict[str, Any], capsys: Any) -> None:
    with FakeLlama([answer("Hello there.")]) as fake:
        assert run(env, fake.url, "run", "Hi", "--session", "a") == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Hello there."
    assert "prompt tokens" in err  # the summary line goes to the live view


def test_run_json_prints_events_that_parse(env: dict[str, Any], capsys: Any) -> None:
    call = ("call_tool", json.dumps({"name": "read_file", "arguments": {"path": "notes.txt"}}))
    with FakeLlama([answer(tool_calls=[call]), answer("Seeds.")]) as fake:
        assert run(env, fake.url, "run", "What is in notes?", "--json") == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    names = [e["event"] for e in lines]
    for expected in ("waiting", "progress", "tool_call_started", "tool_result", "content"):
        assert expected in names
    started = next(e for e in lines if e["event"] == "tool_call_started")
    assert started["name"] == "call_tool" and started["call"] == 1
    result = next(e for e in lines if e["event"] == "tool_result")
    assert result["class"] == "public" and result["outcome"] == "result"
    assert lines[-1]["event"] == "answer" and lines[-1]["content"] == "Seeds."


def test_sessions_and_log_show(env: dict[str, Any], capsys: Any) -> None:
    with FakeLlama([answer("One."), answer("Two.")]) as fake:
        assert run(env, fake.url, "run", "first", "--session", "alpha") == 0
        assert run(env, fake.url, "run", "second", "--session", "beta") == 0
    capsys.readouterr()
    assert main(["sessions", "--config", env["config"]]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["alpha", "beta"]
    assert main(["log", "show", "alpha", "--config", env["config"]]) == 0
    shown = capsys.readouterr().out
    assert "baseline" in shown and "first" in shown and "One." in shown and "usage" in shown
    assert main(["log", "show", "alpha", "--json", "--config", env["config"]]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["kind"] for r in records] == ["baseline", "user", "assistant", "usage"]
    assert records[1]["content"] == "first"


def test_log_show_shows_every_record_and_where_each_compaction_keeps_from(
    env: dict[str, Any], capsys: Any
) -> None:
    from actors.log.records import Assistant, Compaction, CompactionBy, User

    path = env["dir"] / "long" / "log.bin"
    log, _ = SessionLog.open(path, fsync="never", baseline=baseline(), name="long")
    log.append(User(content="first question"), Assistant(content="first answer", reasoning=None),
               User(content="second question"))
    log.append(Compaction(summary="They asked a first question.", kept=3, tokens_before=6100,
                          by=CompactionBy.AUTO))
    log.close()
    assert main(["log", "show", "long", "--config", env["config"]]) == 0
    shown = capsys.readouterr().out
    lines = [line for line in shown.splitlines() if line.split()[0] in ("1", "2", "3", "4", "5",
                                                                        "──")]
    assert [line.split()[0] for line in lines] == ["1", "2", "3", "──", "4", "5"]
    assert "first question" in lines[1] and "first answer" in lines[2]  # nothing hidden
    assert "after the compaction at #5" in lines[3]
    flat = " ".join(shown.split())
    assert "compaction (auto) at 6,100 prompt tokens" in flat
    assert "records from #4 on" in flat and "They asked a first question." in flat
    assert main(["log", "show", "long", "--json", "--config", env["config"]]) == 0
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["kind"] == "compaction" and last["kept"] == 3 and last["by"] == "auto"


def test_exit_2_on_bad_config_and_bad_usage(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[loop]\ntool_iterations = 0\n")
    assert main(["run", "hi", "--config", str(bad)]) == 2
    assert "loop.tool_iterations" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["run"])  # the message is missing
    assert caught.value.code == 2


def test_an_error_that_quotes_markup_is_printed_as_it_is(tmp_path: Path, capsys: Any) -> None:
    """An error quotes what the person wrote; "[/]" there must not raise in the printer."""
    bad = tmp_path / "bad.toml"
    bad.write_text('[loop]\ntool_result_cap = "[/] [bold]"\n')
    assert main(["run", "hi", "--config", str(bad)]) == 2
    assert "loop.tool_result_cap = '[/] [bold]': must be" in capsys.readouterr().err


def test_exit_3_when_a_limit_ends_the_turn(env: dict[str, Any], capsys: Any) -> None:
    script = [answer(tool_calls=[("find_tool", json.dumps({"query": f"q{i}"}))])
              for i in range(20)]
    with FakeLlama(script) as fake:
        assert run(env, fake.url, "run", "loop forever") == 3
    assert "tool iterations" in capsys.readouterr().err


def test_exit_3_when_the_context_is_full(env: dict[str, Any], capsys: Any) -> None:
    from tests.support.fake_llama import replay

    with FakeLlama(replay(FIXTURES / "context_full.http")) as fake:
        assert run(env, fake.url, "run", "too long") == 3
    assert "full" in capsys.readouterr().err


def test_exit_4_when_the_server_fails(env: dict[str, Any], capsys: Any) -> None:
    assert run(env, "http://127.0.0.1:9", "run", "anyone there?") == 4
    assert "connect" in capsys.readouterr().err
    boom = http_error(500, {"error": {"code": 500, "message": "boom", "type": "server_error"}})
    with FakeLlama([boom, boom]) as fake:
        assert run(env, fake.url, "run", "hi") == 4


def test_exit_5_when_the_session_is_open_elsewhere(env: dict[str, Any], capsys: Any) -> None:
    log, _ = SessionLog.open(env["dir"] / "busy" / "log.bin", baseline=baseline(), name="busy")
    try:
        with FakeLlama([answer("never")]) as fake:
            assert run(env, fake.url, "run", "hi", "--session", "busy") == 5
        assert "open elsewhere" in capsys.readouterr().err
    finally:
        log.close()


@pytest.fixture
def fake_process() -> Iterator[tuple[FakeLlama, threading.Event]]:
    release = threading.Event()
    with FakeLlama(lambda body: hang() if not release.is_set() else answer("ok")) as fake:
        yield fake, release
        release.set()


def _kinds(env: dict[str, Any], session: str) -> list[str]:
    """The kinds of a session's records, as ``loopd log show --json`` (another process) reads
    them."""
    lines = subprocess.run(
        [sys.executable, "-m", "actors.cli", "log", "show", session, "--json", "--config",
         env["config"]], cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    return [json.loads(line)["kind"] for line in lines]


def _loopd(env: dict[str, Any], url: str, *args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "actors.cli", args[0], "--config", env["config"], "--url", url,
         *args[1:]],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw,
    )


def test_exit_130_when_ctrl_c_cancels_the_turn(
    env: dict[str, Any], fake_process: tuple[FakeLlama, threading.Event]
) -> None:
    fake, _ = fake_process
    proc = _loopd(env, fake.url, "run", "wait for me", "--json", "--session", "c")
    seen = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:  # wait until the request is out
            seen.append(line)
            if json.loads(line)["event"] == "waiting":
                break
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        assert code == 130, (seen, proc.stdout.read(), proc.stderr.read())
    finally:
        proc.kill()
        proc.wait()
    # the session keeps the user message and nothing half-written
    assert _kinds(env, "c") == ["baseline", "user"]


def test_chat_runs_turns_from_stdin_and_leaves_on_eof(env: dict[str, Any]) -> None:
    with FakeLlama([answer("First answer."), answer("Second answer.")]) as fake:
        proc = subprocess.run(
            [sys.executable, "-m", "actors.cli", "chat", "--config", env["config"], "--url",
             fake.url, "--session", "talk"],
            cwd=ROOT, input="hello\n\nagain\n", capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == 0, proc.stderr
    assert "First answer." in proc.stdout and "Second answer." in proc.stdout
    assert proc.stdout.count("prompt tokens") == 2  # one summary line per turn
    assert len(fake.requests) == 2
    # the second request extends the first: same session
    first, second = (r["messages"] for r in fake.requests)
    assert second[: len(first)] == first


def _chat_process(env: dict[str, Any], url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "chat", "--config", env["config"], "--url", url,
         "--session", "term"],
        cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_sigterm_ends_chat_at_its_prompt(env: dict[str, Any]) -> None:
    with FakeLlama([answer("unused")]) as fake:
        proc = _chat_process(env, fake.url)
        try:
            assert proc.stdout is not None
            assert "Ctrl-D leaves" in proc.stdout.readline()  # started, at (or near) its prompt
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 130  # not taken as "cancel a turn" and prompted again
        finally:
            proc.kill()
            proc.wait()
        assert fake.requests == []


def test_sigterm_during_a_chat_turn_cancels_it_and_ends_chat(
    env: dict[str, Any], fake_process: tuple[FakeLlama, threading.Event]
) -> None:
    fake, _ = fake_process
    proc = _chat_process(env, fake.url)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("wait for me\n")
        proc.stdin.flush()
        proc.stdout.readline()
        for _ in range(300):  # the request is out
            if fake.requests:
                break
            threading.Event().wait(0.1)
        assert fake.requests
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.wait()
    assert _kinds(env, "term") == ["baseline", "user"]


def test_help_everywhere() -> None:
    for args in (["--help"], ["run", "--help"], ["chat", "--help"], ["sessions", "--help"],
                 ["log", "show", "--help"], ["toolhost", "--help"], ["keys", "--help"]):
        proc = subprocess.run([sys.executable, "-m", "actors.cli", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "usage" in proc.stdout.lower(), args


def test_keys_writes_a_key_pair_with_a_private_secret(tmp_path: Path) -> None:
    assert main(["keys", "laptop", "--dir", str(tmp_path)]) == 0
    public, secret = tmp_path / "laptop.key", tmp_path / "laptop.key_secret"
    assert public.is_file() and secret.is_file()
    assert os.stat(secret).st_mode & 0o777 == 0o600
