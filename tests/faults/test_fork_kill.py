"""A fork SIGKILLed at each point of its work, in a process of its own: NEW is absent or
whole (never half), SRC is unchanged, and the next fork sweeps what the killed one left (its
hidden directory and the KV state it had copied for a NEW that was never made)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from actors.base.config import Config
from actors.base.errors import UsageError
from actors.log.file import read_records
from actors.log.records import Forked, Record
from actors.session.fork import fork_session
from tests.faults.fork_child import POINTS, config_at
from tests.faults.killpoint import kill_at
from tests.support.fork_source import source, states


def assert_whole(config: Config, name: str, src: list[Record]) -> None:
    new = read_records(config.log_dir / name / "log.bin")
    assert list(new[:-1]) == src and isinstance(new[-1], Forked)
    assert dataclasses.replace(new[-1], time=src[0].time) == Forked(
        from_="src", at=40, time=src[0].time)
    assert states(config)[name].origin == "src"


@pytest.mark.parametrize("point", POINTS)
def test_a_fork_killed_anywhere_leaves_new_absent_or_whole(tmp_path: Path, point: str) -> None:
    config = config_at(tmp_path)
    path = source(config)
    before, src = path.read_bytes(), list(read_records(path))
    kill_at("tests.faults.fork_child", tmp_path, point)
    assert path.read_bytes() == before
    new = config.log_dir / "new"
    assert new.exists() == (point == "after-rename"), "only a renamed NEW is there, and whole"
    if new.exists():
        assert_whole(config, "new", src)
        with pytest.raises(UsageError, match="session new exists"):
            fork_session(config, "src", "new")
        fork_session(config, "src", "other")  # the killed fork's lock went with it
        assert sorted(states(config)) == ["new", "other", "src"]
    else:
        fork_session(config, "src", "new")  # the lock is free, the leftovers swept
        assert_whole(config, "new", src)
        assert sorted(states(config)) == ["new", "src"]
    assert [p.name for p in config.log_dir.iterdir() if p.name.startswith(".fork-")] == []
    assert path.read_bytes() == before


def test_the_state_a_killed_fork_copied_is_swept_with_its_directory(tmp_path: Path) -> None:
    config = config_at(tmp_path)
    source(config)
    kill_at("tests.faults.fork_child", tmp_path, "state")
    assert sorted(states(config)) == ["new", "src"]  # copied for a NEW that is not there
    fork_session(config, "src", "other")
    # a session made later under the name starts from no state rather than src's
    assert sorted(states(config)) == ["other", "src"]
    assert not (config.log_dir / "new").exists()
