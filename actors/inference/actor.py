"""The inference actors: ``inference.parallel`` pykka actors sharing the servers' clients.

The session asks an inference actor for a completion and blocks on the reply while the
actor streams in its own thread, sending events straight to the request's sink. Before
that, the handle (:class:`Inference`) takes a lease on a slot from the slot keeper
(:mod:`actors.inference.slots.keeper`: the session's own slot, or a slot its state is restored
into), then lends the request an idle actor, streams on that server and slot, and gives the
lease back. When no slot or no actor is free the request emits ``Queued`` (saying which it
waits for, behind which other sessions) and waits in one loop, where cancel and the
deadline apply; waiting for its own session's save after its last turn is silent. At most
``inference.parallel`` requests stream from this process at once. A request whose server
stops answering (connect errors after the retries) is asked again on another server when
there is one; the keeper moves the session there.

One ask is two thread wake-ups per model call, the fewest an actor hand-off allows (a
dispatcher actor in front of worker threads cost three). An actor busy streaming
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
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpcore
import pykka

from actors.base.cancel import CancelToken
from actors.base.config import InferenceConfig
from actors.base.events import Queued, Sink
from actors.inference import traced
from actors.inference.llama import LlamaClient
from actors.inference.slots.keeper import KeeperSettings, Lease, ServerSpec, SlotKeeper
from actors.inference.types import ChatRequest, Completion, InferError, InferErrorKind

T = TypeVar("T")

__all__ = ["Inference", "InferenceActor"]

_STOP_S = 5.0  # how long stop waits for the actors, all together
_GRACE_S = 30.0  # beyond timeout_s, before a caller stops waiting on a silent actor
_QUEUE_POLL_S = 0.05  # how often a queued request checks cancel, deadline and stop


@dataclasses.dataclass(frozen=True, slots=True)
class _Ask:
    """Stream ``request``; the reply is its Completion or its InferError."""

    request: ChatRequest
    client: LlamaClient  # the leased slot's server
    slot: int
    sink: Sink
    cancel: CancelToken
    deadline: float


_STOPPED = "the inference actor has stopped"


class InferenceActor(pykka.ThreadingActor):
    """Streams one ``_Ask`` at a time through its server's client, in this actor's thread."""

    use_daemon_thread = True  # a server that ignores the cancel cannot keep loopd alive

    def on_receive(self, message: Any) -> Completion | InferError:
        if not isinstance(message, _Ask):
            raise TypeError(f"InferenceActor does not handle {type(message).__name__}")
        try:
            return message.client.chat_with_retry(
                message.request, message.sink, message.cancel, slot=message.slot,
                deadline=message.deadline,
            )
        except InferError as e:
            return e


class Inference:
    """The session actor's handle: blocking calls, made from the session actor's thread."""

    def __init__(
        self, config: InferenceConfig, clients: Sequence[LlamaClient], keeper: SlotKeeper,
        model: str = "llama-server",
    ) -> None:
        self._config, self.model = config, model  # the model's name, for its traces
        self._clients = list(clients)
        self.keeper = keeper
        self._refs = [InferenceActor.start() for _ in range(config.parallel)]
        self._idle: queue.SimpleQueue[pykka.ActorRef[InferenceActor]] = queue.SimpleQueue()
        for ref in self._refs:
            self._idle.put(ref)
        self._lock = threading.Lock()
        self._flying: set[CancelToken] = set()
        self._streaming: list[str] = []  # the sessions whose requests have an actor now
        self._waiting = 0
        self._stopping = False

    @classmethod
    def start(
        cls,
        config: InferenceConfig,
        *,
        network: httpcore.NetworkBackend | None = None,
        servers: Sequence[ServerSpec] = (),
        keeper: KeeperSettings | None = None,
        say: Callable[[str], None] = lambda _: None,
        model: str = "llama-server",
    ) -> Inference:
        """Clients for ``servers`` (default: ``inference.servers``, else ``inference.url``)
        and the slot keeper over them (default: no KV state kept on disk)."""
        specs = list(servers) or [ServerSpec(u) for u in (config.servers or (config.url,))]
        clients = [LlamaClient(config, url=s.url, network=network) for s in specs]
        try:
            slots = SlotKeeper.start(list(zip(specs, clients, strict=True)),
                                     keeper or KeeperSettings(), say)
        except BaseException:
            for c in clients:
                c.close()
            raise
        return cls(config, clients, slots, model)

    def complete(self, request: ChatRequest, sink: Sink, cancel: CancelToken) -> Completion:
        """Stream one answer, events to ``sink``; raises InferError (CANCELLED when stopped).

        The Completion's ``slot`` says what the slot keeper did for it.
        """
        deadline = time.monotonic() + self._config.timeout_s
        with traced.chat(request, self.model) as span, cancel.linked() as token:
            sink = span.watch(sink)  # token: stop cancels this request, not the caller's turn
            with self._lock:
                if self._stopping:
                    raise InferError.cancelled(_STOPPED)
                self._flying.add(token)
            try:
                while True:
                    lease = self._warm(self._lease(request.session, sink, token, deadline),
                                       request, token, deadline)
                    outcome = self._stream(lease, request, sink, token, deadline)
                    if isinstance(outcome, Completion):
                        return span.done(dataclasses.replace(
                            outcome, slot=lease.use, baseline=lease.baseline), lease.client.url)
                    if not self.keeper.server_failed(lease, outcome):
                        raise outcome
            finally:
                with self._lock:
                    self._flying.discard(token)

    def context(self, session: str) -> int:
        """Tokens of context of the slot ``session``'s requests go to (0: unknown)."""
        return self.keeper.server_of(session)[1]

    def tokens(self, session: str, text: str) -> int:
        """Tokens of ``text`` for the model of ``session``'s server (its ``/tokenize``);
        InferError when the server cannot say."""
        return self.keeper.server_of(session)[0].tokenize(text)

    def turn_ended(self, session: str) -> None:
        """``session``'s turn is over: the keeper may save its state now
        (:meth:`SlotKeeper.turn_ended`)."""
        self.keeper.turn_ended(session)

    def slot_count(self) -> int:
        """The slots of the model servers together (agents at once, by default)."""
        return self.keeper.slot_count()

    def save_state(self, session: str) -> None:
        """Save ``session``'s KV state now if it changed (a fork copies it next:
        :meth:`SlotKeeper.save_now`)."""
        self.keeper.save_now(session)

    def _warm(self, lease: Lease, request: ChatRequest, cancel: CancelToken,
              deadline: float) -> Lease:
        """``lease`` with the baseline in its slot when the slot holds none of the session's
        state (:meth:`SlotKeeper.warm_start`): a new session's first request processes
        only its message. Cancelled or out of time: the lease is given up."""
        if not request.messages:
            return lease
        try:
            return self.keeper.warm_start(lease, request.messages[0], request.tools, cancel,
                                          deadline)
        except BaseException:
            self.keeper.abandon(lease)
            raise

    def _lease(self, session: str, sink: Sink, cancel: CancelToken, deadline: float) -> Lease:
        ticket = self.keeper.enter(session)
        try:
            return self._wait(
                lambda timeout: self.keeper.take(ticket, timeout),
                lambda: self.keeper.ahead(ticket), lambda: self.keeper.waiting_on(ticket),
                "a free slot", "all slots of the model servers were leased",
                sink, cancel, deadline,
            )
        finally:
            self.keeper.leave(ticket)

    def _stream(self, lease: Lease, request: ChatRequest, sink: Sink, cancel: CancelToken,
                deadline: float) -> Completion | InferError:
        """On ``lease``'s server and slot, with an idle actor; the lease is given back."""
        outcome: Completion | InferError = InferError.cancelled(_STOPPED)
        try:
            ref = self._lend(request.session, sink, cancel, deadline)
            try:
                outcome = self._ask(
                    ref, _Ask(request, lease.client, lease.slot, sink, cancel, deadline)
                )
            finally:
                with self._lock:
                    self._streaming.remove(request.session)
                self._idle.put(ref)
        except InferError as e:
            outcome = e
        finally:
            self.keeper.give_back(lease, outcome)
        return outcome

    def _lend(
        self, session: str, sink: Sink, cancel: CancelToken, deadline: float
    ) -> pykka.ActorRef[InferenceActor]:
        """An idle actor, lent to ``session``'s request; Queued first when there is none
        (cancel and deadline apply)."""

        def take(timeout: float) -> pykka.ActorRef[InferenceActor] | None:
            try:
                ref = self._idle.get(timeout=timeout) if timeout else self._idle.get_nowait()
            except queue.Empty:
                return None
            with self._lock:
                self._streaming.append(session)
            return ref

        def streaming() -> tuple[str, ...]:  # the others: a session never waits on itself
            with self._lock:
                return tuple(n for n in dict.fromkeys(self._streaming) if n != session)

        with self._lock:
            self._waiting += 1
        try:
            return self._wait(
                take, lambda: self._waiting, streaming, "an inference actor",
                f"queued behind inference.parallel = {self._config.parallel} requests",
                sink, cancel, deadline,
            )
        finally:
            with self._lock:
                self._waiting -= 1

    def _wait(
        self, take: Callable[[float], T | None], ahead: Callable[[], int],
        behind: Callable[[], tuple[str, ...]], what: str, why: str, sink: Sink,
        cancel: CancelToken, deadline: float,
    ) -> T:
        """What ``take`` gives; Queued (waiting for ``what``, behind the sessions ``behind``
        names) first when it gives nothing at once and others hold it: a wait for the
        session's own save is silent. Cancel and the deadline end the wait (InferError)."""
        got = take(0.0)
        if got is not None:
            return got
        others = behind()
        if others:
            sink(Queued(ahead=ahead(), waiting_for=what, sessions=", ".join(others)))
        while True:
            if cancel.cancelled:
                raise InferError.cancelled(_STOPPED if self._stopping else "cancelled")
            if time.monotonic() >= deadline:
                raise InferError(
                    InferErrorKind.TIMEOUT,
                    "no complete answer within inference.timeout_s = "
                    f"{self._config.timeout_s:g} s ({why})",
                )
            got = take(_QUEUE_POLL_S)
            if got is not None:
                return got

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
        """Cancel what is in flight, stop the actors, save the sessions' changed KV state,
        close the clients; safe to call twice."""
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
        self.keeper.close()  # saves what changed, before the server stops
        for client in self._clients:
            client.close()

