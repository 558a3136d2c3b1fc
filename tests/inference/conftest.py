"""Fixtures for the inference tests: a fake llama-server and a client, both always closed."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from actors.inference.llama import LlamaClient
from tests.support.fake_llama import FakeLlama, Reply
from tests.support.inference_rig import MakeRig, Rig, config


@pytest.fixture
def rig() -> Iterator[MakeRig]:
    made: list[Rig] = []

    def make(script: Sequence[Reply] | Callable[[dict[str, Any]], Reply], **changes: Any) -> Rig:
        fake = FakeLlama(script).start()
        try:
            client = LlamaClient(config(fake.url, **changes))
        except BaseException:
            fake.close()
            raise
        made.append(Rig(fake, client))
        return made[-1]

    try:
        yield make
    finally:
        for r in made:
            r.client.close()
            r.fake.close()
