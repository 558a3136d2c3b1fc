"""A fake llama-server and a client to it, for the inference tests (their fixture is in
tests/inference/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.base.cancel import CancelToken
from actors.base.config import InferenceConfig
from actors.base.events import Event
from actors.inference.llama import LlamaClient
from actors.inference.types import ChatRequest, Completion
from tests.support.fake_llama import FakeLlama

__all__ = ["USER", "MakeRig", "Rig", "config", "request"]

USER = ({"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi?"})


def config(url: str, **changes: Any) -> InferenceConfig:
    """Small timeouts and backoff, so failure paths stay fast."""
    base: dict[str, Any] = dict(
        url=url, retries=3, backoff_s=0.001, timeout_s=30.0, read_timeout_s=10.0,
        connect_timeout_s=5.0,
    )
    return InferenceConfig(**{**base, **changes})


def request(**changes: Any) -> ChatRequest:
    base: dict[str, Any] = dict(session="test", messages=USER, tools=())
    return ChatRequest(**{**base, **changes})


class Rig:
    """A fake server, a client to it, and the events the last call emitted."""

    def __init__(self, fake: FakeLlama, client: LlamaClient) -> None:
        self.fake = fake
        self.client = client
        self.events: list[Event] = []
        self.cancel = CancelToken()

    def chat(self, req: ChatRequest | None = None, *, retry: bool = True,
             sink: Callable[[Event], None] | None = None, slot: int = 0) -> Completion:
        self.events = []

        def record(event: Event) -> None:
            self.events.append(event)
            if sink is not None:
                sink(event)

        call = self.client.chat_with_retry if retry else self.client.chat
        return call(req or request(), record, self.cancel, slot=slot)

    def kinds(self) -> list[str]:
        return [type(e).__name__ for e in self.events]


MakeRig = Callable[..., Rig]  # rig(script, **config changes) -> Rig
