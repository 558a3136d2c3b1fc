"""The session actor: owns the log in its thread, reports open errors to the caller."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import pykka
import pytest

from actors.base.config import Config, parse
from actors.base.errors import LogCorrupt, SessionError, SessionLocked, UsageError
from actors.log.file import SessionLog
from actors.log.records import Baseline, ToolResult, User
from actors.log.sessiondir import check_name, list_sessions
from actors.session.actor import SessionActor, open_session
from actors.tools.protocol.spec import ResultClass
from tests.support.watch import HANG_S

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
BASE = Baseline(system="s", tools=(), model="m", created=T0, time=T0)
WAIT = HANG_S


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return parse({"log": {"dir": str(tmp_path / "sessions"), "fsync": "always"}})


@pytest.fixture
def session(config: Config) -> Iterator[pykka.ActorProxy[SessionActor]]:
    proxy = open_session(config, "alpha", BASE)
    try:
        yield proxy
    finally:
        proxy.actor_ref.stop(timeout=WAIT)


def test_creates_appends_and_reopens(
    config: Config, session: pykka.ActorProxy[SessionActor]
) -> None:
    report = session.ready().get(timeout=WAIT)
    assert (report.records, report.cut_bytes, report.created) == (1, 0, True)
    user = User(content="hi", time=T0)
    session.append(user).get(timeout=WAIT)
    assert session.records().get(timeout=WAIT) == (BASE, user)
    assert session.next_call().get(timeout=WAIT) == 1
    result = ToolResult(
        call=1, tool_call_id="x", content="ok", class_=ResultClass.PUBLIC,
        untrusted=False, truncated=False, time=T0,
    )
    session.append(result).get(timeout=WAIT)
    session.actor_ref.stop(timeout=WAIT)  # on_stop releases the lock

    again = open_session(config, "alpha")
    try:
        assert again.records().get(timeout=WAIT) == (BASE, user, result)
        assert again.next_call().get(timeout=WAIT) == 2
        assert not again.ready().get(timeout=WAIT).created
    finally:
        again.actor_ref.stop(timeout=WAIT)
    assert (config.log_dir / "alpha" / "log.bin").is_file()


def test_second_actor_on_the_same_session_gets_open_elsewhere(
    config: Config, session: pykka.ActorProxy[SessionActor]
) -> None:
    before = len(pykka.ActorRegistry.get_all())
    with pytest.raises(SessionLocked, match="session alpha is open elsewhere"):
        open_session(config, "alpha", BASE)
    assert len(pykka.ActorRegistry.get_all()) == before  # the refused actor was stopped
    session.append(User(content="still mine")).get(timeout=WAIT)


def test_open_error_is_raised_on_every_ask_of_a_plainly_started_actor(config: Config) -> None:
    ref = SessionActor.start(config, "nobody")  # no baseline, no such session
    try:
        with pytest.raises(SessionError, match="session nobody does not exist"):
            ref.proxy().records().get(timeout=WAIT)
        with pytest.raises(SessionError, match="does not exist"):
            ref.proxy().append(User(content="x")).get(timeout=WAIT)
    finally:
        ref.stop(timeout=WAIT)


def test_corrupt_log_is_raised_to_the_caller(config: Config) -> None:
    path = config.log_dir / "broken" / "log.bin"
    log, _ = SessionLog.open(path, baseline=BASE)
    with log:
        log.append(User(content="a"))
        log.append(User(content="b"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt, match="session broken"):
        open_session(config, "broken")


def test_torn_tail_is_reported(config: Config) -> None:
    path = config.log_dir / "torn" / "log.bin"
    log, _ = SessionLog.open(path, baseline=BASE)
    log.close()
    with open(path, "ab") as f:
        f.write(b"\x10\0\0\0partial")
    proxy = open_session(config, "torn")
    try:
        assert proxy.ready().get(timeout=WAIT).cut_bytes == 11
    finally:
        proxy.actor_ref.stop(timeout=WAIT)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", ".hidden", "a\0b", "x" * 129])
def test_unsafe_names_are_refused(config: Config, name: str) -> None:
    with pytest.raises(UsageError, match="is not allowed: use 1 to 128 letters"):
        open_session(config, name, BASE)
    assert not config.log_dir.exists()


def test_check_name_accepts_ordinary_names() -> None:
    assert check_name("demo-20250101-120000") == "demo-20250101-120000"
    assert check_name("a.b_c") == "a.b_c"


def test_list_sessions(config: Config) -> None:
    assert list_sessions(config) == []
    for name in ("b", "a"):
        SessionLog.open(config.log_dir / name / "log.bin", baseline=BASE)[0].close()
    (config.log_dir / "not-a-session").mkdir()
    assert list_sessions(config) == ["a", "b"]


def test_stop_after_failure_closes_the_log(config: Config) -> None:
    """on_failure (a failing tell) releases the lock like on_stop does."""
    before = set(threading.enumerate())
    proxy = open_session(config, "gamma", BASE)
    (thread,) = [t for t in threading.enumerate() if t not in before]
    proxy.append.defer("not a record")  # pykka: a tell that raises kills the actor
    # pykka marks the actor stopped before on_failure runs: wait for its thread to end
    thread.join(WAIT)
    assert not thread.is_alive()
    log, _ = SessionLog.open(config.log_dir / "gamma" / "log.bin")
    log.close()
