"""Wiring: the model server, the inference actor and the tool hosts that sessions run on.

One loopd command builds one :class:`World`: it starts the embedded llama-server when the
config names no ``inference.url`` nor ``inference.servers`` (and stops it when the command
ends), the inference actors with the slot keeper over the server(s), and the tool hosts
(local ones as child processes, remote ones by endpoint). Sessions are opened on it by
name. When the command ends (normally, Ctrl-C, SIGTERM) the sessions stop first, then the
keeper saves every session's changed KV state, then the server stops: all of it within
``daemon.stop_grace_s`` (:mod:`actors.base.processes.stop_deadline`), past which the
process kills what it started and exits 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka

from actors.approval.rulesfile import RuleStore
from actors.base import telemetry
from actors.base.config import GENERAL_SYSTEM, Config
from actors.base.processes.stop_deadline import StopDeadline
from actors.base.rules import RuleBook
from actors.inference.actor import Inference
from actors.inference.slots.files import meta_dir
from actors.inference.slots.keeper import KeeperSettings, ServerSpec
from actors.log.records import Baseline, now
from actors.session.actor import SessionActor, open_session
from actors.session.agents import agent_tool
from actors.session.fork import ForkReport, fork_session
from actors.session.smallmodel.workspace_map import workspace_map
from actors.session.turn import Runtime
from actors.tools.registry import baseline_tools
from actors.tools.toolbox import Toolbox, check_workspace

__all__ = ["StatusEvent", "World", "start_world"]


class StatusEvent(str):
    """A status line that also has an event of its own (``--json`` shows the event).

    A ``str``, so every ``status`` callback shows it as the line it is.
    """

    event: dict[str, Any]

    @classmethod
    def of(cls, text: str, **event: Any) -> StatusEvent:
        line = cls(text)
        line.event = event
        return line


def _authorization_needed(status: Callable[[str], None]) -> Callable[[str, str], None]:
    def say(host: str, url: str) -> None:
        status(StatusEvent.of(
            f"tool host {host}: its MCP server needs your authorization: open {url}",
            event="authorization_needed", host=host, url=url,
        ))

    return say


@dataclasses.dataclass(slots=True)
class World:
    runtime: Runtime
    model: str
    embedded: bool = False  # the embedded model: its own system prompt and pinned tools
    urls: tuple[str, ...] = ()  # the model servers' (the embedded one's when it runs)
    sessions: list[pykka.ActorProxy[SessionActor]] = dataclasses.field(default_factory=list)
    stop_timeout_s: float = 10.0  # how long close_sessions waits for each session actor
    hidden: tuple[str, ...] = ()  # loopd's own places, which the file tools refuse
    save_state: Callable[[str], None] = lambda _: None  # the slot keeper's save_now
    forget_state: Callable[[str], None] = lambda _: None  # the slot keeper's forget

    def fork(self, src: str, new: str, at: int | None = None) -> ForkReport:
        """Fork session ``src`` into ``new`` (actors.session.fork), its KV state saved first
        when a slot of this world holds it changed."""
        return fork_session(self.config, src, new, at, save=self.save_state)

    @property
    def config(self) -> Config:
        return self.runtime.config

    def describe(self) -> str:
        """What answers, for the person: the model and its server(s)."""
        where = ", ".join(self.urls) or "?"
        return f"{self.model} (embedded, {where})" if self.embedded else f"{self.model} at {where}"

    def baseline(self) -> Baseline:
        """The baseline of a new session: fixed for the session's whole life."""
        session, embedded = self.config.session, self.config.embedded
        system = session.system or (self.embedded and embedded.system) or GENERAL_SYSTEM
        pinned = (*embedded.pinned, *session.pinned) if self.embedded else session.pinned
        if self.embedded and self.config.uses_workspace:
            found = workspace_map(self.config.workspace, self.hidden, embedded.workspace_map)
            system = f"{system}\n\n{found}" if found else system
        tools = baseline_tools(self.runtime.registry, pinned)
        if self.config.agents.enabled:  # the session's own, like find_tool (docs/agents.md)
            tools = (*tools, agent_tool())
        return Baseline(
            system=system,
            tools=tools,
            model=self.model,
            created=now(),
        )

    def session(self, name: str) -> pykka.ActorProxy[SessionActor]:
        """The proxy of session ``name``'s actor, created on first use."""
        proxy = open_session(self.config, name, baseline=self.baseline())
        self.sessions.append(proxy)
        return proxy

    def close_sessions(self, say: Callable[[str], None] = lambda _: None) -> None:
        """Stop every session actor. One still busy after ``stop_timeout_s`` (a KV save after
        the turn, on a server short of CPU) is told to stop and not waited for: its answer
        was given and its log is complete, so the command must not end in an error."""
        for proxy in self.sessions:
            try:
                proxy.actor_ref.stop(timeout=self.stop_timeout_s)
            except pykka.ActorDeadError:
                pass
            except pykka.Timeout:
                say(f"warning: a session was still busy after {self.stop_timeout_s:g} s; "
                    "it stops when its current work ends (its log is complete)")
        self.sessions.clear()


@contextlib.contextmanager
def start_world(
    config: Config, status: Callable[[str], None] = lambda _: None,
    approve: RuleBook | None = None, deadline: StopDeadline | None = None,
) -> Iterator[World]:
    """Everything a session needs, stopped again (no process left) when the block ends.

    ``approve``: allow rules of this command only (``loopd run --approve``), besides the
    config's and the rules file's (read here: a malformed file stops the start).
    ``deadline``: the process's own (the daemon's, armed as its stop begins); by default
    one of the world's, armed as the block ends and put away once the world has stopped.
    """
    rules = RuleStore(config.rules_path, approve)
    check_workspace(config)  # before the model server: a typo must not cost its start
    with contextlib.ExitStack() as stack:
        if deadline is None:
            deadline = StopDeadline(config.daemon.stop_grace_s, who="loopd")
            stack.callback(deadline.done)  # the last step: the stop ended in time
        urls = config.inference.servers or (config.inference.url,)
        save_dir = Path(config.slots.save_dir).expanduser() if config.slots.save_dir else None
        specs = [ServerSpec(u, save_dir=save_dir) for u in urls]
        model, embedded = "llama-server", config.embedded_model
        if embedded:
            from actors.inference.embedded.model import choice
            from actors.inference.embedded.server import EmbeddedServer, server_identity, slot_dir

            server = EmbeddedServer.start(config, on_progress=status)
            stack.callback(server.stop)
            chosen = choice(config.embedded.model)
            model = chosen.file
            identity = server_identity(server.binary, chosen) if server.binary else ""
            specs = [ServerSpec(server.url, slot_dir(config.embedded), identity)]
        telemetry.configure(config.telemetry.enabled, config.telemetry.export_timeout_s)
        keeper = KeeperSettings(
            log_dir=config.log_dir, meta_dir=meta_dir(config),
            disk_bytes=config.slots.disk_mb * 1024 * 1024,
            save_after_turn=config.slots.save_after_turn, warm_start=config.slots.warm_start,
        )
        status("starting tool hosts")
        toolbox = Toolbox.start(config, on_authorize=_authorization_needed(status))
        stack.callback(toolbox.close)
        for host, problem in toolbox.problems.items():
            status(f"tool host {host} is not available: {problem}")
        for warning in toolbox.warnings:
            status(f"warning: {warning}")
        inference = Inference.start(config.inference, servers=specs, keeper=keeper, say=status,
                                    model=model)
        stack.callback(inference.stop)
        runtime = Runtime(config=config, inference=inference, registry=toolbox.registry,
                          rules=rules, hidden=toolbox.hidden)
        world = World(runtime=runtime, model=model, embedded=embedded,
                      urls=tuple(s.url for s in specs), save_state=inference.save_state,
                      forget_state=inference.keeper.forget, hidden=toolbox.hidden)
        stack.callback(world.close_sessions, status)
        stack.callback(deadline.arm)  # the first step of the stop
        yield world
