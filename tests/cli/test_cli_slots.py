"""What a person sees of the slot keeper: saves when a command ends (its end and SIGTERM),
``loopd sessions rm``, ``log show`` of logs old and new, and the run's summary line."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest

from actors.base.processes.stop_deadline import EXIT_CODE
from actors.base.processes.trees import kill_tree
from actors.cli.main import main
from actors.cli.view import describe, summary
from actors.inference.slots.keeper import FORKED
from actors.log.file import HEADER, read_log
from actors.log.records import SlotState, SlotUse, Usage, User
from actors.session.turn import TurnOutcome
from tests.support.fake_llama import FakeLlama, answer, hang

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 60  # hang guards: the grace is 2 s


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Any]:
    save = tmp_path / "save"
    save.mkdir()
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'[log]\ndir = "{tmp_path / "sessions"}"\nfsync = "never"\n'
        f'[slots]\nsave_dir = "{save}"\n'
        f'[embedded]\ndata_dir = "{tmp_path / "data"}"\n'
        "[tools]\nstandard = false\n"
        "[inference]\nretries = 0\ntimeout_s = 20\n"
    )
    return {"config": str(config), "dir": tmp_path / "sessions", "save": save}


def state_files(env: dict[str, Any], session: str) -> list[str]:
    return sorted(p.name for p in env["save"].glob(f"{session}-*"))


def test_the_end_of_run_saves_and_sessions_rm_deletes_log_and_state(
    env: dict[str, Any], capsys: Any
) -> None:
    with FakeLlama([answer("One.")], save_dir=env["save"]) as fake:
        assert main(["run", "Hi", "--session", "gone", "--config", env["config"],
                     "--url", fake.url]) == 0
    files = state_files(env, "gone")
    assert [f.rsplit(".", 1)[1] for f in files] == ["bin", "json"]  # saved as the run ended
    meta = json.loads((env["save"] / files[1]).read_text())
    assert meta["session"] == "gone" and meta["tokens"] > 0 and meta["bytes"] > 0
    capsys.readouterr()
    assert main(["sessions", "rm", "gone", "--config", env["config"]]) == 0
    assert not (env["dir"] / "gone").exists()
    assert state_files(env, "gone") == []
    assert main(["sessions", "rm", "gone", "--config", env["config"]]) == 5
    assert "session gone does not exist" in capsys.readouterr().err


def test_sessions_rm_refuses_a_session_open_elsewhere(env: dict[str, Any], capsys: Any) -> None:
    from actors.log.file import SessionLog
    from tests.support.turn_rig import baseline

    log, _ = SessionLog.open(env["dir"] / "busy" / "log.bin", baseline=baseline(), name="busy")
    try:
        assert main(["sessions", "rm", "busy", "--config", env["config"]]) == 5
        assert "open in another process" in capsys.readouterr().err
        assert (env["dir"] / "busy" / "log.bin").is_file()
    finally:
        log.close()


def _run_to_the_second_request(
    env: dict[str, Any], url: str, session: str
) -> subprocess.Popen[str]:
    """`loopd run go` started; back once its second request is out (the fake then hangs)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "run", "go", "--json", "--session", session,
         "--config", env["config"], "--url", url],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        waits = 0
        for line in proc.stdout:
            if json.loads(line)["event"] == "waiting":
                waits += 1
                if waits == 2:
                    return proc
        raise AssertionError("loopd run ended before its second request")
    except BaseException:
        kill_tree(proc.pid)
        proc.wait()
        raise


def test_sigterm_mid_turn_still_saves_the_sessions_state(env: dict[str, Any]) -> None:
    call = ("call_tool", json.dumps({"name": "nothing", "arguments": {}}))
    with FakeLlama([answer(tool_calls=[call]), hang()], save_dir=env["save"]) as fake:
        proc = _run_to_the_second_request(env, fake.url, "term")
        try:
            assert state_files(env, "term") == []
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 130
        finally:
            proc.kill()
            proc.wait()
    assert len(state_files(env, "term")) == 2  # the shutdown saved what the slot held


def test_a_stop_that_outlasts_its_grace_ends_the_run_and_leaves_its_log_whole(
    env: dict[str, Any],
) -> None:
    """SIGTERM mid-turn; the model server then takes the KV save at the stop and never
    answers (inference.read_timeout_s an hour): `loopd run` waited for it that long. Past
    daemon.stop_grace_s it says so, kills its tool host and exits 1; the log is whole."""
    config = Path(env["config"])
    text = config.read_text().replace("[inference]\n", "[inference]\nread_timeout_s = 3600\n")
    config.write_text(text + '[daemon]\nstop_grace_s = 2\n[[tools.hosts]]\nname = "files"\n'
                      'tools = ["list_dir"]\n')
    call = ("call_tool", json.dumps({"name": "list_dir", "arguments": {"path": "."}}))
    with FakeLlama([answer(tool_calls=[call]), hang()], save_dir=env["save"]) as fake:
        proc = _run_to_the_second_request(env, fake.url, "stuck")
        try:
            started = psutil.Process(proc.pid).children()
            assert started, "the run runs its tool host"
            fake.slot_gate.clear()  # from now on every slot action waits for the test
            proc.send_signal(signal.SIGTERM)
            try:  # a hang guard, well past the grace
                code = proc.wait(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                raise AssertionError("loopd run hung on its stop") from None
            _, err = proc.communicate()
            assert any(a == "save" for a, _, _ in fake.slot_calls)  # what it waited on
        finally:
            fake.slot_gate.set()
            if proc.poll() is None:
                kill_tree(proc.pid)
            proc.wait()
    assert code == EXIT_CODE, err
    assert "loopd did not stop within daemon.stop_grace_s = 2 s" in err
    assert "Thread 0x" in err  # the stacks: where it was stuck
    psutil.wait_procs(started, timeout=HANG_S)
    assert not any(p.is_running() for p in started), "the tool host outlived the run"
    records, torn = read_log(env["dir"] / "stuck" / "log.bin", name="stuck")
    assert torn == 0
    assert [r.content for r in records if isinstance(r, User)] == ["go"]


def _old_log(path: Path) -> None:
    """A log as loopd wrote it before the slot keeper: no Usage.slot, no CacheLoss.cause."""
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    records = [
        {"kind": "baseline", "system": "s", "tools": [], "model": "m", "created": t, "time": t},
        {"kind": "user", "content": "hello", "time": t},
        {"kind": "assistant", "content": "Hi.", "reasoning": None, "tool_calls": [], "time": t},
        {"kind": "usage", "timings": {"cache_n": 2, "prompt_n": 8}, "reasoning_tokens": 0,
         "thinking_capped": False, "prompt_tokens": 10, "completion_tokens": 2,
         "finish_reason": "stop", "time": t},
        {"kind": "cache_loss", "expected": 10, "got": 2, "time": t},
    ]
    data = bytearray(HEADER)
    for r in records:
        payload = msgpack.packb(r, datetime=True)
        data += struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(data))


def test_a_log_written_before_the_keeper_still_opens_and_shows(
    env: dict[str, Any], capsys: Any
) -> None:
    _old_log(env["dir"] / "old" / "log.bin")
    assert main(["log", "show", "old", "--config", env["config"]]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "10 prompt (2 cached), 2 generated" in shown
    assert "prompt cache lost: expected 10 tokens, reused 2" in shown
    assert main(["log", "show", "old", "--json", "--config", env["config"]]) == 0
    kinds = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert kinds[3]["slot"] is None and kinds[4]["cause"] == ""
    with FakeLlama([answer("Again.")]) as fake:  # and the session goes on
        assert main(["run", "more", "--session", "old", "--config", env["config"],
                     "--url", fake.url]) == 0


def test_log_show_and_the_summary_tell_what_the_keeper_did() -> None:
    use = SlotUse("http://127.0.0.1:8080", 1, SlotState.RESTORED, 4646, 20.4)
    usage = Usage(timings={"cache_n": 4646}, reasoning_tokens=0, thinking_capped=False,
                  prompt_tokens=4658, completion_tokens=5, finish_reason="stop", slot=use)
    assert describe(usage).endswith(
        "; http://127.0.0.1:8080 slot 1: restored 4,646 tokens in 20 ms")
    line = summary(TurnOutcome(content="x", usage=usage, iterations=0, tool_calls=0, cut=False,
                               restored=use), 0.9)
    assert "(4646 from cache; restored 4,646 tokens in 20 ms)" in line
    # a fork's first restore says whose state it was
    forked = dataclasses.replace(use, reason=FORKED.format(origin="src"))
    said = "restored 4,646 tokens in 20 ms (the saved state of session src, which this one was"
    assert said in describe(dataclasses.replace(usage, slot=forked))
    assert said in summary(TurnOutcome(content="x", usage=usage, iterations=0, tool_calls=0,
                                       cut=False, restored=forked), 0.9)
    none = SlotUse("http://h", 0, SlotState.NONE, reason="no saved state")
    assert describe(Usage(timings={}, reasoning_tokens=0, thinking_capped=False, prompt_tokens=1,
                          completion_tokens=1, finish_reason="stop", slot=none)).endswith(
        "slot 0: nothing restored (no saved state)")


# --- saved state and its metadata are not trusted ----------------------------------


def _run(env: dict[str, Any], url: str, text: str = "Hi") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actors.cli", "run", text, "--session", "gone", "--local",
         "--config", env["config"], "--url", url],
        cwd=ROOT, text=True, capture_output=True, timeout=120,
    )


def test_bad_metadata_beside_a_session_is_skipped_not_a_traceback(env: dict[str, Any]) -> None:
    """A metadata file with "used": "yesterday" gave `loopd run --local` a traceback (the
    disk bound sorted it with the others). It is skipped, and the command says why."""
    with FakeLlama([answer("One."), answer("Two.")], save_dir=env["save"]) as fake:
        assert _run(env, fake.url).returncode == 0
        meta = next(env["save"].glob("gone-*.json"))
        bad = {**json.loads(meta.read_text()), "used": "yesterday",
               "file": "other-0.bin", "session": "other"}
        (env["save"] / "other-0.json").write_text(json.dumps(bad))
        done = _run(env, fake.url, "Again")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "other-0.json: used is not a time; skipped" in done.stderr
    assert "Two." in done.stdout


def test_a_state_file_swapped_for_a_symlink_to_dev_zero_is_not_read(env: dict[str, Any]) -> None:
    """The next `loopd run` spun reading /dev/zero for ever and ignored SIGTERM (the run's
    120 s timeout here). The file is not restored; the session re-processes and answers."""
    with FakeLlama([answer("One."), answer("Two.")], save_dir=env["save"]) as fake:
        assert _run(env, fake.url).returncode == 0
        state = next(env["save"].glob("gone-*.bin"))
        state.unlink()
        state.symlink_to("/dev/zero")
        done = _run(env, fake.url, "Again")
    assert done.returncode == 0, done.stderr
    assert "Two." in done.stdout
    assert not state.is_symlink() and state.is_file()  # never followed; the new save replaced it


def test_removing_a_session_whose_directory_is_a_symlink_is_refused_clearly(
    env: dict[str, Any], tmp_path: Path, capsys: Any
) -> None:
    """It ended in a traceback (rmtree refuses a symlink); through it, a whole other tree
    could have gone. Now: exit 5, what and why, and nothing deleted."""
    elsewhere = tmp_path / "elsewhere"
    with FakeLlama([answer("One.")], save_dir=env["save"]) as fake:
        assert main(["run", "Hi", "--session", "real", "--config", env["config"],
                     "--url", fake.url]) == 0
    (env["dir"] / "real").rename(elsewhere)
    (env["dir"] / "linked").symlink_to(elsewhere)
    (elsewhere / "precious.txt").write_text("keep me")
    capsys.readouterr()
    assert main(["sessions", "rm", "linked", "--config", env["config"]]) == 5
    err = capsys.readouterr().err
    assert f"its directory {env['dir'] / 'linked'} is a symlink (to {elsewhere})" in err
    assert "Traceback" not in err
    assert (elsewhere / "precious.txt").read_text() == "keep me"
    assert (elsewhere / "log.bin").is_file() and (env["dir"] / "linked").is_symlink()
