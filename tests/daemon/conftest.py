"""What the daemon tests share: a fake model server, a short runtime directory, and the
daemon the approval and chat tests use (write_file needs approval there)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.daemonkit import Daemon, daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.tools.hostkit import short_dir


@pytest.fixture
def fake() -> Iterator[FakeLlama]:
    with FakeLlama(agent()) as server:
        yield server


@pytest.fixture
def run_dir() -> Iterator[Path]:
    with short_dir() as d:
        yield d / "run"


@pytest.fixture
def asking_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose tools.allow has run_command only (write_file asks)."""
    with short_dir() as d, FakeLlama(agent()) as fake:
        path = daemon_config(tmp_path, d / "run", fake.url, allow=("run_command",))
        with Daemon(path) as running:
            yield running
