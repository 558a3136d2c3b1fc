"""The inference actor: owns the LlamaClient, runs each request on its own worker thread.

A pykka actor handles one message at a time, so it never streams itself: a stream in its
own thread would make it deaf to stop for minutes. ``submit`` starts a worker and answers
at once with a future that the worker resolves; events go straight from the worker to the
request's sink (the session actor is blocked on that future, not on this actor). Cancel
goes through the request's CancelToken, never through the mailbox. Stopping the actor
cancels every request in flight, waits briefly for the workers, and closes the client.
How many requests stream at once is the client's business (``inference.parallel``).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
from typing import Any

import httpx
import pykka

from actors.config import InferenceConfig
from actors.events import Sink
from actors.inference.client import LlamaClient
from actors.inference.types import (
    CancelToken,
    ChatRequest,
    Completion,
    InferError,
    InferErrorKind,
)

__all__ = ["Inference", "InferenceActor"]

_JOIN_S = 5.0  # how long stop waits for a cancelled worker
_GRACE_S = 30.0  # beyond timeout_s, before a caller stops waiting on a silent worker


@dataclasses.dataclass(frozen=True, slots=True)
class _Submit:
    """Start streaming ``request``; the answer is a Future the worker resolves."""

    request: ChatRequest
    sink: Sink
    cancel: CancelToken


class _Linked(CancelToken):
    """Cancelled by its own ``cancel()`` (actor stopping) or by the caller's token."""

    def __init__(self, parent: CancelToken) -> None:
        super().__init__()
        self._parent = parent

    @property
    def cancelled(self) -> bool:
        return self._parent.cancelled or super().cancelled

    def wait(self, timeout: float) -> bool:
        end = timeout
        while end > 0:
            step = min(end, 0.05)
            if super().wait(step) or self._parent.cancelled:
                return True
            end -= step
        return self.cancelled


class InferenceActor(pykka.ThreadingActor):
    """Answers ``_Submit`` with a pykka Future of the Completion (or the InferError)."""

    def __init__(
        self, config: InferenceConfig, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        super().__init__()
        self._config = config
        self._transport = transport
        self._client: LlamaClient | None = None
        self._workers: dict[threading.Thread, _Linked] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def on_start(self) -> None:
        self._client = LlamaClient(self._config, transport=self._transport)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Submit):
            return self._submit(message)
        raise TypeError(f"InferenceActor does not handle {type(message).__name__}")

    def _submit(self, message: _Submit) -> pykka.Future[Completion]:
        future: pykka.Future[Completion] = pykka.ThreadingFuture()
        token = _Linked(message.cancel)
        worker = threading.Thread(
            target=self._work,
            args=(message, token, future),
            name=f"loopd-inference-{next(self._ids)}",
            daemon=True,
        )
        with self._lock:
            self._workers[worker] = token
        worker.start()
        return future

    def _work(self, message: _Submit, token: _Linked, future: pykka.Future[Completion]) -> None:
        assert self._client is not None
        try:
            future.set(self._client.chat_with_retry(message.request, message.sink, token))
        except BaseException:
            future.set_exception(sys.exc_info())
        finally:
            with self._lock:
                self._workers.pop(threading.current_thread(), None)

    def on_stop(self) -> None:
        with self._lock:
            workers = dict(self._workers)
        for token in workers.values():
            token.cancel()
        for worker in workers:
            worker.join(timeout=_JOIN_S)
        if self._client is not None:
            self._client.close()


class Inference:
    """The session actor's handle: blocking calls, made from the session actor's thread."""

    def __init__(self, ref: pykka.ActorRef[InferenceActor], config: InferenceConfig) -> None:
        self._ref = ref
        self._config = config

    @classmethod
    def start(
        cls, config: InferenceConfig, *, transport: httpx.BaseTransport | None = None
    ) -> Inference:
        return cls(InferenceActor.start(config, transport=transport), config)

    def complete(self, request: ChatRequest, sink: Sink, cancel: CancelToken) -> Completion:
        """Stream one answer, events to ``sink``; raises InferError (CANCELLED when stopped)."""
        try:
            pending: pykka.Future[Completion] = self._ref.ask(
                _Submit(request, sink, cancel), timeout=_GRACE_S
            )
        except (pykka.ActorDeadError, pykka.Timeout):
            raise InferError(InferErrorKind.CANCELLED, "the inference actor has stopped") from None
        try:
            return pending.get(timeout=self._config.timeout_s + _GRACE_S)
        except pykka.Timeout:  # the client's own deadline should have ended it long before
            raise InferError(
                InferErrorKind.TIMEOUT,
                f"no answer within inference.timeout_s = {self._config.timeout_s:g} s",
            ) from None

    def stop(self) -> None:
        """Cancel what is in flight and close the client; safe to call twice."""
        if self._ref.is_alive():
            self._ref.stop(timeout=_JOIN_S + 5)
