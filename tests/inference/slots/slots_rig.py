"""A rig for slot keeper tests: fake llama-servers saving real files, sessions, real turns."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.base.cancel import CancelToken
from actors.base.config import parse
from actors.inference.actor import Inference
from actors.inference.slots.keeper import KeeperSettings, ServerSpec
from actors.log.file import SessionLog
from actors.log.records import CacheLoss, Record, SlotState, SlotUse, Usage
from actors.session.turn import Runtime, TurnOutcome, run_turn
from actors.tools.registry import Registry
from tests.support.fake_llama import FakeLlama, Reply, answer
from tests.support.turn_rig import ScriptedPort, baseline


class Slots:
    """``servers`` fake llama-servers of ``slots`` slots each, one Inference (one "command")
    over them with a slot keeper; ``restart()`` is a new command on fresh servers."""

    def __init__(
        self, tmp: Path, *, slots: int = 1, servers: int = 1, save: bool = True,
        reachable: bool = True, after_turn: bool = False, disk_bytes: int = 1 << 30,
        parallel: int = 8, script: Callable[[dict[str, Any]], Reply] | None = None,
        props: dict[str, Any] | None = None, warm: bool = False,
    ) -> None:
        self.tmp = tmp
        self.save_dir = tmp / "save"
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self.slots, self.servers, self.save, self.reachable = slots, servers, save, reachable
        self.script = script or (lambda body: answer("ok."))
        self.props = props or {}
        self.settings = KeeperSettings(
            log_dir=tmp / "sessions", meta_dir=tmp / "meta", disk_bytes=disk_bytes,
            save_after_turn=after_turn, warm_start=warm,
        )
        self.config = parse({"inference": dict(
            url="http://unused", retries=1, backoff_s=0.001, timeout_s=20.0, read_timeout_s=10.0,
            connect_timeout_s=2.0, parallel=parallel,
        )})
        self.said: list[str] = []
        self.logs: dict[str, SessionLog] = {}
        self.fakes: list[FakeLlama] = []
        self.inference = self._start()

    def _start(self) -> Inference:
        self.fakes = [
            FakeLlama(self.script, props={"total_slots": self.slots, **self.props},
                      save_dir=self.save_dir if self.save else None).start()
            for _ in range(self.servers)
        ]
        specs = [ServerSpec(f.url, self.save_dir if self.reachable else None) for f in self.fakes]
        return Inference.start(self.config.inference, servers=specs, keeper=self.settings,
                               say=self.said.append)

    def restart(self, **props: Any) -> None:
        """The command ends (the keeper saves), the servers go; a new command starts."""
        self.stop_command()
        self.props.update(props)
        self.inference = self._start()

    def stop_command(self) -> None:
        self.inference.stop()
        for f in self.fakes:
            f.close()

    def log(self, name: str, system: str = "") -> SessionLog:
        """``name``'s log; a new one's system prompt is ``system`` (default: the rig's)."""
        if name not in self.logs:
            path = self.settings.log_dir / name / "log.bin"  # type: ignore[operator]
            base = baseline()
            if system:
                base = dataclasses.replace(base, system=system)
            self.logs[name], _ = SessionLog.open(path, fsync="never", baseline=base,
                                                 name=name)
        return self.logs[name]

    def turn(self, name: str, content: str = "Hi?", events: list[Any] | None = None,
             cancel: CancelToken | None = None) -> TurnOutcome:
        runtime = Runtime(config=self.config, inference=self.inference,
                          registry=Registry([ScriptedPort()]))
        sink = events.append if events is not None else (lambda _e: None)
        return run_turn(self.log(name), runtime, content, sink, cancel)

    def records(self, name: str) -> tuple[Record, ...]:
        return self.log(name).records

    def uses(self, name: str) -> list[SlotUse]:
        return [r.slot for r in self.records(name) if isinstance(r, Usage) and r.slot]

    def last(self, name: str) -> SlotUse:
        return self.uses(name)[-1]

    def losses(self, name: str) -> list[CacheLoss]:
        return [r for r in self.records(name) if isinstance(r, CacheLoss)]

    def calls(self, server: int = 0) -> list[tuple[str, int, str]]:
        """The slot actions server ``server`` got (save, restore, erase), in order."""
        return [c for c in self.fakes[server].slot_calls if c[0] != "loopd-probe"]

    def files(self) -> list[str]:
        return sorted(p.name for p in self.save_dir.iterdir())

    def close(self) -> None:
        self.stop_command()
        for log in self.logs.values():
            log.close()


def restored(use: SlotUse) -> bool:
    return use.state is SlotState.RESTORED and use.restored > 0
