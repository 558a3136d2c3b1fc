"""The two places the session service runs (in this process, through a daemon), for the
contract suite (its fixtures are in tests/service/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from actors.service.types import SessionService
from tests.support.fake_llama import FakeLlama, Reply, context_full, hang
from tests.support.scripted_llama import agent

__all__ = ["FULL", "HANG", "Place", "script"]


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
