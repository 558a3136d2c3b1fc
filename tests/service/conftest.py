"""The two places a session service runs, for the contract suite: each test of
``tests/service/`` runs once in this process and once through a real ``loopd serve``
process, as pykka's own suite runs each test on each of its runtimes.

Both are made by the one chooser (:func:`actors.service.choose.choose`) on one config
(the daemon tests' :func:`tests.daemon.daemonkit.daemon_config`) and one fake llama-server
whose answers the test's message decides
(:func:`tests.support.service_places.script`). The model server, the daemon and
the in-process world are shared by the tests of a module (they take seconds to start);
every test uses session names of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pykka
import pytest

from actors.base import config as cfg
from actors.service.choose import choose
from actors.service.local import LocalService
from actors.service.remote import RemoteService
from actors.service.types import SessionService
from tests.daemon.daemonkit import Daemon, daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.service_places import Place, script
from tests.tools.hostkit import short_dir


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
