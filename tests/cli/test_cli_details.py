"""Small things a person meets on the command line: the version, an answer printed once,
what a rewind of a session that is not there says, the tokens after a compaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.cli.main import main
from tests.cli.clikit import cli_env
from tests.support.fake_llama import FakeLlama, answer


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
