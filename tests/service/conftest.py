"""The two places a session service runs, for the contract suite: each test of
``tests/service/`` runs once in this process and once through a real ``loopd serve``
process, as pykka's own suite runs each test on each of its runtimes.

Both are made by the one chooser (:func:`actors.service.choose.choose`) on one config
(the daemon tests' :func:`tests.daemon.daemonkit.daemon_config`) and one fake llama-server
whose answers the test's message decides (:func:`script`). The model server, the daemon and
the in-process world are shared by the tests of a module (they take seconds to start);
every test uses session names of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors.base import config as cfg
from actors.service.choose import choose
from actors.service.local import LocalService
from actors.service.remote import RemoteService
from actors.service.types import SessionService
from tests.daemon.daemonkit import Daemon, daemon_config
from tests.support.fake_llama import FakeLlama, Reply, context_full, hang
from tests.support.scripted_llama import agent
from tests.tools.hostkit import short_dir

FULL, HANG = "fill the context", "hang on"  # messages the fake answers unlike the agent


def script() -> Callable[[dict[str, Any]], Reply]:
    """The scripted agent (tests/support/scripted_llama.py), but for two messages: FULL is
    answered "exceeds the available context size", HANG never (until the turn is cancelled)."""
    scripted = agent()

    def reply(body: dict[str, Any]) -> Reply:
        users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
        last = str(users[-1].get("content")) if users else ""
        if FULL in last:
            return context_full()
        if HANG in last:
            return hang()
        return scripted(body)

    return reply


@dataclass
class Place:
    """One implementation under test: ``service`` for the test's client, ``other()`` a second
    client of the same place (another connection to the daemon; another client of the same
    table in this process), ``fake`` the model server."""

    kind: str
    service: SessionService
    other: Callable[[], SessionService]
    fake: FakeLlama
    names: Iterator[int]

    def name(self, what: str) -> str:
        """A session name no other test of the module uses."""
        return f"{self.kind}-{what}-{next(self.names)}"


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    """The in-process world lives for the module (:func:`place` stops every actor at its
    end), not for a test, as tests/conftest.py's guard would have it."""
    yield


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlama]:
    with FakeLlama(script()) as server:
        yield server


@pytest.fixture(scope="module")
def config_path(fake: FakeLlama, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with short_dir() as d:
        yield daemon_config(tmp_path_factory.mktemp("service"), d / "run", fake.url)


@pytest.fixture(scope="module", params=["in-process", "daemon"])
def place(request: pytest.FixtureRequest, fake: FakeLlama, config_path: Path) -> Iterator[Place]:
    config = cfg.load(config_path)
    names = itertools.count(1)
    if request.param == "in-process":
        service = choose(config, lambda _: None, local=True)
        assert isinstance(service, LocalService)
        local = service
        try:
            yield Place("in-process", service, lambda: LocalService(local.table, b"other"),
                        fake, names)
        finally:
            service.shutdown()
            pykka.ActorRegistry.stop_all(timeout=10)
        return
    with Daemon(config_path):
        service = choose(config, lambda _: None)
        assert isinstance(service, RemoteService)
        others: list[SessionService] = []

        def other() -> SessionService:
            others.append(choose(config, lambda _: None))
            return others[-1]

        try:
            yield Place("daemon", service, other, fake, names)
        finally:
            for s in [service, *others]:
                s.shutdown()
