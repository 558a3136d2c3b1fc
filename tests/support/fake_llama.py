"""A fake llama-server on loopback: replays recordings and scripted scenarios over real HTTP.

Tests use it in a thread (``with FakeLlama(script) as fake: ... fake.url``); benchmarks run
it in its own process (``python -m tests.support.fake_llama --port 0 --replay FILE
--cycle`` prints its URL), since a server thread in the bench process would share its GIL.

``script`` is a list of :class:`Reply`, served in order, one per chat request (one more
request gets a 500 "script exhausted"), or a callable ``body -> Reply``. Streams are sent
like llama-server sends them: HTTP/1.1, chunked, one ``data:`` event per chunk, the role
delta on progress chunks, usage and timings at the end, ``[DONE]``.

:func:`answer` also behaves like the server where loopd depends on it: a per-slot prompt
cache (prompt tokens = rendered prompt length // 4; ``cache_n`` = common prefix with the
slot's previous prompt plus what was generated for it, // 4), ``max_tokens`` (finish
"length"), ``enable_thinking: false`` (no reasoning), ``reasoning_budget_tokens`` (reasoning
cut after that many deltas, unless the reply says ``honor_budget=False``) and the
``reasoning_end`` control (``control="honor" | "ignore" | "missing"``). A reply that does
not honour the budget, on a request with ``reasoning_control``, waits (up to 5 s) after
the first delta past the budget for the client's control call, so the race is settled.

``POST /tokenize`` counts a token per 4 characters of ``content``, as the prompts do.
``POST /apply-template`` answers the prompt :func:`render_prompt` makes of the body, and
``POST /completion`` (a raw ``prompt``, not streamed) puts it in its ``id_slot`` like a chat
request does and answers its timings, without a script reply (``prefills`` keeps the
bodies); ``fail_slots("apply-template")`` and ``fail_slots("completion")`` fail them.

Slots like llama-server's (docs/llama-server.md#saving-and-restoring-a-slot): ``GET /props``
(``total_slots``, per-slot ``n_ctx``, ``model_path``, ``build_info``: the ``props``
argument), and with a ``save_dir`` ``POST /slots/{id}?action=save|restore|erase`` writing
and reading real files there (a text format of the fake's own: a header line, then the
slot's cached text). Without a ``save_dir`` the slot actions answer 501 like a server
without ``--slot-save-path``. A test makes any slot action fail with
:meth:`FakeLlama.fail_slots` (an HTTP error, or a restore that answers success but loads
nothing: ``noop``), deterministically.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import random
import select
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from tests.support import recording
from tests.support.watch import HANG_S

__all__ = [
    "Conn",
    "Control",
    "FakeLlama",
    "Reply",
    "after",
    "answer",
    "close_without_response",
    "context_full",
    "cut_stream",
    "endless",
    "hang",
    "http_error",
    "malformed",
    "not_json",
    "render_prompt",
    "replay",
    "stall",
    "stream_error",
    "trickle",
]

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
DONE_EVENT = "[DONE]"
SLOT_FILE_HEADER = b"fake-llama slot v1\n"
DEFAULT_PROPS: dict[str, Any] = {
    "total_slots": 1, "n_ctx": 8192, "model_path": "/models/fake.gguf", "build_info": "b1-fake",
}
CONTROL_PATH = "/v1/chat/completions/control"
CONTROL_WAIT_S = HANG_S  # a hang guard: the control call settles the race when it comes
_POLL_S = 0.02

Control = Literal["honor", "ignore", "missing"]


@dataclasses.dataclass(frozen=True)
class Reply:
    """One scripted answer: ``serve`` writes the whole HTTP response to the connection."""

    name: str
    serve: Callable[[Conn], None]
    honor_budget: bool = True
    control: Control = "honor"


# --- the connection a reply writes to ------------------------------------------------------


class _Stream:
    """A running answer the control endpoint can reach by its chatcmpl id."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.reasoning_end = threading.Event()


class Conn:
    """What a Reply gets: the request body and ways to answer like llama-server."""

    def __init__(self, handler: _Handler, body: dict[str, Any], fake: FakeLlama) -> None:
        self._handler = handler
        self.body = body
        self.fake = fake

    @property
    def stopping(self) -> bool:
        return self.fake.stopping.is_set()

    def head(self, status: int, content_type: str, *, length: int | None = None) -> None:
        h = self._handler
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        if length is None:
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Content-Length", str(length))
        h.end_headers()

    def chunk(self, data: bytes) -> None:
        if data:
            self._handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end(self) -> None:
        self._handler.wfile.write(b"0\r\n\r\n")

    def event(self, obj: Any) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
        self.chunk(b"data: " + data.encode() + b"\n\n")

    def json(self, status: int, obj: Any) -> None:
        data = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
        kind = "application/json; charset=utf-8" if not isinstance(obj, str) else "text/plain"
        self.head(status, kind, length=len(data))
        self._handler.wfile.write(data)

    def abort(self) -> None:
        """Close the connection at once, mid-whatever (no terminating chunk)."""
        self._handler.close_connection = True
        with contextlib.suppress(OSError):
            self._handler.connection.shutdown(socket.SHUT_RDWR)

    def client_gone(self, wait: float = 0.0) -> bool:
        """True when the client closed its side (checked for up to ``wait`` seconds)."""
        sock = self._handler.connection
        try:
            readable, _, _ = select.select([sock], [], [], wait)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def wait_until_gone(self) -> None:
        while not self.stopping and not self.client_gone(_POLL_S):
            pass


# --- the server -------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Small writes go out at once (as llama-server's do); without this, Nagle plus the
        # client's delayed ACK add ~40 ms to every answer on a kept-alive connection.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.fake._track(self.connection, add=True)
        with self.server.fake._lock:
            self.server.fake.connections += 1

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.fake._track(self.connection, add=False)

    def do_GET(self) -> None:
        conn = Conn(self, {}, self.server.fake)
        if self.path in ("/health", "/v1/health"):
            conn.json(200, {"status": "ok"})
        elif self.path == "/props":
            conn.json(200, self.server.fake._props_body())
        else:
            conn.json(404, _error(404, "File Not Found", "not_found_error"))

    def do_POST(self) -> None:
        fake = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as e:
            err = _error(400, f"bad JSON body: {e}", "invalid_request_error")
            Conn(self, {}, fake).json(400, err)
            return
        conn = Conn(self, body, fake)
        try:
            if self.path in CHAT_PATHS:
                fake._chat(conn, dict(self.headers))
            elif self.path == CONTROL_PATH:
                fake._control(conn)
            elif self.path == "/tokenize":  # the fake's tokens: 4 characters each
                conn.json(200, {"tokens": list(range(len(str(body.get("content", ""))) // 4))})
            elif self.path.startswith("/slots/"):
                fake._slot_action(conn, self.path)
            elif self.path == "/apply-template":
                fake._apply_template(conn)
            elif self.path == "/completion":
                fake._completion(conn)
            else:
                conn.json(404, _error(404, "File Not Found", "not_found_error"))
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client went away mid-answer: fine

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], fake: FakeLlama) -> None:
        self.fake = fake
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that went away (reset, broken pipe): normal for these tests
        super().handle_error(request, client_address)


class FakeLlama:
    """A llama-server stand-in on 127.0.0.1; a context manager. ``url`` once started."""

    def __init__(
        self, script: Sequence[Reply] | Callable[[dict[str, Any]], Reply], *, port: int = 0,
        props: dict[str, Any] | None = None, save_dir: Path | None = None,
    ) -> None:
        self.props = {**DEFAULT_PROPS, **(props or {})}
        self.save_dir = save_dir
        self.slot_calls: list[tuple[str, int, str]] = []  # (action, slot, filename) in order
        self.slot_gate = threading.Event()  # slot actions wait while it is clear
        self.slot_gate.set()
        self._slot_faults: dict[str, list[tuple[int, str] | None]] = {}
        self._script: Callable[[dict[str, Any]], Reply] | None = None
        self._replies: list[Reply] = []
        if callable(script):
            self._script = script
        else:
            self._replies = list(script)
        self._served = 0
        self.requests: list[dict[str, Any]] = []  # chat request bodies, in order
        self.headers: list[dict[str, str]] = []  # their HTTP headers
        self.control_calls: list[dict[str, Any]] = []
        self.prefills: list[dict[str, Any]] = []  # POST /completion bodies, in order
        self.renders = 0  # POST /apply-template calls
        self.connections = 0  # TCP connections accepted
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._slots: dict[int, str] = {}  # id_slot -> cached text (prompt + generated)
        self._streams: dict[str, _Stream] = {}
        self._conns: set[socket.socket] = set()
        self._server = _Server(("127.0.0.1", port), self)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeLlama:
        # close() waits for the serving loop to look at its stop flag, once a poll: at 50 ms
        # that was 25 ms idle a fake on average (5 s of the extension property's 200
        # examples); at 5 ms an idle fake costs 0.5 % of a core
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.005},
            name="fake-llama", daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=HANG_S)
        with self._lock:
            conns = list(self._conns)
        for c in conns:  # wake handlers blocked on idle keep-alive connections
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._server.server_close()

    def __enter__(self) -> FakeLlama:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- handlers -----------------------------------------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def _next(self, body: dict[str, Any]) -> Reply | None:
        with self._lock:
            number = self._served = self._served + 1
            if self._script is not None:
                return self._script(body)
            if number <= len(self._replies):
                return self._replies[number - 1]
            return None

    def _chat(self, conn: Conn, headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append(conn.body)
            self.headers.append(headers)
        reply = self._next(conn.body)
        if reply is None:
            message = (
                f"fake llama-server: script exhausted: {len(self._replies)} replies were "
                f"scripted and this is chat request {len(self.requests)}"
            )
            conn.json(500, _error(500, message, "server_error"))
            return
        reply.serve(conn)

    def _control(self, conn: Conn) -> None:
        with self._lock:
            stream = self._streams.get(str(conn.body.get("id")))
        known = stream is not None and stream.reply.control != "missing"
        good = conn.body.get("action") == "reasoning_end"
        if stream is not None and known and good and stream.reply.control == "honor":
            stream.reasoning_end.set()  # before the call is seen, so a waiting stream stops
        with self._lock:
            self.control_calls.append(conn.body)
        if not known:
            conn.json(404, _error(404, "File Not Found", "not_found_error"))
        elif not good:
            conn.json(400, _error(400, "unknown action", "invalid_request_error"))
        else:
            conn.json(200, {"success": True})

    # --- slots -------------------------------------------------------------------------

    def fail_slots(self, action: str, status: int = 500, message: str = "slot action failed",
                   *, times: int = 1) -> None:
        """The next ``times`` calls of ``action`` fail with ``status``; status 0 makes a
        restore answer success while loading nothing (a restore that does not take)."""
        with self._lock:
            self._slot_faults.setdefault(action, []).extend([(status, message)] * times)

    def _props_body(self) -> dict[str, Any]:
        p = self.props
        return {
            "default_generation_settings": {"n_ctx": p["n_ctx"], "params": {}},
            "total_slots": p["total_slots"], "model_path": p["model_path"],
            "build_info": p["build_info"],
        }

    def _slot_action(self, conn: Conn, path: str) -> None:
        parts = urlsplit(path)
        action = (parse_qs(parts.query).get("action") or [""])[0]
        try:
            slot = int(parts.path.rsplit("/", 1)[1])
        except ValueError:
            conn.json(400, _error(400, "Invalid id_slot", "invalid_request_error"))
            return
        filename = str(conn.body.get("filename", ""))
        with self._lock:
            self.slot_calls.append((action, slot, filename))  # seen, even while held below
        while not self.slot_gate.wait(_POLL_S):  # a slow save or restore, held by the test
            if conn.stopping:
                return
        with self._lock:
            faults = self._slot_faults.get(action) or []
            fault = faults.pop(0) if faults else None
        if self.save_dir is None:
            message = "This server does not support slots action. Start it with `--slot-save-path`"
            conn.json(501, _error(501, message, "not_supported_error"))
            return
        if action not in ("save", "restore", "erase"):
            conn.json(400, _error(400, "Invalid action", "invalid_request_error"))
            return
        if fault is not None and fault[0] != 0:
            conn.json(fault[0], _error(fault[0], fault[1], "server_error" if fault[0] >= 500
                                       else "invalid_request_error"))
            return
        if action != "erase" and (not filename or "/" in filename or filename.startswith(".")):
            conn.json(400, _error(400, "Invalid filename", "invalid_request_error"))
            return
        target = self.save_dir / filename
        if action == "save":
            with self._lock:
                text = self._slots.get(slot, "")
            data = SLOT_FILE_HEADER + text.encode()
            target.write_bytes(data)
            conn.json(200, {"id_slot": slot, "filename": filename, "n_saved": len(text) // 4,
                            "n_written": len(data), "timings": {"save_ms": 0.5}})
        elif action == "restore":
            try:
                data = target.read_bytes()
                if not data.startswith(SLOT_FILE_HEADER):
                    raise ValueError("not a slot file")
                text = data[len(SLOT_FILE_HEADER):].decode()
            except (OSError, ValueError):
                with self._lock:
                    self._slots.pop(slot, None)  # a failed restore clears the slot
                message = ("Unable to restore slot: No available space in KV cache or invalid "
                           "slot save file")
                conn.json(400, _error(400, message, "invalid_request_error"))
                return
            with self._lock:
                if fault is None:  # status 0: answers success, loads nothing
                    self._slots[slot] = text
                else:
                    self._slots.pop(slot, None)
            conn.json(200, {"id_slot": slot, "filename": filename, "n_restored": len(text) // 4,
                            "n_read": len(data), "timings": {"restore_ms": 0.25}})
        else:
            with self._lock:
                text = self._slots.pop(slot, "")
            conn.json(200, {"id_slot": slot, "n_erased": len(text) // 4})

    def _fault(self, action: str) -> tuple[int, str] | None:
        with self._lock:
            faults = self._slot_faults.get(action) or []
            return faults.pop(0) if faults else None

    def _apply_template(self, conn: Conn) -> None:
        with self._lock:
            self.renders += 1
        fault = self._fault("apply-template")
        if fault is not None:
            conn.json(fault[0], _error(fault[0], fault[1], "server_error"))
            return
        conn.json(200, {"prompt": render_prompt(conn.body)})

    def _completion(self, conn: Conn) -> None:
        with self._lock:
            self.prefills.append(conn.body)
        fault = self._fault("completion")
        if fault is not None:
            conn.json(fault[0], _error(fault[0], fault[1], "server_error"))
            return
        prompt = str(conn.body.get("prompt", ""))
        slot_field = conn.body.get("id_slot")
        slot = slot_field if isinstance(slot_field, int) else -1
        total = len(prompt) // 4
        cache = min(self._cache(slot, prompt) // 4, max(0, total - 1))
        conn.json(200, {"content": "", "tokens_evaluated": total, "timings": {
            "cache_n": cache, "prompt_n": total - cache, "prompt_ms": 1.0,
            "predicted_n": 1, "predicted_ms": 1.0}})

    def slot_text(self, slot: int) -> str:
        """What slot ``slot`` holds now (its cached text)."""
        with self._lock:
            return self._slots.get(slot, "")

    def _register(self, chat_id: str, reply: Reply) -> _Stream:
        stream = _Stream(reply)
        with self._lock:
            self._streams[chat_id] = stream
        return stream

    def _cache(self, slot: int, prompt: str) -> int:
        """Characters of ``prompt`` the slot already holds (and makes it hold ``prompt``)."""
        with self._lock:
            held = self._slots.get(slot, "")
            self._slots[slot] = prompt
        n = 0
        for a, b in zip(held, prompt, strict=False):
            if a != b:
                break
            n += 1
        return n

    def _generated(self, slot: int, text: str) -> None:
        with self._lock:
            self._slots[slot] = self._slots.get(slot, "") + text


# --- prompt rendering (the fake's "chat template") -------------------------------------------


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _render_calls(calls: Iterable[tuple[str, str]]) -> str:
    return "".join(f"<tool_call>{name}{args}</tool_call>" for name, args in calls)


def _render_turn(
    reasoning: str | None, content: str | None, calls: Iterable[tuple[str, str]]
) -> str:
    think = f"<think>{reasoning}</think>" if reasoning else ""
    return f"{think}{content or ''}{_render_calls(calls)}<|end|>"


def render_prompt(body: dict[str, Any]) -> str:
    """The text the fake "evaluates": tools, then each message, then the assistant cue.

    An assistant message renders exactly as the fake appended its generation to the slot,
    so a conversation that only grows is a full cache hit, like on a real server.
    """
    out = [f"<tools>{_canon(body.get('tools') or [])}</tools>"]
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            out.append(_canon(m))
            continue
        role = m.get("role")
        if role == "assistant":
            calls = []
            for c in m.get("tool_calls") or []:
                fn = (c.get("function") or {}) if isinstance(c, dict) else {}
                calls.append((str(fn.get("name")), str(fn.get("arguments"))))
            turn = _render_turn(m.get("reasoning_content"), m.get("content"), calls)
            out.append(f"<|assistant|>{turn}")
        else:
            extra = {k: v for k, v in m.items() if k not in ("role", "content")}
            content = m.get("content")
            text = content if isinstance(content, str) else _canon(content)
            out.append(f"<|{role}|>{_canon(extra) if extra else ''}{text}<|end|>")
    out.append("<|assistant|>")
    return "".join(out)


# --- replies ------------------------------------------------------------------------------


def _error(code: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": kind}}


def _chat_id() -> str:
    return "chatcmpl-" + "".join(random.choices(string.ascii_letters + string.digits, k=32))


def _call_id() -> str:
    return "".join(random.choices(string.ascii_letters + string.digits, k=32))


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def _normal_calls(tool_calls: Iterable[Sequence[str]]) -> list[tuple[str, str, str]]:
    calls = []
    for c in tool_calls:
        if len(c) == 2:
            calls.append((_call_id(), c[0], c[1]))
        elif len(c) == 3:
            calls.append((c[0], c[1], c[2]))
        else:
            raise ValueError(f"a tool call is (name, arguments) or (id, name, arguments): {c!r}")
    return calls


def _answer_events(
    conn: Conn,
    reply: Reply,
    *,
    content: str | None,
    reasoning: str | None,
    tool_calls: list[tuple[str, str, str]],
    finish_reason: str | None,
    chunk: int,
    usage: dict[str, Any] | None,
    timings: dict[str, Any] | None,
) -> Iterator[dict[str, Any] | str]:
    """The events of one answer, made lazily so a control call can still change them."""
    body = conn.body
    fake = conn.fake
    chat_id = _chat_id()
    stream = fake._register(chat_id, reply)
    base = {"created": int(time.time()), "id": chat_id, "model": "fake-llama",
            "system_fingerprint": "fake", "object": "chat.completion.chunk"}

    def chunk_of(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], **base}

    slot_field = body.get("id_slot")
    slot = slot_field if isinstance(slot_field, int) else -1
    prompt = render_prompt(body)
    total = len(prompt) // 4
    cached = fake._cache(slot, prompt)  # the slot holds the prompt either way
    if body.get("cache_prompt", True) is False:  # and processes it all
        cached = 0
    cache = min(cached // 4, max(0, total - 1))
    role = {"role": "assistant", "content": None}
    if body.get("return_progress"):
        for processed in (cache, total):
            yield {**chunk_of(role), "prompt_progress": {
                "total": total, "cache": cache, "processed": processed, "time_ms": 0}}
    yield chunk_of(role)

    max_tokens = body.get("max_tokens")
    limit = max_tokens if isinstance(max_tokens, int) and max_tokens >= 0 else None
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = kwargs.get("enable_thinking", True) is not False
    budget = body.get("reasoning_budget_tokens")
    budget = budget if isinstance(budget, int) and budget >= 0 else None
    n = 0
    cut = False
    said_reasoning: list[str] = []
    said_content: list[str] = []
    if thinking and reasoning:
        for i, piece in enumerate(_pieces(reasoning, chunk)):
            over = budget is not None and reply.honor_budget and i >= budget
            if over or stream.reasoning_end.is_set():
                break
            if limit is not None and n >= limit:
                cut = True
                break
            yield chunk_of({"reasoning_content": piece})
            said_reasoning.append(piece)
            n += 1
            if (budget is not None and not reply.honor_budget and body.get("reasoning_control")
                    and i == budget):
                _wait_for_control(fake, chat_id)  # settle the race with the client
    said_calls: list[tuple[str, str]] = []
    if not cut and content:
        for piece in _pieces(content, chunk):
            if limit is not None and n >= limit:
                cut = True
                break
            yield chunk_of({"content": piece})
            said_content.append(piece)
            n += 1
    for index, (call_id, name, args) in enumerate(tool_calls):
        if cut:
            break
        parts = [args[:1], *_pieces(args[1:], chunk)] if args else [""]
        sent = []
        for j, part in enumerate(parts):
            if limit is not None and n >= limit:
                cut = True
                break
            fn: dict[str, Any] = {"arguments": part}
            frag: dict[str, Any] = {"index": index, "function": fn}
            if j == 0:
                frag.update(id=call_id, type="function")
                fn["name"] = name
            yield chunk_of({"tool_calls": [frag]})
            sent.append(part)
            n += 1
        said_calls.append((name, "".join(sent)))
    finish = "length" if cut else finish_reason or ("tool_calls" if tool_calls else "stop")
    fake._generated(slot, _render_turn("".join(said_reasoning), "".join(said_content), said_calls))
    completion_tokens = n + (0 if cut else 1)  # the EOS token counts
    real_usage = usage if usage is not None else {
        "completion_tokens": completion_tokens, "prompt_tokens": total,
        "total_tokens": total + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cache},
    }
    real_timings = timings if timings is not None else {
        "cache_n": cache, "prompt_n": total - cache, "prompt_ms": 1.0,
        "prompt_per_token_ms": 0.01, "prompt_per_second": 100000.0,
        "predicted_n": completion_tokens, "predicted_ms": 1.0,
        "predicted_per_token_ms": 0.01, "predicted_per_second": 100000.0,
    }
    include_usage = (body.get("stream_options") or {}).get("include_usage") is True
    last = chunk_of({}, finish)
    if include_usage:
        yield last
        yield {"choices": [], **base, "usage": real_usage, "timings": real_timings}
    else:
        yield {**last, "timings": real_timings}
    yield "[DONE]"


def _wait_for_control(fake: FakeLlama, chat_id: str) -> None:
    """Wait (up to CONTROL_WAIT_S) until the client's control call for ``chat_id`` came."""
    deadline = time.monotonic() + CONTROL_WAIT_S
    while time.monotonic() < deadline:
        with fake._lock:
            if any(c.get("id") == chat_id for c in fake.control_calls):
                return
        time.sleep(_POLL_S)


def _send_events(conn: Conn, events: Iterator[dict[str, Any] | str], *,
                 limit: int | None = None, then: Callable[[Conn], None] | None = None) -> None:
    """Stream ``events`` (at most ``limit``); then ``then`` ends it, else the chunked end."""
    conn.head(200, "text/event-stream")
    for i, ev in enumerate(events):
        if limit is not None and i >= limit:
            break
        conn.event(ev)
    if then is not None:
        then(conn)
    else:
        conn.end()


def answer(
    content: str | None = None,
    reasoning: str | None = None,
    tool_calls: Iterable[Sequence[str]] = (),
    finish_reason: str | None = None,
    *,
    chunk: int = 4,
    usage: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
    honor_budget: bool = True,
    control: Control = "honor",
) -> Reply:
    """A streamed answer: progress, reasoning, content, tool-call fragments, usage, [DONE]."""
    calls = _normal_calls(tool_calls)

    def serve(conn: Conn) -> None:
        _send_events(conn, _answer_events(
            conn, reply, content=content, reasoning=reasoning, tool_calls=calls,
            finish_reason=finish_reason, chunk=chunk, usage=usage, timings=timings,
        ))

    reply = Reply("answer", serve, honor_budget=honor_budget, control=control)
    return reply


_DEFAULT_TEXT = "The files are notes.txt, plan.md and src/."


def _partial(after_events: int, then: Callable[[Conn], None], name: str) -> Reply:
    def serve(conn: Conn) -> None:
        events = _answer_events(
            conn, reply, content=_DEFAULT_TEXT, reasoning=None, tool_calls=[],
            finish_reason=None, chunk=4, usage=None, timings=None,
        )
        _send_events(conn, events, limit=after_events, then=then)

    reply = Reply(name, serve)
    return reply


def cut_stream(after_events: int) -> Reply:
    """``after_events`` events of an answer, then the connection closes (no [DONE])."""
    return _partial(after_events, lambda c: c.abort(), "cut_stream")


def stall(after_events: int) -> Reply:
    """``after_events`` events of an answer, then nothing until the client goes (a server
    that stops sending mid-answer): a turn waits here until it is cancelled."""

    def then(conn: Conn) -> None:
        conn.wait_until_gone()
        conn.abort()

    return _partial(after_events, then, "stall")


def stream_error(
    after_events: int,
    message: str = "The model produced output that does not match the expected peg-native format",
) -> Reply:
    """Events, then ``data: {"error": ...}`` inside the 200 stream, then its end (no [DONE])."""

    def then(conn: Conn) -> None:
        conn.event(_error(500, message, "server_error"))
        conn.end()

    return _partial(after_events, then, "stream_error")


def malformed(after_events: int = 2, line: str = "data: {\"choices\": [oops\n\n") -> Reply:
    """Events, then a raw line that is not a valid chunk, then the answer goes on."""

    def serve(conn: Conn) -> None:
        events = _answer_events(
            conn, reply, content=_DEFAULT_TEXT, reasoning=None, tool_calls=[],
            finish_reason=None, chunk=4, usage=None, timings=None,
        )
        conn.head(200, "text/event-stream")
        for i, ev in enumerate(events):
            if i == after_events:
                conn.chunk(line.encode())
            conn.event(ev)
        conn.end()

    reply = Reply("malformed", serve)
    return reply


def not_json(body: str = "<html><body>It works!</body></html>",
             content_type: str = "text/html") -> Reply:
    """A 200 that is not an event stream (inference.url pointing at some other server)."""

    def serve(conn: Conn) -> None:
        data = body.encode()
        conn.head(200, content_type, length=len(data))
        conn._handler.wfile.write(data)

    return Reply("not_json", serve)


@dataclasses.dataclass
class Runaway:
    """What an :func:`endless` answer did: the chunks it sent, and whether it saw the
    client go (the stream closed: a real server stops generating then)."""

    sent: int = 0
    gone: threading.Event = dataclasses.field(default_factory=threading.Event)


def endless(text: str | Callable[[dict[str, Any]], str], *, chunk: int = 4,
            reasoning: bool = False, runaway: Runaway | None = None,
            most: int = 100_000) -> Reply:
    """A model that runs away: ``text`` (or ``text(body)``: e.g. the request's last user
    message, copied back) streamed again and again, ``chunk`` characters a chunk, as
    content (or reasoning), until the client goes (at most ``most`` chunks, then [DONE]).
    ``runaway`` records what it sent and that the client went."""
    seen = runaway or Runaway()

    def serve(conn: Conn) -> None:
        said = text(conn.body) if callable(text) else text
        total = len(render_prompt(conn.body)) // 4
        base = {"id": _chat_id(), "object": "chat.completion.chunk", "model": "fake-llama"}
        conn.head(200, "text/event-stream")
        conn.event({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}],
                    "prompt_progress": {"total": total, "cache": 0, "processed": total}})
        key = "reasoning_content" if reasoning else "content"
        for piece in itertools.islice(itertools.cycle(_pieces(said, chunk)), most):
            try:
                if conn.stopping or conn.client_gone():
                    raise ConnectionResetError
                conn.event({**base, "choices": [{"index": 0, "delta": {key: piece}}]})
            except OSError:  # the client closed the stream (a write may be what sees it)
                seen.gone.set()
                conn.abort()
                return
            seen.sent += 1
        conn.event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        conn.event(DONE_EVENT)
        conn.end()

    return Reply("endless", serve)


def http_error(status: int, body: dict[str, Any] | str) -> Reply:
    """A plain HTTP error, as llama-server sends before any SSE."""
    return Reply(f"http_{status}", lambda conn: conn.json(status, body))


def context_full(n_prompt_tokens: int = 9000, n_ctx: int = 8192) -> Reply:
    """llama-server's 400 ``exceed_context_size_error``."""
    err = _error(
        400,
        f"request ({n_prompt_tokens} tokens) exceeds the available context size "
        f"({n_ctx} tokens), try increasing it",
        "exceed_context_size_error",
    )
    err["error"].update(n_prompt_tokens=n_prompt_tokens, n_ctx=n_ctx)
    return http_error(400, err)


def close_without_response() -> Reply:
    """The request is read, then the connection closes with not one byte sent."""
    return Reply("close_without_response", lambda conn: conn.abort())


def trickle(interval_s: float) -> Reply:
    """200 and keep-alive comments every ``interval_s``, forever (until the client goes)."""

    def serve(conn: Conn) -> None:
        conn.head(200, "text/event-stream")
        while not conn.stopping:
            conn.chunk(b":\n\n")
            if conn.client_gone(interval_s):
                return
        conn.abort()

    return Reply("trickle", serve)


def hang() -> Reply:
    """The request is read and nothing is ever sent (a server queueing the request)."""

    def serve(conn: Conn) -> None:
        conn.wait_until_gone()
        conn.abort()

    return Reply("hang", serve)


def after(gate: threading.Event, reply: Reply) -> Reply:
    """``reply``, once ``gate`` is set (headers withheld until then, like a busy slot)."""

    def serve(conn: Conn) -> None:
        while not gate.wait(_POLL_S):
            if conn.stopping or conn.client_gone():
                conn.abort()
                return
        reply.serve(conn)

    return Reply(f"after_{reply.name}", serve, reply.honor_budget, reply.control)


def _recorded(response: recording.Response) -> Reply:
    def serve(conn: Conn) -> None:
        kind = response.content_type or "application/octet-stream"
        if "text/event-stream" not in kind:
            conn.head(response.status, kind, length=len(response.body))
            conn._handler.wfile.write(response.body)
            return
        conn.head(response.status, kind)
        for event in _split_events(response.body):
            conn.chunk(event)
        conn.end()

    return Reply(f"recorded_{response.status}", serve)


def _split_events(body: bytes) -> list[bytes]:
    """The body cut after each blank line: one SSE event per chunk, as the server wrote it."""
    parts = body.split(b"\n\n")
    out = [p + b"\n\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def replay(path: str | Path) -> list[Reply]:
    """The responses of a .http recording, in order, sent as recorded."""
    return [_recorded(ex.response) for ex in recording.load(path)]


# --- its own process (benchmarks) ------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def in_process(module: str, *args: str, cpus: set[int] | None = None) -> Iterator[str]:
    """``python -m module --port 0 *args`` (a fake that ends in ``serve_until_term``); yields
    its URL and stops it (SIGTERM, then SIGKILL) on exit. ``cpus``: where it may run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", "0", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    if cpus is not None:  # before it starts any thread (Python takes far longer to start)
        os.sched_setaffinity(proc.pid, cpus)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"the fake llama-server ({module}) did not start (printed {url!r})")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def serve_until_term(fake: FakeLlama) -> int:
    """Serve ``fake``, its URL on the first line of stdout, until SIGTERM or Ctrl-C."""
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with fake:
        print(fake.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--replay", nargs="+", required=True, metavar="FILE")
    parser.add_argument("--cycle", action="store_true", help="serve the replies again and again")
    args = parser.parse_args(argv)
    replies = [r for f in args.replay for r in replay(f)]
    if args.cycle:
        ring = itertools.cycle(replies)
        lock = threading.Lock()

        def script(body: dict[str, Any]) -> Reply:
            with lock:
                return next(ring)

        return serve_until_term(FakeLlama(script, port=args.port))
    return serve_until_term(FakeLlama(replies, port=args.port))


if __name__ == "__main__":
    sys.exit(main())
