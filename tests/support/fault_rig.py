"""A real session log, the inference actor and a runtime, for the fault tests (their fixture
is in tests/faults/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.base.config import Config, parse
from actors.base.events import Event
from actors.inference.actor import Inference
from actors.log.file import SessionLog, read_records
from actors.log.records import Baseline, Record, now
from actors.session.turn import Runtime, TurnOutcome, run_turn
from actors.tools.registry import META_TOOLS, Registry

__all__ = ["MakeRig", "TurnRig", "turn_config"]


def turn_config(tmp_path: Path, url: str, **inference: Any) -> Config:
    """Small timeouts and backoff so failure paths stay fast; fsync "always" as by default."""
    base: dict[str, Any] = dict(
        url=url, retries=2, backoff_s=0.001, timeout_s=20.0, read_timeout_s=10.0,
        connect_timeout_s=2.0,
    )
    return parse({"log": {"dir": str(tmp_path / "sessions"), "fsync": "always"},
                  "inference": {**base, **inference}})


class TurnRig:
    """One session log and a runtime on ``url``; ``turn()`` runs run_turn and keeps events."""

    def __init__(self, path: Path, config: Config, registry: Registry) -> None:
        self.path = path
        self.config = config
        baseline = Baseline(system="You are terse.", tools=META_TOOLS, model="fake", created=now())
        self.log, _ = SessionLog.open(path, fsync="always", baseline=baseline, name="s")
        self.inference = Inference.start(config.inference)
        self.runtime = Runtime(config=config, inference=self.inference, registry=registry)
        self.events: list[Event] = []

    def turn(self, content: str = "Hi?") -> TurnOutcome:
        self.events = []
        return run_turn(self.log, self.runtime, content, self.events.append)

    @property
    def records(self) -> tuple[Record, ...]:
        return self.log.records

    def on_disk(self) -> tuple[Record, ...]:
        return read_records(self.path, name="s")

    def kinds(self, start: int = 1) -> list[str]:
        return [type(r).__name__ for r in self.records[start:]]

    def close(self) -> None:
        self.inference.stop()
        self.log.close()


MakeRig = Callable[..., TurnRig]
