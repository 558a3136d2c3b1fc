"""``loopd sessions fork`` and ``loopd rewind`` in this process (no daemon), and how ``loopd
log show`` tells the story: turns numbered, rewound ones marked, the fork's note."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from actors.cli.main import main
from actors.log.file import read_records
from actors.log.records import Forked, Rewind
from actors.session.messages import view
from tests.support.fake_llama import FakeLlama, answer


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Any]:
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'[log]\ndir = "{tmp_path / "sessions"}"\nfsync = "never"\n'
        f'[tools]\nstandard = false\nworkspace = "{tmp_path}"\n'
        "[inference]\nretries = 1\nbackoff_s = 0.01\ntimeout_s = 20\n"
    )
    return {"config": str(config), "dir": tmp_path / "sessions"}


def loopd(env: dict[str, Any], *args: str) -> int:
    return main([*args, "--config", env["config"]])


def run(env: dict[str, Any], url: str, *args: str) -> int:
    return loopd(env, *args[:1], "--url", url, *args[1:])


def test_fork_rewind_and_the_log_that_tells_it(env: dict[str, Any], capsys: Any) -> None:
    with FakeLlama([answer("One."), answer("Two."), answer("Other."), answer("Again.")]) as fake:
        assert run(env, fake.url, "run", "first", "--session", "a") == 0
        assert run(env, fake.url, "run", "second", "--session", "a") == 0
        source = env["dir"] / "a" / "log.bin"
        before = hashlib.sha256(source.read_bytes()).hexdigest()
        capsys.readouterr()
        assert loopd(env, "sessions", "fork", "a", "b", "--at", "1") == 0
        said = " ".join(capsys.readouterr().err.split())
        assert "session b: forked from a at turn 1 (4 records copied; a is unchanged)" in said
        assert "a has no saved KV state" in said  # the fake server here keeps none
        assert hashlib.sha256(source.read_bytes()).hexdigest() == before
        assert run(env, fake.url, "run", "third", "--session", "b") == 0
        # the fork's first request: the source's first turn, then the new message
        sent = fake.requests[-1]["messages"]
        assert [m["content"] for m in sent[1:]] == ["first", "One.", "third"]
        assert loopd(env, "rewind", "b") == 0
        said = " ".join(capsys.readouterr().err.split())
        assert "session b: took back turn 2 (kept in its log: loopd log show b); the next " \
               "message follows turn 1" in said
        assert run(env, fake.url, "run", "fourth", "--session", "b") == 0
        assert [m["content"] for m in fake.requests[-1]["messages"][1:]] == [
            "first", "One.", "fourth"]
    records = read_records(env["dir"] / "b" / "log.bin")
    assert [type(r).__name__ for r in records if isinstance(r, Forked | Rewind)] == [
        "Forked", "Rewind"]
    assert view(records).turns == (1, 3)
    capsys.readouterr()
    assert loopd(env, "log", "show", "b") == 0
    lines = capsys.readouterr().out.splitlines()
    flat = [" ".join(line.split()) for line in lines]
    assert any("user turn 1: first" in line for line in flat)
    assert any("forked forked from session a after its turn 1" in line for line in flat)
    assert any("user (rewound) turn 2: third" in line for line in flat)
    assert any("assistant (rewound) Other." in line for line in flat)
    assert any("rewind the conversation goes back to turn 1" in line for line in flat)
    assert any("user turn 3: fourth" in line for line in flat)
    assert sum("(rewound)" in line for line in flat) == 3  # turn 2's user, assistant, usage


def test_rewinding_every_turn_then_one_more_is_refused(env: dict[str, Any], capsys: Any) -> None:
    with FakeLlama([answer("One.")]) as fake:
        assert run(env, fake.url, "run", "first", "--session", "a") == 0
    assert loopd(env, "rewind", "a") == 0
    assert "the next message starts the conversation afresh" in capsys.readouterr().err
    assert loopd(env, "rewind", "a", "--turns", "1") == 2
    assert "session a has no turns to take back, not 1" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "code", "said"), [
    (("sessions", "fork", "nope", "b"), 5, "session nope does not exist"),
    (("sessions", "fork", "a", "a"), 2, "a fork needs a new name"),
    (("sessions", "fork", "a", "b", "--at", "3"), 2, "session a has turns 1 to 1"),
    (("sessions", "fork", "a", "b", "--at", "-1"), 2, "--at is a turn of a"),
    (("sessions", "fork", "a", "../b"), 2, "is not allowed"),
    (("rewind", "a", "--turns", "0"), 2, "1 or more, not 0"),
    (("rewind", "a", "--turns", "2"), 2, "session a has only 1 turn to take back, not 2"),
    (("rewind", "nope"), 5, "session nope does not exist"),
])
def test_bad_forks_and_rewinds_exit_with_what_and_why(
    env: dict[str, Any], capsys: Any, args: tuple[str, ...], code: int, said: str
) -> None:
    with FakeLlama([answer("One.")]) as fake:
        assert run(env, fake.url, "run", "first", "--session", "a") == 0
    source = env["dir"] / "a" / "log.bin"
    before = source.read_bytes()
    capsys.readouterr()
    assert loopd(env, *args) == code
    assert said in " ".join(capsys.readouterr().err.split())
    assert source.read_bytes() == before
    assert sorted(p.name for p in Path(env["dir"]).iterdir() if not p.name.startswith(".")) == [
        "a"]
