"""Small things a person meets on the command line: the version, an answer printed once,
what a rewind of a session that is not there says, the tokens after a compaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.cli.main import main
from actors.log.file import SessionLog, read_records
from actors.log.records import Compaction, CompactionBy
from tests.cli.clikit import cli_env
from tests.support.fake_llama import FakeLlama, answer
from tests.support.turn_rig import baseline


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Any]:
    return cli_env(tmp_path, standard=False)


def run(env: dict[str, Any], url: str, *args: str) -> int:
    return main([*args[:1], "--config", env["config"], "--url", url, *args[1:]])


def test_version(capsys: Any) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("loopd ") and out.split()[1][0].isdigit(), out


def test_with_stdout_and_stderr_both_piped_the_answer_is_printed_once(
        env: dict[str, Any], capsys: Any) -> None:
    """Neither is a terminal (a script capturing both, `2>&1 | tee`): the answer is on
    stdout once; it was streamed to stderr as well."""
    with FakeLlama([answer("Hello there.")]) as fake:
        assert run(env, fake.url, "run", "Hi", "--session", "a") == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Hello there."
    assert "Hello there." not in err and "prompt tokens" in err


def test_a_rewind_of_a_session_that_is_not_there_says_so(
        env: dict[str, Any], capsys: Any) -> None:
    assert main(["rewind", "nosuch", "--config", env["config"], "--local"]) == 5
    err = " ".join(capsys.readouterr().err.split())
    assert "session nosuch does not exist" in err and "loopd sessions" in err, err
    assert "baseline" not in err


def test_an_elided_compaction_starts_no_model_server_and_no_tool_host(
        env: dict[str, Any], capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`loopd compact` on the embedded model (elide: its default) needs no model: it started
    llama-server and three tool hosts for it. Then `loopd sessions` shows the tokens after
    it (it showed 0 until the next request)."""
    with FakeLlama([answer("One " * 30), answer("Two " * 30), answer("Three.")]) as fake:
        for word in ("one", "two", "three"):  # the session's turns on a server
            assert run(env, fake.url, "run", f"{word} " * 40, "--session", "a") == 0
        asked = len(fake.requests)

        def no_world(*args: Any, **kw: Any) -> Any:
            raise AssertionError("a world (model server, tool hosts) was started")

        monkeypatch.setattr("actors.session.world.start_world", no_world)
        capsys.readouterr()
        assert main(["compact", "a", "--config", env["config"]]) == 0
        said = " ".join(capsys.readouterr().err.split())
        assert "compacted: " in said and "starting" not in said, said
        assert len(fake.requests) == asked
    records = read_records(env["dir"] / "a" / "log.bin")
    (compaction,) = [r for r in records if isinstance(r, Compaction)]
    assert compaction.by is CompactionBy.PERSON and compaction.tokens_after > 0
    assert main(["sessions", "--config", env["config"]]) == 0
    line = capsys.readouterr().out.split()
    assert line[:2] == ["a", f"{compaction.tokens_after:,}"], line


def test_a_fork_before_a_compaction_says_its_first_message_is_not_warm(
        env: dict[str, Any], capsys: Any) -> None:
    """The source's saved state holds its compacted conversation: a fork at a turn before
    the compaction reuses only the baseline (it promised its first message alone)."""
    with FakeLlama([answer("One."), answer("Two."), answer("Three.")]) as fake:
        with open(env["config"], "a") as f:
            f.write('[session]\ncompaction = "elide"\n')
        for word in ("one", "two", "three"):
            assert run(env, fake.url, "run", word, "--session", "a") == 0
        assert run(env, fake.url, "compact", "a") == 0
        capsys.readouterr()
        assert main(["sessions", "fork", "a", "b", "--at", "1", "--local",
                     "--config", env["config"]]) == 0
        said = " ".join(capsys.readouterr().err.split())
        assert "a was compacted after turn 1" in said and "processed alone" not in said, said
        assert main(["sessions", "fork", "a", "c", "--local", "--config", env["config"]]) == 0
        assert "compacted after" not in capsys.readouterr().err


def test_run_local_on_a_session_open_elsewhere_says_so_before_starting_a_server(
        env: dict[str, Any], capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`loopd run --local` on a session the daemon has: said after a model server and the
    tool hosts had started (minutes for the embedded one), now before."""
    log, _ = SessionLog.open(env["dir"] / "busy" / "log.bin", baseline=baseline(), name="busy")

    def no_world(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a world (model server, tool hosts) was started")

    monkeypatch.setattr("actors.session.world.start_world", no_world)
    try:
        assert main(["run", "hi", "--session", "busy", "--local",
                     "--config", env["config"]]) == 5
        err = " ".join(capsys.readouterr().err.split())
        assert "session busy is open elsewhere (pid" in err and "--local" in err, err
    finally:
        log.close()
    monkeypatch.undo()
    with FakeLlama([answer("Free now.")]) as fake:  # the check took no lock of its own
        assert run(env, fake.url, "run", "hi", "--session", "busy") == 0
