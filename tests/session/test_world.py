"""World: the end of a command never fails on a session that is still busy
(close_sessions), and a new session's baseline holds the workspace map."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

import pykka

from actors.base.config import Config
from actors.inference.actor import Inference
from actors.log.records import Baseline
from actors.session.smallmodel.workspace_map import MAP_HEADER
from actors.session.turn import Runtime
from actors.session.world import World
from actors.tools.registry import Registry
from tests.support.fake_llama import FakeLlama, answer
from tests.support.turn_rig import ScriptedPort, make_config
from tests.support.watch import HANG_S


class _Busy(pykka.ThreadingActor):
    """Stands in for a session actor still saving its KV state after the turn."""

    def work(self, release: threading.Event) -> None:
        release.wait(30)


def _bare_world() -> World:
    runtime = Runtime(config=Config(), inference=cast(Any, None), registry=Registry([]))
    # the busy one waits all of it; an idle one must stop within it, even on a busy machine
    return World(runtime=runtime, model="m", stop_timeout_s=3.0)


def test_a_session_still_busy_is_told_to_stop_and_the_command_ends_with_a_warning() -> None:
    release = threading.Event()
    busy = _Busy.start()
    idle = _Busy.start()
    try:
        busy.proxy().work(release)  # runs until released
        world = _bare_world()
        world.sessions += [busy.proxy(), idle.proxy()]
        said: list[str] = []
        world.close_sessions(said.append)  # no pykka.Timeout out of here
        assert len(said) == 1 and "still busy after 3 s" in said[0]
        assert world.sessions == []
        assert not idle.is_alive()  # the others were still stopped
        release.set()
        assert busy.actor_stopped.wait(HANG_S)  # the stop it was sent takes effect after its work
    finally:
        release.set()
        pykka.ActorRegistry.stop_all(timeout=10)


def test_a_session_already_gone_is_not_an_error() -> None:
    gone = _Busy.start()
    proxy = gone.proxy()
    gone.stop()
    world = _bare_world()
    world.sessions.append(proxy)
    said: list[str] = []
    world.close_sessions(said.append)
    assert said == [] and world.sessions == []


# --- the workspace map in a new session's baseline ------------------------------------------


def _world(tmp_path: Path, fake: FakeLlama, embedded: bool = True, **section: Any) -> World:
    """A World over the fake server whose sessions get the map as the embedded model's do;
    the sessions' logs inside the workspace, as loopd's own place there."""
    ws = tmp_path / "ws"
    ws.mkdir(parents=True)
    config = make_config(ws, fake.url).replace("tools", workspace=str(ws))
    if section:
        config = config.replace("embedded", **section)
    runtime = Runtime(config=config, inference=Inference.start(config.inference),
                      registry=Registry([ScriptedPort()]))
    return World(runtime=runtime, model="m", embedded=embedded, hidden=(str(config.log_dir),))


def _turn(world: World, name: str, question: str) -> Baseline:
    session = world.session(name)
    session.turn(world.runtime, question, lambda _: None).get(timeout=HANG_S)
    first = session.records().get(timeout=HANG_S)[0]
    world.close_sessions()
    assert isinstance(first, Baseline)
    return first


def test_a_new_session_gets_the_map_and_keeps_it_for_its_life(tmp_path: Path) -> None:
    """Taken once when the session is made: a file added later is not in that session's
    prompt (the next session's map has it), and every request of the session starts with
    the one before it (the extension property), across a reopen too."""
    with FakeLlama(lambda body: answer(content="ok")) as fake:
        world = _world(tmp_path, fake, workspace_map=40)
        ws = world.config.workspace
        (ws / "notes.txt").write_text("hello")
        try:
            made = _turn(world, "s", "What is here?")
            (ws / "later.txt").write_text("new")
            again = _turn(world, "s", "And now?")  # the same session, opened again
            other = _turn(world, "t", "What is here?")
        finally:
            world.runtime.inference.stop()
        first, second, third = (r["messages"] for r in fake.requests)
    assert made == again
    assert made.system.endswith(f"{MAP_HEADER}\nnotes.txt  5")  # no sessions/: loopd's own
    assert second[: len(first)] == first and second[0]["content"] == made.system
    assert "later.txt  3" in other.system and third[0]["content"] == other.system


def test_no_map_for_a_named_server_when_it_is_off_or_by_default(tmp_path: Path) -> None:
    """Off by default (make eval: the embedded model answered from the map instead of
    calling a tool on the workspaces never tuned on); on only when embedded.workspace_map
    is set, and never for a named server."""
    cases = [(False, {"workspace_map": 40}), (True, {"workspace_map": 0}), (True, {})]
    with FakeLlama(lambda body: answer(content="ok")) as fake:
        for i, (embedded, section) in enumerate(cases):
            world = _world(tmp_path / str(i), fake, embedded, **section)
            (world.config.workspace / "notes.txt").write_text("hello")
            try:
                assert MAP_HEADER not in world.baseline().system
            finally:
                world.runtime.inference.stop()
