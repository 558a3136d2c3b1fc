"""A session log, a fake llama-server and tool-port doubles for turn tests (their fixture
is in tests/session/conftest.py)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from actors.base.cancel import CancelToken
from actors.base.config import Config, LoopConfig, parse
from actors.base.events import Event
from actors.inference.actor import Inference
from actors.log.file import SessionLog
from actors.log.records import Baseline, Record, now
from actors.session.turn import Runtime, TurnOutcome, run_turn
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.tools.registry import META_TOOLS, Registry
from tests.support.fake_llama import FakeLlama

__all__ = ["ECHO", "Rig", "ScriptedPort", "baseline", "make_config"]

ECHO = ToolSpec(
    name="echo",
    description="Echo the text back.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}},
                "required": ["text"]},
)


class ScriptedPort:
    """A tool-port double: answers from a function, records every call (actor-level tests)."""

    name = "scripted"

    def __init__(
        self,
        answer: Callable[[str, Mapping[str, Any]], wire.Answer] | None = None,
        specs: Sequence[ToolSpec] = (ECHO,),
    ) -> None:
        self._answer = answer or (lambda tool, args: wire.Result(
            id=0, content=str(args.get("text", "")), class_=ResultClass.PUBLIC, untrusted=False))
        self._specs = list(specs)
        self.calls: list[tuple[str, int, str, dict[str, Any]]] = []
        self.entered = threading.Event()

    def specs(self) -> list[ToolSpec]:
        return self._specs

    def call(self, *, session: str, call: int, tool: str, arguments: Mapping[str, Any],
             cancel: CancelToken | None = None, approved: bool = False,
             landing: str = "", ask: object = None) -> wire.Answer:
        """Like a host: a tool whose spec needs approval answers PendingApproval until the
        call comes again approved; only calls that run are recorded."""
        spec = next((s for s in self._specs if s.name == tool), None)
        if spec is not None and spec.needs_approval and not approved:
            return wire.PendingApproval(prompt=f"Allow {tool}?")
        self.calls.append((session, call, tool, dict(arguments)))
        self.entered.set()
        return self._answer(tool, arguments)


def make_config(tmp_path: Path, url: str = "",
                inference_changes: Mapping[str, Any] | None = None, **loop: Any) -> Config:
    inference = {**dict(url=url, retries=2, backoff_s=0.001, timeout_s=20.0,
                        read_timeout_s=10.0, connect_timeout_s=2.0), **(inference_changes or {})}
    config = parse({"log": {"dir": str(tmp_path / "sessions"), "fsync": "never"},
                    "inference": inference})
    return dataclasses.replace(config, loop=dataclasses.replace(LoopConfig(), **loop))


def baseline(tools: Sequence[Mapping[str, Any]] = META_TOOLS) -> Baseline:
    return Baseline(system="You are terse.", tools=tuple(tools), model="fake", created=now())


class Rig:
    """One session log, a fake model server, a runtime; `turn()` runs run_turn and keeps events."""

    def __init__(self, tmp_path: Path, script: Any, registry: Registry,
                 props: dict[str, Any] | None = None,
                 inference: Mapping[str, Any] | None = None, **loop: Any) -> None:
        self.fake = FakeLlama(script, props=props).start()
        self.config = make_config(tmp_path, self.fake.url, inference or {}, **loop)
        self.path = tmp_path / "sessions" / "s" / "log.bin"
        self.log, _ = SessionLog.open(self.path, fsync="never", baseline=baseline(), name="s")
        self.inference = Inference.start(self.config.inference)
        self.runtime = Runtime(config=self.config, inference=self.inference, registry=registry)
        self.events: list[Event] = []

    def turn(self, content: str = "Hi?", cancel: CancelToken | None = None) -> TurnOutcome:
        return run_turn(self.log, self.runtime, content, self.events.append, cancel)

    @property
    def records(self) -> tuple[Record, ...]:
        return self.log.records

    def kinds(self, start: int = 1) -> list[str]:
        return [type(r).__name__ for r in self.records[start:]]

    def close(self) -> None:
        self.inference.stop()
        self.log.close()
        self.fake.close()
