"""Fixtures for session tests that run a turn (the turn's own, the small-model step rules): a
session log, a fake llama-server, tool ports, all closed after."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from actors.tools.registry import Registry
from tests.support.fake_llama import Reply
from tests.support.turn_rig import Rig, ScriptedPort


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(script: list[Reply] | Callable[[dict[str, Any]], Reply],
             registry: Registry | None = None, inference: Mapping[str, Any] | None = None,
             **loop: Any) -> Rig:
        r = Rig(tmp_path / str(len(made)), script, registry or Registry([ScriptedPort()]),
                inference=inference, **loop)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
