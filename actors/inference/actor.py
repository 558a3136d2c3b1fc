"""The inference actors: ``inference.parallel`` pykka actors sharing one LlamaClient.

The session asks an inference actor for a completion and blocks on the reply while the
actor streams in its own thread, sending events straight to the request's sink. An actor
streams one request at a time, so the handle (:class:`Inference`) lends each request an idle
actor; when none is idle the request emits ``Queued`` and waits (cancel and the deadline
apply there too). That is the whole concurrency limit: at most ``inference.parallel``
requests stream from this process at once.

One ask is two thread wake-ups per model call, the fewest an actor hand-off allows (a
dispatcher actor in front of worker threads cost three, issue 7). An actor busy streaming
does not read its mailbox, so it is never stopped through it alone: ``stop`` first cancels
every request in flight through its CancelToken (the client's watchdog shuts the socket at
once), and the actors then take their stop message within a watchdog tick. An ask that
finds its actor stopped, or is left in a stopped actor's mailbox (pykka fails those with
ActorDeadError), ends as ``InferError(CANCELLED)``; nothing is lost.

The actor returns an InferError instead of raising it: pykka logs every exception an ask
raises, and a failed request (a full context, a server down) is an answer, not a crash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from typing import Any

import httpx
import pykka

from actors.cancel import CancelToken
from actors.config import InferenceConfig
from actors.events import Queued, Sink
from actors.inference.client import LlamaClient
from actors.inference.types import ChatRequest, Completion, InferError, InferErrorKind

__all__ = ["Inference", "InferenceActor"]

_STOP_S = 5.0  # how long stop waits for the actors, all together
_GRACE_S = 30.0  # beyond timeout_s, before a caller stops waiting on a silent actor
_QUEUE_POLL_S = 0.05  # how often a queued request checks cancel, deadline and stop


@dataclasses.dataclass(frozen=True, slots=True)
class _Ask:
    """Stream ``request``; the reply is its Completion or its InferError."""

    request: ChatRequest
    sink: Sink
    cancel: CancelToken
    deadline: float


_STOPPED = "the inference actor has stopped"


class InferenceActor(pykka.ThreadingActor):
    """Streams one ``_Ask`` at a time through the shared client, in this actor's thread."""

    use_daemon_thread = True  # a server that ignores the cancel cannot keep loopd alive

    def __init__(self, client: LlamaClient) -> None:
        super().__init__()
        self._client = client

    def on_receive(self, message: Any) -> Completion | InferError:
        if not isinstance(message, _Ask):
            raise TypeError(f"InferenceActor does not handle {type(message).__name__}")
        try:
            return self._client.chat_with_retry(
                message.request, message.sink, message.cancel, deadline=message.deadline
            )
        except InferError as e:
            return e


class Inference:
    """The session actor's handle: blocking calls, made from the session actor's thread."""

    def __init__(self, config: InferenceConfig, client: LlamaClient) -> None:
        self._config = config
        self._client = client
        self._refs = [InferenceActor.start(client) for _ in range(config.parallel)]
        self._idle: queue.SimpleQueue[pykka.ActorRef[InferenceActor]] = queue.SimpleQueue()
        for ref in self._refs:
            self._idle.put(ref)
        self._lock = threading.Lock()
        self._flying: set[CancelToken] = set()
        self._waiting = 0
        self._stopping = False

    @classmethod
    def start(
        cls, config: InferenceConfig, *, transport: httpx.BaseTransport | None = None
    ) -> Inference:
        return cls(config, LlamaClient(config, transport=transport))

    def complete(self, request: ChatRequest, sink: Sink, cancel: CancelToken) -> Completion:
        """Stream one answer, events to ``sink``; raises InferError (CANCELLED when stopped)."""
        deadline = time.monotonic() + self._config.timeout_s
        with cancel.linked() as token:  # stop cancels this request, not the caller's turn
            with self._lock:
                if self._stopping:
                    raise InferError.cancelled(_STOPPED)
                self._flying.add(token)
            try:
                ref = self._lend(sink, token, deadline)
                try:
                    outcome = self._ask(ref, _Ask(request, sink, token, deadline))
                finally:
                    self._idle.put(ref)
            finally:
                with self._lock:
                    self._flying.discard(token)
        if isinstance(outcome, InferError):
            raise outcome
        return outcome

    def _lend(
        self, sink: Sink, cancel: CancelToken, deadline: float
    ) -> pykka.ActorRef[InferenceActor]:
        """An idle actor; Queued first when there is none (cancel and deadline apply)."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            self._waiting += 1
            ahead = self._waiting
        try:
            sink(Queued(ahead=ahead))
            while True:
                if cancel.cancelled:
                    raise InferError.cancelled(_STOPPED if self._stopping else "cancelled")
                if time.monotonic() >= deadline:
                    raise InferError(
                        InferErrorKind.TIMEOUT,
                        "no complete answer within inference.timeout_s = "
                        f"{self._config.timeout_s:g} s (queued behind "
                        f"inference.parallel = {self._config.parallel} requests)",
                    )
                try:
                    return self._idle.get(timeout=_QUEUE_POLL_S)
                except queue.Empty:
                    continue
        finally:
            with self._lock:
                self._waiting -= 1

    def _ask(self, ref: pykka.ActorRef[InferenceActor], ask: _Ask) -> Completion | InferError:
        try:
            future = ref.ask(ask, block=False)
            reply: Completion | InferError = future.get(
                timeout=max(0.0, ask.deadline - time.monotonic()) + _GRACE_S
            )
        except pykka.ActorDeadError:
            return InferError.cancelled(_STOPPED)
        except pykka.Timeout:  # the client's own deadline should have ended it long before
            return InferError(
                InferErrorKind.TIMEOUT,
                f"no answer within inference.timeout_s = {self._config.timeout_s:g} s",
            )
        return reply

    def stop(self) -> None:
        """Cancel what is in flight, stop the actors, close the client; safe to call twice."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            flying = list(self._flying)
        for token in flying:
            token.cancel()
        stops = [ref.stop(block=False) for ref in self._refs]
        end = time.monotonic() + _STOP_S
        for stopped in stops:
            # A stream that ignores its cancel: its daemon thread ends with the process.
            with contextlib.suppress(pykka.Timeout):
                stopped.get(timeout=max(0.0, end - time.monotonic()))
        self._client.close()

