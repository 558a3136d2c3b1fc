"""The inference actor: owns the LlamaClient, streams each request on a pooled worker thread.

A pykka actor handles one message at a time, so it never streams itself: a stream in its
own thread would make it deaf to stop for minutes. The session ``tell``s it a ``_Submit``
that carries the session's own reply future; the actor hands the request to an idle worker
of its pool and is free again at once. The worker streams, sends events straight to the
request's sink (the session actor is blocked on the reply future, not on this actor) and
resolves the future. One future and no thread start per request: a blocking ask plus a new
thread cost four thread wake-ups per model call, this costs three (issue 7).

The pool keeps ``inference.parallel`` workers alive and starts another whenever a request
finds none idle, so a request beyond ``parallel`` still reaches the client, which emits
``Queued`` and makes it wait for a slot (cancel and deadline apply there). Extra workers end
when they fall idle. Cancel goes through the request's CancelToken, never through the
mailbox. Stopping the actor fails what is still in its mailbox, cancels every request in
flight, waits briefly for the workers, and closes the client.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import sys
import threading
import time
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

_JOIN_S = 5.0  # how long stop waits for the cancelled workers, all together
_GRACE_S = 30.0  # beyond timeout_s, before a caller stops waiting on a silent worker
_ALIVE_POLL_S = 1.0  # how often a waiting caller checks that the actor still lives


@dataclasses.dataclass(frozen=True, slots=True)
class _Submit:
    """Stream ``request``; the worker resolves ``reply`` with the Completion or the error."""

    request: ChatRequest
    sink: Sink
    cancel: CancelToken
    reply: pykka.Future[Completion]


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


def _stopped() -> InferError:
    return InferError(InferErrorKind.CANCELLED, "the inference actor has stopped")


class InferenceActor(pykka.ThreadingActor):
    """Takes ``_Submit`` by ``tell`` and resolves its reply future from a pooled worker."""

    def __init__(
        self, config: InferenceConfig, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        super().__init__()
        self._config = config
        self._transport = transport
        self._client: LlamaClient | None = None
        self._jobs: queue.SimpleQueue[tuple[_Submit, _Linked] | None] = queue.SimpleQueue()
        self._workers: set[threading.Thread] = set()
        self._flying: set[_Linked] = set()
        self._idle = 0  # workers waiting on _jobs, or about to
        self._stopping = False
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def on_start(self) -> None:
        self._client = LlamaClient(self._config, transport=self._transport)
        with self._lock:
            for _ in range(self._config.parallel):
                self._idle += 1
                self._spawn()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Submit):
            try:
                self._submit(message)
            except BaseException:  # a tell that raises would kill the actor
                message.reply.set_exception(sys.exc_info())
            return None
        raise TypeError(f"InferenceActor does not handle {type(message).__name__}")

    def _submit(self, message: _Submit) -> None:
        token = _Linked(message.cancel)
        with self._lock:
            self._flying.add(token)
            if self._idle > 0:
                self._idle -= 1
            else:
                self._spawn()
        self._jobs.put((message, token))

    def _spawn(self) -> None:
        """Start one worker; called with the lock held."""
        worker = threading.Thread(
            target=self._work, name=f"loopd-inference-{next(self._ids)}", daemon=True
        )
        self._workers.add(worker)
        worker.start()

    def _work(self) -> None:
        assert self._client is not None
        client, jobs, lock = self._client, self._jobs, self._lock
        try:
            while (job := jobs.get()) is not None:
                message, token = job
                try:
                    if self._stopping:
                        raise _stopped()
                    message.reply.set(client.chat_with_retry(message.request, message.sink, token))
                except BaseException:
                    message.reply.set_exception(sys.exc_info())
                with lock:
                    self._flying.discard(token)
                    if self._idle >= self._config.parallel:
                        return  # an extra worker, started for a burst: not needed now
                    self._idle += 1
        finally:
            with lock:
                self._workers.discard(threading.current_thread())

    def on_stop(self) -> None:
        with self._lock:
            self._stopping = True
            flying = list(self._flying)
            workers = list(self._workers)
        for token in flying:
            token.cancel()
        self._fail_mailbox()
        for _ in workers:
            self._jobs.put(None)
        end = time.monotonic() + _JOIN_S
        for worker in workers:
            worker.join(timeout=max(0.0, end - time.monotonic()))
        if self._client is not None:
            self._client.close()

    def _fail_mailbox(self) -> None:
        """Submits told after stop are dropped by pykka: fail their futures instead."""
        others = []
        while not self.actor_inbox.empty():  # only this thread takes from it
            envelope = self.actor_inbox.get()
            message = getattr(envelope, "message", None)
            if isinstance(message, _Submit):
                message.reply.set_exception((InferError, _stopped(), None))
            else:
                others.append(envelope)
        for envelope in others:  # pykka's own teardown answers these
            self.actor_inbox.put(envelope)


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
        reply: pykka.Future[Completion] = pykka.ThreadingFuture()
        try:
            self._ref.tell(_Submit(request, sink, cancel, reply))
        except pykka.ActorDeadError:
            raise _stopped() from None
        end = time.monotonic() + self._config.timeout_s + _GRACE_S
        stopped = False
        while True:
            try:
                return reply.get(timeout=max(0.0, min(_ALIVE_POLL_S, end - time.monotonic())))
            except pykka.Timeout:
                pass
            now = time.monotonic()
            if now >= end and stopped:  # the submit was lost, or its worker hangs
                raise _stopped() from None
            if now >= end:  # the client's own deadline should have ended it long before
                raise InferError(
                    InferErrorKind.TIMEOUT,
                    f"no answer within inference.timeout_s = {self._config.timeout_s:g} s",
                ) from None
            if not stopped and not self._ref.is_alive():  # its workers end within _JOIN_S
                stopped, end = True, min(end, now + _JOIN_S + _ALIVE_POLL_S)

    def stop(self) -> None:
        """Cancel what is in flight and close the client; safe to call twice."""
        if self._ref.is_alive():
            self._ref.stop(timeout=_JOIN_S + 5)
