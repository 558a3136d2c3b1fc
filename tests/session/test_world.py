"""World.close_sessions: the end of a command never fails on a session that is still busy."""

from __future__ import annotations

import threading
from typing import Any, cast

import pykka

from actors.base.config import Config
from actors.session.turn import Runtime
from actors.session.world import World
from actors.tools.registry import Registry
from tests.support.watch import HANG_S


class _Busy(pykka.ThreadingActor):
    """Stands in for a session actor still saving its KV state after the turn."""

    def work(self, release: threading.Event) -> None:
        release.wait(30)


def _app() -> World:
    runtime = Runtime(config=Config(), inference=cast(Any, None), registry=Registry([]))
    # the busy one waits all of it; an idle one must stop within it, even on a busy machine
    return World(runtime=runtime, model="m", stop_timeout_s=3.0)


def test_a_session_still_busy_is_told_to_stop_and_the_command_ends_with_a_warning() -> None:
    release = threading.Event()
    busy = _Busy.start()
    idle = _Busy.start()
    try:
        busy.proxy().work(release)  # runs until released
        app = _app()
        app.sessions += [busy.proxy(), idle.proxy()]
        said: list[str] = []
        app.close_sessions(said.append)  # no pykka.Timeout out of here
        assert len(said) == 1 and "still busy after 3 s" in said[0]
        assert app.sessions == []
        assert not idle.is_alive()  # the others were still stopped
        release.set()
        assert busy.actor_stopped.wait(HANG_S)  # the stop it was sent takes effect after its work
    finally:
        release.set()
        pykka.ActorRegistry.stop_all(timeout=10)


def test_a_session_already_gone_is_not_an_error() -> None:
    gone = _Busy.start()
    proxy = gone.proxy()
    gone.stop()
    app = _app()
    app.sessions.append(proxy)
    said: list[str] = []
    app.close_sessions(said.append)
    assert said == [] and app.sessions == []
