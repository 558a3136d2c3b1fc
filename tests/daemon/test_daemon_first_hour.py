"""What a newcomer meets with a daemon running: the CLI in real processes against a
real ``loopd serve``, the fake llama-server (the agent script) on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.daemonkit import Daemon, cli, daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.tools.hostkit import short_dir

ASIDE = "a loopd daemon is running, but --workspace gives this command a world of its own"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with (short_dir() as d, FakeLlama(agent()) as fake,
          Daemon(daemon_config(tmp_path, d / "run", fake.url)) as running):
        yield running


def test_status_shows_the_workspace_and_the_model_and_counts_no_client_of_its_own(
    daemon: Daemon,
) -> None:
    shown = cli(daemon.config_path, "status")
    assert shown.returncode == 0, shown.stderr
    first, *rest = shown.stdout.splitlines()
    assert first.endswith("no clients besides this one"), shown.stdout
    assert f"  workspace {daemon.config.workspace}" in rest
    assert any(line.startswith("  model llama-server at http://127.0.0.1:") for line in rest)
    with daemon.client() as client:
        client.open("kept")
        shown = cli(daemon.config_path, "status")
    assert "1 client besides this one" in shown.stdout.splitlines()[0]


def test_a_workspace_of_its_own_beside_the_daemon_is_said_and_the_session_keeps_it(
    daemon: Daemon, tmp_path: Path,
) -> None:
    garden = tmp_path / "garden"
    garden.mkdir()
    (garden / "beds.csv").write_text("bed,plant\n")
    own = cli(daemon.config_path, "run", "t1 :: list_dir {}", "--session", "g",
              "--workspace", str(garden))
    assert own.returncode == 0, own.stderr
    assert ASIDE in own.stderr
    # later, without --workspace: the session's own workspace, in this process (said)
    again = cli(daemon.config_path, "run", "t2 :: list_dir {}", "--session", "g")
    assert again.returncode == 0, again.stderr
    assert f"session g works on {garden}, the workspace it was made with" in again.stderr
    assert f"the daemon works on {daemon.config.workspace}: session g runs in this process" \
        in again.stderr
    assert "starting tool hosts" in again.stderr  # a world of its own, not the daemon's
    # a session of the daemon's workspace goes through the daemon, nothing said
    plain = cli(daemon.config_path, "run", "t3 :: list_dir {}", "--session", "d")
    assert plain.returncode == 0 and "daemon" not in plain.stderr, plain.stderr
    assert "starting tool hosts" not in plain.stderr
