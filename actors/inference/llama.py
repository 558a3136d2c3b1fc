"""A streaming llama-server client: one ChatRequest in, ChatEvents out, one Completion back.

One ``LlamaClient`` per server, shared by threads (httpx's client is thread-safe). Each
request is ``POST /v1/chat/completions`` with ``stream: true``, parsed with httpx-sse and
assembled by :class:`~actors.inference.sse.StreamAssembler`.

Decisions (docs/inference.md; the server's side in docs/llama-server.md):

- **Retries** (``chat_with_retry``): connect errors, a closed connection with no response,
  timeouts before any of the answer arrived, 503 and other 5xx, an ``error`` event inside a
  200 stream, and a stream cut before ``[DONE]`` are retried up to ``inference.retries``
  times with exponential backoff and jitter, each announced by a ``Retrying`` event. The
  partial output of a failed stream is dropped: a sink that showed it must discard it on
  ``Retrying``. 4xx, malformed chunks, a non-SSE answer, a timeout after the answer began
  and the wall-clock deadline are not retried.
- **Deadline**: ``inference.timeout_s`` bounds the whole call, retries and backoff included;
  httpx's read timeout bounds the gap between two chunks. A watchdog shuts the socket down
  when the deadline passes or the cancel token is set, so neither waits for the next chunk.
- **Thinking cap**: ``ChatRequest.thinking_budget`` goes to the server as
  ``reasoning_budget_tokens`` (with ``reasoning_control``). Reasoning deltas are counted as
  a backstop: past the budget, one ``reasoning_end`` control call; if that fails, or reasoning
  goes on for more than ``CONTROL_GRACE`` deltas after it, the stream is closed and the same
  messages are asked again with thinking off. Reaching the budget emits ``ThinkingCapped``
  once. Once content or a tool call has started, reasoning is left to finish. The abandoned
  stream's reasoning is kept on the Completion (it was shown, and it counts toward the cap).
  A request with thinking off (the re-ask, or a turn whose cap is spent) that still streams
  reasoning before any answer is stopped after ``CONTROL_GRACE`` deltas (InferError,
  protocol): there is nothing left to fall back on, and it must not run to the timeout.
- **max_tokens**: a server that streams more than ``max_tokens`` (plus ``CONTROL_GRACE``)
  pieces is cut off there, and the answer ends as cut (``finish_reason`` "length").
- **Runaway text** (:mod:`actors.inference.runaway`): answer or reasoning text that repeats
  itself, copies the prompt, or repeats a passage earlier answers copied past the request's
  limits closes the stream (the server stops generating) and emits ``AnswerCut``; the
  answer ends there, cut (``finish_reason`` "repeat", "copy" or "echo"). Reasoning that
  runs away before any answer is treated like the thinking cap's: the same messages are
  asked again with thinking off.
- **A cut answer is kept**: when the request ends after some answer or reasoning streamed
  (the deadline, a read timeout, a stream that broke or failed and may not be retried),
  what streamed is the answer, cut (``finish_reason`` "timeout" or "error", ``AnswerCut``),
  without any tool call it was still writing. A cancel keeps nothing.
- **Queueing** is not done here: the inference actors (:mod:`actors.inference.actor`) lend
  each request one of ``inference.parallel`` actors, and a request that finds none idle
  emits ``Queued`` and waits there. The client itself streams whatever it is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpcore
import httpx
import orjson
from httpx_sse import EventSource, ServerSentEvent

from actors.base.cancel import CancelToken
from actors.base.config import InferenceConfig
from actors.base.events import (
    AnswerCut,
    Content,
    Reasoning,
    Retrying,
    Sink,
    ThinkingCapped,
    Waiting,
)
from actors.inference.runaway import Runaway, Watcher
from actors.inference.sse import StreamAssembler
from actors.inference.types import (
    MAX_ERROR_BODY,
    ChatRequest,
    Completion,
    InferError,
    InferErrorKind,
    error_object,
)
from actors.inference.watchdog import Watch, Watchdog, watched_transport
from actors.log.records import Cut
from actors.wire.codec import plain

__all__ = ["CONTROL_GRACE", "LlamaClient", "encode_body", "request_body"]

CHAT_PATH = "/v1/chat/completions"
CONTROL_PATH = "/v1/chat/completions/control"
CONTROL_GRACE = 8  # reasoning deltas still accepted after a successful reasoning_end
_MAX_BACKOFF_S = 30.0
_DRAIN_S = 1.0  # how long the end of a response may take after [DONE]
# llama-server closes a connection idle for 5 s (cpp-httplib's keep-alive, announced as
# "Keep-Alive: timeout=5"); httpx's pool kept one 5 s too, so a request sent on a kept
# connection just as the server closed it failed ("Server disconnected without sending a
# response"; a /tokenize is not retried). The pool drops an idle connection well before.
SERVER_KEEPALIVE_S = 5.0
KEEPALIVE_S = 2.0


def encode_body(request: ChatRequest, slot: int = 0) -> bytes:
    """``request_body`` as UTF-8 JSON; orjson, with json for what it refuses (ints > 64 bits)."""
    body = request_body(request, slot)
    try:
        return orjson.dumps(body, default=plain)
    except TypeError:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=plain).encode()


def request_body(request: ChatRequest, slot: int = 0) -> dict[str, Any]:
    """The JSON body llama-server gets for ``request`` on ``slot`` (never ``X-Conversation-Id``).

    The slot is the one the slot keeper leased to the session (docs/slots.md#leases).
    """
    body: dict[str, Any] = {
        "model": "loopd",  # ignored by a server with one model
        "messages": request.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "id_slot": slot,
        "cache_prompt": True,
        "return_progress": True,
    }
    body.update(request.sampling)
    if request.tools:
        body["tools"] = request.tools
    if request.grammar is not None:
        body["grammar"] = request.grammar
        # the server's own call grammar off: docs/llama-server.md#tools-and-grammars
        body["tool_choice"] = "none"
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if not request.thinking:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    elif request.thinking_budget is not None:
        body["reasoning_budget_tokens"] = request.thinking_budget
        body["reasoning_control"] = True
    return body


class _Failed(Exception):
    """One exchange failed; ``retry`` says whether the retry policy may try again."""

    def __init__(
        self, error: InferError, *, retry: bool, partial: StreamAssembler | None = None
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry = retry
        self.partial = partial  # what streamed before it failed: kept when not retried


@dataclasses.dataclass(slots=True)
class _Abandoned:
    """A stream closed by the thinking cap before any answer: ask again, thinking off."""

    reasoning: str | None
    reasoning_tokens: int


class _Next(enum.Enum):
    """What a stream does after a chunk, as the thinking cap sees it."""

    GO_ON = "go on"
    ASK_END = "ask the server to end the reasoning"
    ABANDON = "close the stream, ask again with thinking off"
    STOP = "fail: reasoning goes on with thinking off"


@dataclasses.dataclass(slots=True)
class _ThinkingCap:
    """The thinking cap's backstop over one stream (the module docstring, "Thinking cap")."""

    budget: int | None  # reasoning deltas allowed; None: no cap to keep (thinking off)
    unthinking: bool  # thinking is off: reasoning before an answer gets a grace only
    seen: int = 0  # reasoning deltas already checked against the budget
    asked_end: bool = False  # reasoning_end was sent (once per stream)

    @staticmethod
    def of(request: ChatRequest) -> _ThinkingCap:
        return _ThinkingCap(request.thinking_budget if request.thinking else None,
                            not request.thinking)

    @property
    def reached(self) -> bool:
        return self.budget is not None and self.seen >= self.budget

    def after(self, deltas: int, answered: bool) -> _Next:
        """What to do now that the stream has brought ``deltas`` reasoning pieces; once
        content or a call has started (``answered``), reasoning is left to finish."""
        if self.unthinking and deltas > CONTROL_GRACE and not answered:
            return _Next.STOP
        if self.budget is None or deltas == self.seen:
            return _Next.GO_ON
        self.seen = deltas
        if deltas <= self.budget or answered:
            return _Next.GO_ON
        if not self.asked_end:
            self.asked_end = True
            return _Next.ASK_END
        return _Next.GO_ON if deltas <= self.budget + CONTROL_GRACE else _Next.ABANDON


@dataclasses.dataclass(slots=True)
class _Run:
    """What one logical request carries across its exchanges."""

    deadline: float
    slot: int = 0
    capped: bool = False  # ThinkingCapped already emitted
    reasoning: str | None = None  # from an abandoned, capped stream
    reasoning_tokens: int = 0
    cut: Cut | None = None  # reasoning cut by the runaway-text limit (then asked again)


class LlamaClient:
    """One llama-server; ``chat`` makes one attempt, ``chat_with_retry`` applies the policy."""

    def __init__(
        self,
        config: InferenceConfig,
        *,
        url: str = "",
        network: httpcore.NetworkBackend | None = None,
    ) -> None:
        """``network`` makes the connections (default: the system's sockets; tests give
        one that serves a handler); the watchdog watches them either way."""
        url = url or config.url
        if not url:
            raise ValueError(
                "inference.url is empty: set it to the llama-server's URL "
                "(e.g. http://127.0.0.1:8080) or start the embedded server first"
            )
        self._config = config
        self._url = url.rstrip("/")
        timeout = httpx.Timeout(
            connect=config.connect_timeout_s,
            read=config.read_timeout_s,
            write=config.read_timeout_s,
            pool=config.connect_timeout_s,
        )
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        limits = httpx.Limits(max_connections=config.parallel * 2 + 2,
                              keepalive_expiry=KEEPALIVE_S)
        self._watchdog = Watchdog()
        self._http = httpx.Client(
            timeout=timeout, headers=headers, transport=watched_transport(limits, network)
        )

    # --- public ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    def chat(
        self,
        request: ChatRequest,
        sink: Sink,
        cancel: CancelToken,
        *,
        slot: int = 0,
        deadline: float | None = None,
    ) -> Completion:
        """One attempt (plus the thinking-off re-ask if the thinking cap needs it).

        ``deadline`` (a ``time.monotonic()`` value) defaults to ``inference.timeout_s`` from
        now; a caller that queued the request first passes the one it started with.
        """
        return self._run(request, sink, cancel, retries=0, slot=slot, deadline=deadline)

    def chat_with_retry(
        self,
        request: ChatRequest,
        sink: Sink,
        cancel: CancelToken,
        *,
        slot: int = 0,
        deadline: float | None = None,
    ) -> Completion:
        """``chat`` with the retry policy (docs/inference.md#retries); raises the last
        InferError."""
        return self._run(
            request, sink, cancel, retries=self._config.retries, slot=slot, deadline=deadline
        )

    def props(self) -> Mapping[str, Any]:
        """``GET /props``: the server's slot count, per-slot ``n_ctx``, model and build."""
        return self._json("GET", "/props")

    def tokenize(self, text: str) -> int:
        """``POST /tokenize``: how many tokens ``text`` is for the server's model (no BOS).
        InferError as for :meth:`props`; PROTOCOL when the answer holds no token list."""
        tokens = self._json("POST", "/tokenize", {"content": text, "add_special": False}).get(
            "tokens")
        if not isinstance(tokens, list):
            raise InferError(InferErrorKind.PROTOCOL, f"{self._url}/tokenize: no token list")
        return len(tokens)

    def slot_action(self, slot: int, action: str, filename: str = "") -> Mapping[str, Any]:
        """``POST /slots/{slot}?action=save|restore|erase``
        (docs/llama-server.md#saving-and-restoring-a-slot).

        Raises InferError: HTTP 501 ``not_supported_error`` when the server has no
        ``--slot-save-path``, 400 when it refuses the file, CONNECT when it is gone.
        """
        body = {"filename": filename} if filename else {}
        return self._json("POST", f"/slots/{slot}?action={action}", body)

    def render(self, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]]) -> str:
        """``POST /apply-template``: the prompt text the server's chat template makes of
        ``messages`` and ``tools`` (nothing is processed). InferError as for :meth:`props`;
        PROTOCOL when the answer holds no prompt text."""
        body: dict[str, Any] = {"messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        prompt = self._json("POST", "/apply-template", body).get("prompt")
        if not isinstance(prompt, str):
            raise InferError(InferErrorKind.PROTOCOL, f"{self._url}/apply-template: no prompt")
        return prompt

    def prefill(self, prompt: str, slot: int, cancel: CancelToken,
                deadline: float) -> Mapping[str, Any]:
        """``POST /completion`` of ``prompt`` on ``slot`` with one token generated (the
        fewest llama-server makes): the slot then holds the prompt's KV state, ready to be
        saved. Cancel and ``deadline`` end it at once (the watchdog shuts the socket);
        InferError as for :meth:`props`."""
        body = {"prompt": prompt, "n_predict": 1, "id_slot": slot, "cache_prompt": True,
                "stream": False}
        with self._watchdog.watch(cancel, deadline) as watch:
            try:
                return self._json("POST", "/completion", body,
                                  read_s=max(self._config.read_timeout_s,
                                             deadline - time.monotonic()))
            except InferError:
                if cancel.cancelled or watch.expired == "cancelled":
                    raise InferError.cancelled() from None
                if watch.expired == "deadline":
                    raise self._timed_out() from None
                raise

    def _json(self, method: str, path: str, body: Any = None,
              read_s: float | None = None) -> Mapping[str, Any]:
        """One small JSON exchange (not streamed, not retried); InferError on any failure."""
        where = self._url + path
        try:
            r = self._http.request(
                method, where, json=body, headers={"Accept": "application/json"},
                timeout=httpx.Timeout(read_s or self._config.read_timeout_s,
                                      connect=self._config.connect_timeout_s),
            )
        except httpx.ConnectError as e:
            raise InferError(InferErrorKind.CONNECT, f"could not connect to {where}: {e}") from e
        except httpx.TimeoutException as e:
            raise InferError(InferErrorKind.TIMEOUT, f"{where} did not answer: {e}") from e
        except httpx.HTTPError as e:
            raise InferError(InferErrorKind.PROTOCOL, f"{where}: {type(e).__name__}: {e}") from e
        text = r.text[:MAX_ERROR_BODY]
        if r.status_code != 200:
            raise _server_error(r, text)
        try:
            data = r.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise InferError(InferErrorKind.PROTOCOL, f"{where} answered 200 without a JSON object")
        return data

    def close(self) -> None:
        self._http.close()
        self._watchdog.close()

    # --- one logical request -----------------------------------------------------------

    def _run(
        self,
        request: ChatRequest,
        sink: Sink,
        cancel: CancelToken,
        *,
        retries: int,
        slot: int,
        deadline: float | None,
    ) -> Completion:
        if deadline is None:
            deadline = time.monotonic() + self._config.timeout_s
        run = _Run(deadline=deadline, slot=slot)
        failures = 0
        while True:
            if cancel.cancelled:
                raise InferError.cancelled()
            try:
                outcome = self._exchange(request, sink, cancel, run)
            except _Failed as f:
                if f.retry and failures < retries and self._backoff(failures + 1, f.error,
                                                                    sink, cancel, run):
                    failures += 1
                    continue
                outcome = _kept(f, sink)  # the last attempt's text, else its error
            if isinstance(outcome, _Abandoned):
                run.reasoning, run.reasoning_tokens = outcome.reasoning, outcome.reasoning_tokens
                request = dataclasses.replace(request, thinking=False, thinking_budget=None)
                continue
            completion = outcome.completion(
                thinking_capped=run.capped,
                extra_reasoning=run.reasoning_tokens,
                reasoning=run.reasoning,
            )
            if run.cut is not None and completion.cut is None:
                completion = dataclasses.replace(completion, cut=run.cut)
            return completion

    def _backoff(
        self, failures: int, error: InferError, sink: Sink, cancel: CancelToken, run: _Run
    ) -> bool:
        """Wait before attempt ``failures + 1``; False: no time is left for it."""
        base = self._config.backoff_s * 2 ** (failures - 1)
        delay = min(_MAX_BACKOFF_S, base * random.uniform(0.5, 1.5))
        if time.monotonic() + delay >= run.deadline:
            return False
        reason = f"HTTP {error.status}: {error.message}" if error.status else error.message
        sink(Retrying(attempt=failures, delay=delay, reason=reason))
        if cancel.wait(delay):
            raise InferError.cancelled()
        return True

    # --- one exchange ------------------------------------------------------------------

    def _exchange(
        self, request: ChatRequest, sink: Sink, cancel: CancelToken, run: _Run
    ) -> StreamAssembler | _Abandoned:
        content = encode_body(request, run.slot)
        if time.monotonic() >= run.deadline:
            raise _Failed(self._timed_out(), retry=False)
        with self._watchdog.watch(cancel, run.deadline) as watch:
            sink(Waiting())
            try:
                response = self._http.send(
                    self._http.build_request(
                        "POST",
                        self._url + CHAT_PATH,
                        content=content,
                        headers={"Content-Type": "application/json"},
                    ),
                    stream=True,
                )
            except httpx.HTTPError as e:
                raise self._transport_failure(e, watch, cancel, run, answered=False) from None
            try:
                if response.status_code != 200:
                    raise self._http_failure(response, watch, cancel, run)
                kind = response.headers.get("content-type", "")
                if "text/event-stream" not in kind:
                    raise _Failed(
                        InferError(
                            InferErrorKind.PROTOCOL,
                            f"{self._url}{CHAT_PATH} answered 200 with {kind or 'no'} content "
                            "type, not an event stream: is inference.url a llama-server?",
                            status=200,
                        ),
                        retry=False,
                    )
                return self._read(response, request, sink, cancel, run, watch)
            finally:
                response.close()

    def _read(
        self,
        response: httpx.Response,
        request: ChatRequest,
        sink: Sink,
        cancel: CancelToken,
        run: _Run,
        watch: Watch,
    ) -> StreamAssembler | _Abandoned:
        asm = StreamAssembler()
        feed, deadline, monotonic = asm.feed, run.deadline, time.monotonic  # once per token
        watcher = (Watcher(request.messages, request.runaway_repeat, request.runaway_copy,
                           echo=request.runaway_echo, echoes=request.echoes)
                   if request.runaway_repeat or request.runaway_copy or request.runaway_echo
                   else None)
        cap = _ThinkingCap.of(request)
        most = None if request.max_tokens is None else request.max_tokens + CONTROL_GRACE
        stream = EventSource(response).iter_sse()
        try:
            for sse in stream:
                data = sse.data
                if not data:  # event:/id:/retry: alone dispatch no event (SSE spec)
                    continue
                if cancel.cancelled:
                    raise _Failed(InferError.cancelled(), retry=False)
                if monotonic() >= deadline:
                    raise _Failed(self._timed_out(), retry=False, partial=asm)
                try:
                    events = feed(data)
                except InferError as e:  # an error event is a 5xx; bad chunks are not retried
                    said = e.kind is InferErrorKind.HTTP  # the server's: what came is kept
                    raise _Failed(e, retry=_retryable_status(e.status),
                                  partial=asm if said else None) from None
                for event in events:
                    sink(event)
                    if watcher is not None and isinstance(event, Content | Reasoning):
                        thought = type(event) is Reasoning
                        found = watcher.feed(event.text, thought)
                        if found is not None:
                            return _runaway(found, thought, asm, request, sink, run)
                if asm.done:
                    _drain(stream, watch)
                    return asm
                if most is not None and asm.deltas > most:
                    asm.finish_reason = "length"  # the server ignored max_tokens: cut here
                    return asm
                if asm.reasoning_deltas == cap.seen and not cap.unthinking:
                    continue  # no new reasoning: nothing for the cap (once per token, inline)
                step = cap.after(asm.reasoning_deltas, asm.answered)
                if step is _Next.STOP:
                    raise _Failed(_thinking_on(asm.reasoning_deltas), retry=False)
                if cap.reached and not run.capped:
                    run.capped = True
                    sink(ThinkingCapped(tokens=cap.seen, cap=cap.budget or 0))
                if step is _Next.GO_ON or (step is _Next.ASK_END and self._reasoning_end(asm.id)):
                    continue
                return _Abandoned(asm.reasoning_text(), asm.reasoning_deltas)
        except httpx.HTTPError as e:
            failed = self._transport_failure(e, watch, cancel, run, answered=asm.answered)
            failed.partial = asm
            raise failed from None
        if _interrupted(watch, cancel):
            failed = self._expired(watch, cancel)
            failed.partial = asm
            raise failed
        raise _Failed(
            InferError(
                InferErrorKind.PROTOCOL,
                "the server closed the stream before the answer ended (no [DONE])",
            ),
            retry=True,
            partial=asm,
        )

    def _reasoning_end(self, chat_id: str | None) -> bool:
        """Ask the server to end the running reasoning now; False if it could not."""
        if chat_id is None:
            return False
        try:
            r = self._http.post(
                self._url + CONTROL_PATH,
                json={"id": chat_id, "action": "reasoning_end"},
                timeout=self._config.connect_timeout_s,
            )
            return r.status_code == 200 and r.json().get("success") is True
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    # --- errors --------------------------------------------------------------------------

    def _timed_out(self) -> InferError:
        return InferError(
            InferErrorKind.TIMEOUT,
            f"no complete answer within inference.timeout_s = {self._config.timeout_s:g} s",
        )

    def _expired(self, watch: Watch, cancel: CancelToken) -> _Failed:
        if cancel.cancelled or watch.expired == "cancelled":
            return _Failed(InferError.cancelled(), retry=False)
        return _Failed(self._timed_out(), retry=False)

    def _transport_failure(
        self,
        e: httpx.HTTPError,
        watch: Watch,
        cancel: CancelToken,
        run: _Run,
        *,
        answered: bool,
    ) -> _Failed:
        if _interrupted(watch, cancel):
            return self._expired(watch, cancel)
        if time.monotonic() >= run.deadline:
            return _Failed(self._timed_out(), retry=False)
        where = self._url
        if isinstance(e, httpx.ConnectTimeout):
            msg = f"could not connect to {where} within {self._config.connect_timeout_s:g} s"
            return _Failed(InferError(InferErrorKind.CONNECT, msg), retry=True)
        if isinstance(e, httpx.ConnectError):
            msg = f"could not connect to {where}: {e} (is llama-server running there?)"
            return _Failed(InferError(InferErrorKind.CONNECT, msg), retry=True)
        if isinstance(e, httpx.TimeoutException):
            msg = (
                f"{where} sent nothing for inference.read_timeout_s = "
                f"{self._config.read_timeout_s:g} s"
            )
            return _Failed(InferError(InferErrorKind.TIMEOUT, msg), retry=not answered)
        if isinstance(e, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
            msg = f"the connection to {where} closed before the answer ended: {e}"
            return _Failed(InferError(InferErrorKind.PROTOCOL, msg), retry=True)
        msg = f"the exchange with {where} failed: {type(e).__name__}: {e}"
        return _Failed(InferError(InferErrorKind.PROTOCOL, msg), retry=False)

    def _http_failure(
        self, response: httpx.Response, watch: Watch, cancel: CancelToken, run: _Run
    ) -> _Failed:
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= MAX_ERROR_BODY:
                    break
        except httpx.HTTPError as e:
            if _interrupted(watch, cancel):
                return self._expired(watch, cancel)
            del e  # a cut error body still says enough with its status
        body = b"".join(chunks)[:MAX_ERROR_BODY].decode("utf-8", errors="replace")
        return _Failed(_server_error(response, body), retry=_retryable_status(response.status_code))


def _drain(stream: Iterator[ServerSentEvent], watch: Watch) -> None:
    """Read to the end after ``[DONE]`` so the connection goes back to the pool.

    llama-server ends the response right after ``[DONE]``; a server that does not is cut
    off by the watchdog after ``_DRAIN_S``. The answer is complete either way.
    """
    watch.deadline = min(watch.deadline, time.monotonic() + _DRAIN_S)
    with contextlib.suppress(httpx.HTTPError):
        for _ in stream:
            break  # more after [DONE]: not worth reading, the connection is dropped


def _runaway(found: Runaway, thought: bool, asm: StreamAssembler, request: ChatRequest,
             sink: Sink, run: _Run) -> StreamAssembler | _Abandoned:
    """The answer (or the reasoning: ``thought``) ran away (``found``): the answer ends
    here, cut; reasoning that ran away before any answer is abandoned, to be asked again
    with thinking off."""
    limit = {"repeat": request.runaway_repeat, "echo": request.runaway_echo}.get(
        found.kind, request.runaway_copy)
    note = found.note("reasoning" if thought else "answer", limit)
    if thought and request.thinking and not asm.answered:
        run.cut = Cut(why=found.kind, note=f"{note}; asked again with thinking off")
        sink(AnswerCut(why=found.kind, note=run.cut.note, tokens=asm.deltas))
        return _Abandoned(asm.reasoning_text(), asm.reasoning_deltas)
    asm.cut_short(found.kind, note)
    sink(AnswerCut(why=found.kind, note=note, tokens=asm.deltas))
    return asm


def _kept(failed: _Failed, sink: Sink) -> StreamAssembler:
    """What streamed before the request ended (its deadline, a broken or failed stream):
    the answer, cut. Raises the error when nothing came, or the request was cancelled."""
    asm, error = failed.partial, failed.error
    if asm is None or not asm.said or error.kind is InferErrorKind.CANCELLED:
        raise error from None
    why = "timeout" if error.kind is InferErrorKind.TIMEOUT else "error"
    note = f"answer cut: {error.message}; what streamed is kept"
    asm.cut_short(why, note)
    sink(AnswerCut(why=why, note=note, tokens=asm.deltas))
    return asm


def _thinking_on(deltas: int) -> InferError:
    return InferError(
        InferErrorKind.PROTOCOL,
        f"the server went on thinking ({deltas} reasoning pieces) with thinking turned off "
        "(the turn's thinking cap is spent); its model may not support turning thinking off: "
        "raise loop.thinking_cap, or use a model that can answer without thinking",
    )


def _server_error(response: httpx.Response, body: str) -> InferError:
    """A non-200 answer as an InferError: the server's own message when its body has one."""
    said = error_object(body).get("message")
    message = str(said) if said else (body.strip()[:300] or response.reason_phrase)
    return InferError(InferErrorKind.HTTP, message, status=response.status_code, body=body)


def _retryable_status(status: int | None) -> bool:
    return status is not None and status >= 500



def _interrupted(watch: Watch, cancel: CancelToken) -> bool:
    """Cancelled, or past its deadline (the watchdog closed the socket): not a failure."""
    return cancel.cancelled or bool(watch.expired)
