"""Fixtures for the fault tests: a real session log, the inference actor, a runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.tools.registry import Registry
from tests.support.fault_rig import MakeRig, TurnRig, turn_config


@pytest.fixture
def turn_rig(tmp_path: Path) -> Iterator[MakeRig]:
    """``make(url, registry=None, **inference)``: a TurnRig; every one is closed after the test."""
    made: list[TurnRig] = []

    def make(url: str, registry: Registry | None = None, **inference: Any) -> TurnRig:
        where = tmp_path / f"rig{len(made)}"
        rig = TurnRig(
            where / "sessions" / "s" / "log.bin",
            turn_config(where, url, **inference),
            registry if registry is not None else Registry([]),
        )
        made.append(rig)
        return rig

    try:
        yield make
    finally:
        for rig in made:
            rig.close()
