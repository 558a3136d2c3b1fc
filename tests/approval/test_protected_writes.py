"""Protected writes through a real tool host: asked for under every allow, decided on where
the write lands.

Before, a host given ``--allow write_file`` (what ``tools.allow = ["write_file"]`` became)
never answered "pending approval", so the gate never saw ``.git/config``, ``.git/hooks``
or ``loopd.toml`` writes; and the rules were held against the words of the path, so
``write_file: notes`` allowed ``notes/settings.cfg``, a symlink into ``.git``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.approval.gate import Gate
from actors.approval.rulesfile import RuleStore
from actors.base.cancel import CancelToken
from actors.base.config import parse
from actors.base.events import ApprovalRequested, Choice, Decision, Event
from actors.log.records import Approval, ApprovalDecision, ApprovalScope, Record
from actors.tools.protocol import wire
from tests.tools.hostkit import ask, raw_dealer, short_dir, spawn_host

FSMONITOR = "[core]\n\tfsmonitor = touch /tmp/loopd-pwned\n"
_ids = itertools.count(1)


@contextlib.contextmanager
def files_host(*extra: str) -> Iterator[tuple[str, Path]]:
    """A host running write_file on a workspace holding a repository, with the links a
    cloned repository could carry: a file, a parent directory, a dangling one, an
    absolute one into .git, and one out of notes/ into code/."""
    with short_dir() as d:
        ws = d / "ws"
        for sub in (".git/hooks", "notes", "code", "vendor/lib/.git"):
            (ws / sub).mkdir(parents=True)
        (ws / ".git" / "config").write_text("[core]\n")
        (ws / "code" / "main.c").write_text("print()\n")
        (ws / "notes" / "settings.cfg").symlink_to("../.git/config")
        (ws / "notes" / "hooks").symlink_to("../.git/hooks")
        (ws / "notes" / "new.cfg").symlink_to("../.git/hooks/post-checkout")  # dangling
        (ws / "notes" / "abs.cfg").symlink_to(ws / ".git" / "config")
        (ws / "notes" / "top.toml").symlink_to("../loopd.toml")
        (ws / "notes" / "main.c").symlink_to("../code/main.c")
        endpoint = f"ipc://{d}/files.sock"
        args = ["--tools", "write_file", "--workspace", str(ws), *extra]
        with spawn_host(endpoint, *args, log=d / "host.log"):
            yield endpoint, ws


def write(endpoint: str, path: str, approved: bool = False, landing: str = "") -> Any:
    with raw_dealer(endpoint) as sock:
        return ask(sock, wire.ToolRequest(next(_ids), "s", 1, "write_file",
                                          {"path": path, "content": FSMONITOR},
                                          approved, landing))


def tree(ws: Path) -> dict[str, str]:
    """Every file (its text) and link (its target) in the workspace."""
    return {str(p.relative_to(ws)): os.readlink(p) if p.is_symlink() else p.read_text()
            for p in sorted(ws.rglob("*")) if p.is_symlink() or p.is_file()}


# path written -> where it lands
PROTECTED = {
    ".git/config": ".git/config",
    ".git/hooks/pre-commit": ".git/hooks/pre-commit",
    ".git/new/dir/x": ".git/new/dir/x",  # directories it would make are inside .git too
    "loopd.toml": "loopd.toml",
    "notes/loopd.toml": "notes/loopd.toml",
    "vendor/lib/.git/config": "vendor/lib/.git/config",  # any depth
    ".GIT/config": ".GIT/config",  # where a file system ignores case, that is .git
    "notes/settings.cfg": ".git/config",  # a link to a file
    "notes/hooks/pre-commit": ".git/hooks/pre-commit",  # a link in a parent directory
    "notes/new.cfg": ".git/hooks/post-checkout",  # a dangling link
    "notes/abs.cfg": ".git/config",  # an absolute link
    "notes/top.toml": "loopd.toml",
    "code/../notes/settings.cfg": ".git/config",
}


def test_an_allowed_host_asks_for_every_protected_write_and_writes_none() -> None:
    with files_host("--allow", "write_file") as (endpoint, ws):
        before = tree(ws)
        for path, landing in PROTECTED.items():
            for approved in (False, True):  # approved without naming where: asked again
                answer = write(endpoint, path, approved)
                assert isinstance(answer, wire.PendingApproval), (path, answer)
                assert (answer.landing, bool(answer.protected)) == (landing, True), path
            wrong = write(endpoint, path, True, landing="notes/settings.cfg")
            assert isinstance(wrong, wire.PendingApproval), path
        assert tree(ws) == before
        plain = write(endpoint, "notes/a.md")  # anything else: --allow still holds
        assert isinstance(plain, wire.Result) and (ws / "notes/a.md").read_text() == FSMONITOR


def test_a_protected_write_runs_approved_for_exactly_where_it_lands() -> None:
    with files_host("--allow", "write_file") as (endpoint, ws):
        done = write(endpoint, "notes/settings.cfg", True, landing=".git/config")
        assert isinstance(done, wire.Result), done
        assert (ws / ".git" / "config").read_text() == FSMONITOR
        assert (ws / "notes" / "settings.cfg").is_symlink()


def test_an_approved_write_whose_link_moved_since_is_asked_again() -> None:
    """Approved for code/main.c (through notes/main.c); the link now points into .git."""
    with files_host() as (endpoint, ws):
        asked = write(endpoint, "notes/main.c")
        assert isinstance(asked, wire.PendingApproval) and asked.landing == "code/main.c"
        assert not asked.protected
        (ws / "notes" / "main.c").unlink()
        (ws / "notes" / "main.c").symlink_to("../.git/config")
        again = write(endpoint, "notes/main.c", True, landing="code/main.c")
        assert isinstance(again, wire.PendingApproval), again
        assert (again.landing, bool(again.protected)) == (".git/config", True)
        assert (ws / ".git" / "config").read_text() == "[core]\n"


class Person:
    """An approver that says ``choice`` and keeps what it was asked."""

    def __init__(self, choice: Choice = Choice.DENY) -> None:
        self.choice = choice
        self.asked: list[ApprovalRequested] = []

    def __call__(self, request: ApprovalRequested, cancel: CancelToken,
                 deadline: float) -> Decision | None:
        self.asked.append(request)
        return Decision(self.choice, by="person")


def gate(tmp_path: Path, person: Person, allow: tuple[str, ...] = (), deny: tuple[str, ...] = (),
         rules_file: str = "", records: tuple[Record, ...] = ()) -> Gate:
    rules = tmp_path / "rules.toml"
    if rules_file:
        rules.write_text(rules_file)
    tools = parse({"tools": {"allow": list(allow), "deny": list(deny)}}).tools
    kept: list[Record] = list(records)
    events: list[Event] = []
    return Gate(tools=tools, store=RuleStore(rules), records=lambda: tuple(kept),
                append=kept.append, emit=events.append, approver=person,
                cancel=CancelToken())


def run(g: Gate, endpoint: str, path: str) -> wire.Answer:
    def send(approved: bool, landing: str) -> wire.Answer:
        with raw_dealer(endpoint) as sock:
            answer = ask(sock, wire.ToolRequest(next(_ids), "s", 1, "write_file",
                                                {"path": path, "content": FSMONITOR},
                                                approved, landing))
        assert answer is not None
        return answer  # type: ignore[return-value]

    return g.run(1, "write_file", {"path": path, "content": FSMONITOR}, send)


GRANT = Approval(call=0, tool="write_file", decision=ApprovalDecision.ALLOW,
                 scope=ApprovalScope.SESSION, by="person", reason="",
                 rule="write_file = notes/settings.cfg")
ALLOWS = {  # every way a rule can allow the tool
    "config": {"allow": ("write_file",)},
    "prefix": {"allow": ("write_file: notes",)},
    "exact": {"allow": ("write_file = notes/settings.cfg",)},
    "rules file": {"rules_file": 'allow = ["write_file", "write_file: notes"]\n'},
    "session grant": {"records": (GRANT,)},
}


@pytest.mark.parametrize("how", list(ALLOWS))
def test_every_allow_asks_for_a_protected_write(tmp_path: Path, how: str) -> None:
    """Through the gate (what a turn, --approve and a daemon client's approve all use)."""
    with files_host() as (endpoint, ws):
        before = tree(ws)
        for path in ("notes/settings.cfg", "notes/hooks/pre-commit", "notes/new.cfg",
                     ".git/config", "loopd.toml"):
            person = Person()
            g = gate(tmp_path, person, **ALLOWS[how])
            answer = run(g, endpoint, path)
            assert isinstance(answer, wire.Denied), (path, answer)
            assert [json_path(r) for r in person.asked] == [PROTECTED[path]], path
            assert "where programs find what to run" in person.asked[0].prompt
            assert "tools.allow" not in person.asked[0].prompt  # no rule would let it run
            assert person.asked[0].rule == ""  # nothing to grant for later: asked each time
        assert tree(ws) == before


def json_path(request: ApprovalRequested) -> str:
    return str(json.loads(request.arguments)["path"])


def test_a_rules_reach_is_where_the_write_lands(tmp_path: Path) -> None:
    """``write_file: notes`` allows notes/a.md, not notes/main.c, a link into code/."""
    with files_host() as (endpoint, ws):
        person = Person(Choice.ONCE)
        g = gate(tmp_path, person, allow=("write_file: notes",))
        assert isinstance(run(g, endpoint, "notes/a.md"), wire.Result)
        assert person.asked == []
        assert isinstance(run(g, endpoint, "notes/main.c"), wire.Result)
        [request] = person.asked
        assert json_path(request) == "code/main.c"
        assert request.rule == "write_file = code/main.c"  # what it grants: where it lands
        assert "It writes code/main.c" in request.prompt
        assert (ws / "code" / "main.c").read_text() == FSMONITOR


def test_a_deny_rule_reaches_where_the_write_lands(tmp_path: Path) -> None:
    with files_host() as (endpoint, ws):
        person = Person(Choice.ONCE)
        g = gate(tmp_path, person, allow=("write_file",), deny=("write_file: code",))
        answer = run(g, endpoint, "notes/main.c")
        assert isinstance(answer, wire.Denied) and "it writes code/main.c" in answer.reason
        assert person.asked == [] and (ws / "code" / "main.c").read_text() == "print()\n"
