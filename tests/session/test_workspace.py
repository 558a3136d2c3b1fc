"""A session keeps the workspace it was made with: remembered at its first open, and a world
on another workspace is refused (the session's actor stopped again, its log untouched)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from actors.base.config import Config, parse
from actors.base.errors import UsageError
from actors.log.records import Baseline
from actors.log.sessiondir import kept_workspace
from actors.session.actor import open_session

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
BASE = Baseline(system="s", tools=(), model="m", created=T0, time=T0)


def _config(tmp_path: Path, workspace: Path, **tools: object) -> Config:
    workspace.mkdir(exist_ok=True)
    return parse({"log": {"dir": str(tmp_path / "sessions")},
                  "tools": {"workspace": str(workspace), **tools}})


def test_a_session_remembers_its_workspace_and_refuses_another(tmp_path: Path) -> None:
    made = _config(tmp_path, tmp_path / "garden")
    open_session(made, "d1", BASE).actor_ref.stop()
    assert kept_workspace(made, "d1") == (tmp_path / "garden").resolve()
    elsewhere = _config(tmp_path, tmp_path / "kitchen")
    log = tmp_path / "sessions" / "d1" / "log.bin"
    before = log.read_bytes()
    with pytest.raises(UsageError, match=r"session d1 works on .*garden .*not .*kitchen"):
        open_session(elsewhere, "d1", BASE)
    assert log.read_bytes() == before
    open_session(made, "d1", BASE).actor_ref.stop()  # its own workspace: opens (not locked)


def test_a_session_older_than_the_file_adopts_the_workspace_of_its_next_open(
    tmp_path: Path,
) -> None:
    made = _config(tmp_path, tmp_path / "garden")
    open_session(made, "old", BASE).actor_ref.stop()
    (tmp_path / "sessions" / "old" / "workspace").unlink()
    assert kept_workspace(made, "old") is None
    other = _config(tmp_path, tmp_path / "kitchen")
    open_session(other, "old", BASE).actor_ref.stop()
    assert kept_workspace(other, "old") == (tmp_path / "kitchen").resolve()


def test_without_local_tools_no_workspace_is_kept(tmp_path: Path) -> None:
    remote_only = _config(tmp_path, tmp_path / "garden", standard=False)
    open_session(remote_only, "r", BASE).actor_ref.stop()
    assert kept_workspace(remote_only, "r") is None
