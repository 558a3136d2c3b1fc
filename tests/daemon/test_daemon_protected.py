"""Protected writes through the daemon and ``loopd run``: asked for under every allow.

The daemon here has ``tools.allow = ["run_command", "write_file"]``. Before, its tool host
was given ``--allow write_file`` and wrote ``.git/config``, ``.git/hooks/pre-commit`` and
``loopd.toml`` (directly or through a symlink) without a question reaching anyone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.base.cancel import CancelToken
from actors.base.events import ApprovalRequested, Choice, Decision
from actors.log.records import Approval, ApprovalDecision
from tests.daemon.daemonkit import Daemon, cli, daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.tools.hostkit import short_dir

# path the model writes -> where it lands
WRITES = {".git/config": ".git/config", ".git/hooks/pre-commit": ".git/hooks/pre-commit",
          "loopd.toml": "loopd.toml", "docs/settings.cfg": ".git/config"}
FSMONITOR = "[core]\n\tfsmonitor = touch /tmp/loopd-pwned\n"


def _writes(tag: str) -> str:
    steps = [f'write_file {json.dumps({"path": p, "content": FSMONITOR})}' for p in WRITES]
    return " :: ".join([tag, *steps])


@pytest.fixture
def allowing(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose tools.allow names write_file, over a workspace holding a repository
    and a link into its .git."""
    with short_dir() as d, FakeLlama(agent()) as fake:
        path = daemon_config(tmp_path, d / "run", fake.url, allow=("run_command", "write_file"))
        ws = tmp_path / "ws"
        (ws / ".git" / "hooks").mkdir(parents=True)
        (ws / ".git" / "config").write_text("[core]\n")
        (ws / "docs").mkdir()
        (ws / "docs" / "settings.cfg").symlink_to("../.git/config")
        with Daemon(path) as running:
            yield running


def _untouched(ws: Path) -> None:
    assert (ws / ".git" / "config").read_text() == "[core]\n"
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert not (ws / "loopd.toml").exists()
    assert (ws / "docs" / "settings.cfg").is_symlink()


class Person:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, request: ApprovalRequested, cancel: CancelToken,
                 deadline: float) -> Decision:
        self.asked.append(json.loads(request.arguments)["path"])
        return Decision(Choice.DENY, "no")


def test_a_client_is_asked_for_every_protected_write_whatever_allows_it(
    allowing: Daemon,
) -> None:
    ws = Path(allowing.config.tools.workspace)
    person = Person()
    with allowing.client() as client:
        turn = client.turn("s", _writes("t1"), person, approve=("write_file",))
        turn.run(lambda e: None)
        records = client.read_log("s")
    assert person.asked == list(WRITES.values())  # where each lands
    assert [r.decision for r in records if isinstance(r, Approval)] == (
        [ApprovalDecision.DENY] * len(WRITES))
    _untouched(ws)


@pytest.mark.parametrize("where", [(), ("--local",)])
def test_loopd_run_with_approve_still_asks_through_the_daemon_and_locally(
    allowing: Daemon, where: tuple[str, ...],
) -> None:
    """No terminal: a call that must be asked is denied, naming why."""
    ws = Path(allowing.config.tools.workspace)
    done = cli(allowing.config_path, "run", _writes("t1"), "--session", "r",
               "--approve", "write_file", *where)
    assert done.returncode == 0, done.stderr
    with allowing.client() as client:
        records = client.read_log("r")
    assert [r.decision for r in records if isinstance(r, Approval)] == (
        [ApprovalDecision.DENY] * len(WRITES))
    _untouched(ws)
