"""What the ``loopd acp`` tests share: a workspace, a config, the scripted fake llama-server,
and a raw line-level client for what no SDK would send.

The model is the scripted agent of tests/support/scripted_llama.py (the user message says
which tools to call: ``"t1 :: read_file {"path": "notes.txt"}"``), plus two orders of these
tests: a message holding ``[stall]`` gets an answer that starts and then stops sending (a
turn to cancel), one holding ``[long]`` an answer longer than ``loop.max_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.acp_editor import (
    AcpEnv,
    RawAgent,
    model,
)
from tests.support.fake_llama import FakeLlama


@pytest.fixture
def fake() -> Iterator[FakeLlama]:
    with FakeLlama(model()) as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, fake: FakeLlama) -> AcpEnv:
    return AcpEnv(tmp_path, fake.url)


@pytest.fixture
def raw(env: AcpEnv) -> Iterator[Callable[..., RawAgent]]:
    started: list[RawAgent] = []

    def start(*extra: str) -> RawAgent:
        agent_ = RawAgent(env.argv(*extra), env.stderr)
        started.append(agent_)
        return agent_

    yield start
    for a in started:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait()
