"""Every approval decision of a running daemon uses the rules file as it is on disk then:
an allow rule deleted by hand stops allowing, a deny rule added by hand denies (``rm victim``
does not run), another process's "never" answer holds at the daemon's next call, and a file
that became malformed makes every call asked, saying why, until it is fixed.

A real ``loopd serve`` and real ``loopd run`` processes (no terminal: a call that is asked is
denied, naming why), the scripted model ordering one ``run_command`` per turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.log.records import Approval
from tests.daemon.daemonkit import Daemon, cli, daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.tools.hostkit import short_dir

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with short_dir() as d, FakeLlama(agent()) as fake:
        rules = tmp_path / "rules.toml"
        rules.write_text('allow = ["run_command: touch"]\n')
        path = daemon_config(tmp_path, d / "run", fake.url, allow=(),
                             sections={"tools": {"rules_file": str(rules)}})
        with Daemon(path) as running:
            yield running


def run(daemon: Daemon, tag: str, command: str, *flags: str, stdin: str | None = None) -> Any:
    order = f"{tag} :: run_command {json.dumps({'command': command})}"
    done = cli(daemon.config_path, "run", order, "--session", tag, *flags, stdin=stdin)
    assert done.returncode == 0, done.stderr
    with daemon.client() as client:
        (decided,) = [r for r in client.read_log(tag) if isinstance(r, Approval)]
    return decided


def test_the_daemon_decides_with_the_rules_file_as_it_is_now(daemon: Daemon) -> None:
    rules = Path(daemon.config.rules_path)
    workspace = Path(daemon.config.workspace)
    (workspace / "victim").write_text("keep me\n")

    first = run(daemon, "t1", "touch a.txt")
    assert (first.decision.value, first.by, first.rule) == ("allow", "rule", "run_command: touch")
    assert (workspace / "a.txt").exists()

    rules.write_text("allow = []\n")  # the allow rule deleted by hand
    second = run(daemon, "t2", "touch b.txt")
    assert (second.decision.value, second.by) == ("deny", "no terminal")
    assert not (workspace / "b.txt").exists()

    rules.write_text('allow = ["run_command"]\ndeny = ["run_command: rm"]\n')  # a deny added
    third = run(daemon, "t3", "rm victim")
    assert (third.decision.value, third.by, third.rule) == ("deny", "rule", "run_command: rm")
    assert (workspace / "victim").exists()

    # another process's "never": a --local run answers it, the daemon holds it next call
    rules.write_text('deny = ["run_command: rm"]\n')
    never = run(daemon, "t4", "echo never", "--local", "--json",
                stdin='{"decision": "never"}\n')
    assert (never.decision.value, never.scope.value) == ("deny", "always")
    assert "run_command = echo never" in rules.read_text()
    fifth = run(daemon, "t5", "echo never")
    assert (fifth.decision.value, fifth.by, fifth.rule) == ("deny", "rule",
                                                           "run_command = echo never")


def test_a_rules_file_that_became_malformed_asks_for_every_call_and_says_why(
    daemon: Daemon,
) -> None:
    rules = Path(daemon.config.rules_path)
    workspace = Path(daemon.config.workspace)
    rules.write_text('allow = ["run_command: touch"\n')  # an unclosed list
    broken = run(daemon, "b1", "touch c.txt")
    assert (broken.decision.value, broken.by) == ("deny", "no terminal")
    assert "not valid TOML" in broken.reason and "needs approval is asked" in broken.reason
    assert not (workspace / "c.txt").exists()
    asked = run(daemon, "b2", "touch c.txt", "--json", stdin='{"decision": "once"}\n')
    assert (asked.decision.value, asked.by) == ("allow", "person")
    assert "needs approval is asked" in asked.reason  # the person was told, and the log says it
    rules.write_text('allow = ["run_command: touch"]\n')  # fixed: the rule holds again
    fixed = run(daemon, "b3", "touch d.txt")
    assert (fixed.decision.value, fixed.by) == ("allow", "rule")
    assert (workspace / "d.txt").exists()
