"""actors/service/local.py's SessionTable on its own: one client per session, and when a session's
actor is stopped (a client closing it, a client gone mid-turn, the daemon stopping).

Real session actors on real logs in a temporary directory; the clients are just ids, as
the daemon's loop knows them. A session's actor holds its log's lock, so "the session was
closed" is seen directly: another open of the same log in this process succeeds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from actors.base.config import Config
from actors.base.errors import (
    Cancelled,
    DaemonError,
    SessionError,
    SessionInUse,
    SessionLocked,
    UsageError,
)
from actors.inference.types import InferError
from actors.log.records import Baseline
from actors.service.local import SessionTable, Worlds
from actors.session.actor import open_session
from actors.session.turn import Runtime
from actors.session.world import World
from actors.tools.registry import Registry
from tests.support.watch import HANG_S, Background, wait_until

A, B = b"client-a", b"client-b"


class HookedWorld(World):
    """A World whose ``baseline()`` (read while a new session is being opened) runs a hook."""

    hook: Callable[[], None] = staticmethod(lambda: None)

    def baseline(self) -> Baseline:
        self.hook()
        return super().baseline()


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[SessionTable]:
    config = Config().replace("log", dir=str(tmp_path / "sessions"), fsync="never")
    runtime = Runtime(config=config, inference=cast(Any, None), registry=Registry([]))
    table = SessionTable(Worlds(config, HookedWorld(runtime=runtime, model="m")))
    yield table
    table.close_all()


def closed(table: SessionTable, name: str) -> bool:
    """Whether the session's actor let go of its log (it can be opened again here)."""
    try:
        proxy = open_session(table.config, name)
    except SessionLocked:
        return False
    proxy.actor_ref.stop(timeout=30)
    return True


def test_a_session_is_attached_to_one_client(sessions: SessionTable) -> None:
    assert sessions.attach(A, "s", create=True) == (True, 1, 0)  # created: the Baseline
    assert sessions.attach(A, "s", create=True) == (False, 1, 0)  # again: already attached
    with pytest.raises(SessionInUse, match=r"^session s is in use by another client$"):
        sessions.attach(B, "s", create=True)
    assert sessions.is_attached(A, "s") and not sessions.is_attached(B, "s")
    assert sessions.rows() == [{"name": "s", "busy": False}]
    assert not closed(sessions, "s")


def test_a_session_that_does_not_exist_is_not_left_claimed(sessions: SessionTable) -> None:
    with pytest.raises(SessionError):
        sessions.attach(A, "missing", create=False)
    assert sessions.rows() == []
    assert sessions.attach(B, "missing", create=True)[0] is True  # nobody holds the name


def test_a_log_open_elsewhere_is_refused_and_not_left_claimed(sessions: SessionTable) -> None:
    sessions.attach(A, "s", create=True)
    sessions.detach(A, "s")
    elsewhere = open_session(sessions.config, "s")
    try:
        with pytest.raises(SessionLocked):
            sessions.attach(A, "s", create=False)
        assert sessions.rows() == []
    finally:
        elsewhere.actor_ref.stop(timeout=30)
    assert sessions.attach(A, "s", create=False) == (False, 1, 0)


def test_one_turn_at_a_time_and_only_for_the_attached_client(sessions: SessionTable) -> None:
    sessions.attach(A, "s", create=True)
    with pytest.raises(UsageError, match="session s is not open for this client"):
        sessions.begin_turn(B, "s")
    proxy = sessions.begin_turn(A, "s")
    assert proxy.actor_ref.is_alive()
    assert sessions.rows() == [{"name": "s", "busy": True}]
    with pytest.raises(UsageError, match="a turn is already running on session s"):
        sessions.begin_turn(A, "s")
    with pytest.raises(UsageError, match="a turn is running on session s; cancel it first"):
        sessions.detach(A, "s")
    sessions.end_turn("s")
    assert sessions.begin_turn(A, "s") is not None
    sessions.end_turn("s")


def test_detaching_stops_the_actor(sessions: SessionTable) -> None:
    sessions.attach(A, "s", create=True)
    sessions.detach(B, "s")  # not B's: nothing happens
    assert not closed(sessions, "s")
    sessions.detach(A, "s")
    assert sessions.rows() == [] and closed(sessions, "s")
    assert sessions.attach(B, "s", create=False) == (False, 1, 0)  # free for another client


def test_a_client_gone_mid_turn_keeps_the_session_until_the_turn_ends(
    sessions: SessionTable,
) -> None:
    sessions.attach(A, "busy", create=True)
    sessions.attach(A, "idle", create=True)
    sessions.attach(B, "other", create=True)
    sessions.begin_turn(A, "busy")
    sessions.release_client(A)
    assert closed(sessions, "idle")  # closed at once
    assert not closed(sessions, "busy")  # its turn still runs on it
    assert sessions.rows() == [{"name": "busy", "busy": True}, {"name": "other", "busy": False}]
    sessions.end_turn("busy")
    assert closed(sessions, "busy")
    assert sessions.rows() == [{"name": "other", "busy": False}]
    assert not closed(sessions, "other")  # another client's session is untouched


def test_close_all_stops_every_actor(sessions: SessionTable) -> None:
    for client, name in ((A, "one"), (B, "two")):
        sessions.attach(client, name, create=True)
    sessions.close_all()
    assert sessions.rows() == []
    assert closed(sessions, "one") and closed(sessions, "two")


def test_a_session_released_while_it_opens_is_closed_and_says_so(sessions: SessionTable) -> None:
    """The client went (or the daemon began to stop) while the log was being read."""
    world = cast(HookedWorld, sessions.worlds.get())
    # the release arrives while the name is claimed and the log not yet open
    world.hook = lambda: sessions.release_client(A)  # type: ignore[method-assign]
    with pytest.raises(DaemonError, match="session s was closed while it opened"):
        sessions.attach(A, "s", create=True)
    assert sessions.rows() == [] and closed(sessions, "s")


class BlockedModel:
    """A model that answers nothing until released: the session actor stays busy."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.gate = threading.Event()

    def complete(self, request: Any, sink: Any, cancel: Any) -> Any:
        self.asked.set()
        self.gate.wait(HANG_S)
        raise InferError.cancelled("released by the test")

    def context(self, session: str) -> int:
        return 0  # not known: no compaction before the request

    def tokens(self, session: str, text: str) -> int:
        return len(text) // 4

    def turn_ended(self, session: str) -> None:
        pass


def test_a_session_whose_actor_is_still_stopping_is_waited_for_not_found_locked(
    sessions: SessionTable, caplog: pytest.LogCaptureFixture
) -> None:
    """Detached is not yet closed: the actor lets go of the log when its work ends. Another
    client opening the session then waits for that instead of finding the log locked."""
    sessions.attach(A, "s", create=True)
    proxy = sessions.begin_turn(A, "s")
    model = BlockedModel()
    runtime = Runtime(config=sessions.config, inference=model, registry=Registry([]))
    work = proxy.turn(runtime, "Hi?", lambda _e: None)  # the actor is busy with it
    assert model.asked.wait(HANG_S)
    sessions.end_turn("s")  # the table's turn is over; the actor's work is not
    detaching = Background(lambda: sessions.detach(A, "s"))  # waits for the actor's stop
    wait_until(lambda: sessions.rows() == [], what="the session to leave the table")
    caplog.set_level(logging.INFO, logger="loopd.service")
    opening = Background(lambda: sessions.attach(B, "s", create=False))
    wait_until(lambda: "waiting for its last actor" in caplog.text, what="the open to wait")
    model.gate.set()
    detaching.join()
    assert opening.join() == (False, 2, 0)  # the Baseline and the turn's User record
    with pytest.raises(Cancelled):
        work.get(timeout=HANG_S)
