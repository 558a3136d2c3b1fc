"""Agents through the daemon: a child's events travel to the client with their ``agent``,
and a client gone mid-turn cancels every child (docs/agents.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.base.events import AgentDone, AgentEvent, AgentStarted, Content
from actors.log.records import AgentLink, User
from tests.daemon.daemonkit import Daemon, client_gone_mid_turn, daemon_config
from tests.support.fake_llama import FakeLlama, Reply, answer
from tests.support.watch import wait_until
from tests.tools.hostkit import short_dir


class Children:
    """The fake model: the parent hands out two tasks, children answer or hang."""

    def __init__(self) -> None:
        self.hanging = 0  # children's requests waiting at the server
        self.gone = 0  # of them, those whose client went away
        self.lock = threading.Lock()

    def _hang(self) -> Reply:
        def serve(conn: Any) -> None:
            with self.lock:
                self.hanging += 1
            conn.wait_until_gone()
            conn.abort()
            with self.lock:
                self.gone += 1

        return Reply("hang", serve)

    def __call__(self, body: dict[str, Any]) -> Reply:
        users = [m for m in body["messages"] if m.get("role") == "user"]
        asked = str(users[-1]["content"])
        if asked in ("Hi?", "wait"):
            if body["messages"][-1].get("role") != "user":
                return answer("done")
            tasks = ("say hi", "say ho") if asked == "Hi?" else ("hang a", "hang b")
            return answer(tool_calls=[("agent", json.dumps({"task": t})) for t in tasks])
        if asked.startswith("hang"):
            return self._hang()
        return answer(asked.removeprefix("say "))


@pytest.fixture
def agents_daemon(tmp_path: Path) -> Iterator[tuple[Daemon, Children]]:
    model = Children()
    with short_dir() as d, FakeLlama(model, props={"total_slots": 2}) as fake:
        # requests that never time out here: only a cancel ends a hanging child
        path = daemon_config(tmp_path, d / "run", fake.url, sections={
            "agents": {"enabled": True}, "inference": {"timeout_s": 3600, "read_timeout_s": 3600}})
        with Daemon(path) as running:
            yield running, model


def test_a_child_s_events_reach_the_client_with_its_name(
        agents_daemon: tuple[Daemon, Children]) -> None:
    daemon, _ = agents_daemon
    with daemon.client() as client:
        turn = client.turn("s", "Hi?")
        events = list(turn)
        assert turn.outcome is not None and turn.outcome.content == "done"
        child = client.read_log("s.a1")
    started = [e.agent for e in events if isinstance(e, AgentStarted)]
    done = [(e.agent, e.ok) for e in events if isinstance(e, AgentDone)]
    assert started == ["s.a1", "s.a2"] and sorted(done) == [("s.a1", True), ("s.a2", True)]
    said = {e.agent: e.event.text for e in events
            if isinstance(e, AgentEvent) and isinstance(e.event, Content)}
    assert said == {"s.a1": "hi", "s.a2": "ho"}
    assert [r.task for r in child if isinstance(r, AgentLink)] == ["say hi"]


def test_a_client_gone_cancels_every_child(agents_daemon: tuple[Daemon, Children]) -> None:
    daemon, model = agents_daemon
    with client_gone_mid_turn(daemon, "s", "wait"):
        wait_until(lambda: model.hanging == 2, 60, "both children at the server at once")
    wait_until(lambda: model.gone == 2, 30, "both children's requests to be dropped")
    with daemon.client() as client:
        for name, task in (("s.a1", "hang a"), ("s.a2", "hang b")):
            records = client.read_log(name)  # whole: it reads; the task asked, no answer
            assert [r.content for r in records if isinstance(r, User)] == [task]
