"""MCP servers as tool hosts: a ToolProvider that runs an MCP server's tools.

A tool host started with ``--mcp "COMMAND ..."`` or ``--mcp-url URL`` builds one
:class:`McpProvider`. It talks to the server with the official ``mcp`` SDK (stdio for a
command, streamable HTTP for a URL) on an asyncio loop in a thread of its own, so the
host's worker threads can call ``run`` concurrently and block only themselves.

Policy (the server's annotations are hints from a program we did not write, so they only
ever choose the stricter side of MCP's defaults; only loopd's config allows a tool). The
annotations become the ToolSpec's ``needs_approval`` and ``untrusted``, and approval works
as for any other tool (the host answers ``PendingApproval``; the session's rules or the
person decide, actors.approval.gate):

- approval: a tool runs without approval only if it says ``readOnlyHint: true`` and does
  not also say ``destructiveHint: true``. Everything else (no annotations, additive writes
  with ``destructiveHint: false``, destructive tools) needs approval unless a rule
  (``tools.allow``, the rules file) allows it. This is stricter than keying on
  ``destructiveHint`` alone: an additive write (``git_commit``) changes things, like
  loopd's own ``write_file``.
- untrusted: results are untrusted unless the tool says ``openWorldHint: false`` (MCP's
  default is true). ``tools.allow`` never makes results trusted.

Faults: a server that exits, closes the connection or stops answering makes the call
``Failed`` with a message naming the server; the provider starts a new connection (a new
server process for a command) for the next call. A call that times out is cancelled on
the server with MCP's ``notifications/cancelled``; a server that then does not answer a
``tools/list`` probe is treated as hung and replaced.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import shlex
import shutil
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from actors.base.errors import McpError
from actors.base.textcut import cut
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.tools.protocol.wire import Answer, Failed, Result
from actors.wire.tether import tethered

try:
    import anyio
    import mcp_types
    from mcp import Client, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"MCP tool hosts need the MCP SDK ({e}); install it with: pip install 'loopd[mcp]'"
    ) from e

__all__ = ["McpProvider", "describe_content", "policy", "tool_spec"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# How long a hung-looking server gets to answer a tools/list probe after a call timed out.
PROBE_TIMEOUT_S = 5.0
# The stdio SDK's own shutdown is bounded (stdin close 2 s, SIGTERM 2 s, SIGKILL 2 s).
_CLOSE_TIMEOUT_S = 10.0
_MAX_TOOL_PAGES = 100
_CANCEL_POLL_S = 0.1  # how often a waiting call looks at its cancel flag
_END_OF_STREAM = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)


# --- policy and mapping (pure) -----------------------------------------------------------


def policy(annotations: mcp_types.ToolAnnotations | None) -> tuple[bool, bool]:
    """``(needs_approval, untrusted)`` for a tool with these MCP annotations.

    Missing hints take MCP's defaults (readOnly false, destructive true, openWorld true),
    so a tool that says nothing needs approval and returns untrusted results.
    """
    hints = annotations or mcp_types.ToolAnnotations()
    read_only = hints.read_only_hint is True and hints.destructive_hint is not True
    untrusted = hints.open_world_hint is not False
    return not read_only, untrusted


def tool_spec(tool: mcp_types.Tool) -> ToolSpec:
    """The loopd ToolSpec for an MCP tool (approval before ``tools.allow`` is applied)."""
    needs_approval, untrusted = policy(tool.annotations)
    title = tool.title or (tool.annotations.title if tool.annotations else None)
    description = tool.description or title or f"{tool.name} (an MCP tool without a description)"
    return ToolSpec(
        name=tool.name,
        description=description,
        parameters=json.loads(json.dumps(tool.input_schema)),  # plain JSON data for the wire
        result_class=ResultClass.PUBLIC,
        needs_approval=needs_approval,
        untrusted=untrusted,
    )


def _b64_size(data: str) -> int:
    """Decoded size of base64 text, without decoding it."""
    data = data.strip()
    return max(0, len(data) * 3 // 4 - data[-2:].count("="))


def _size(n: int | None) -> str:
    return "size unknown" if n is None else f"{n:,} bytes"


def describe_content(block: Any) -> str:
    """One MCP content block as text: text as is; anything else described, never dropped."""
    kind = getattr(block, "type", type(block).__name__)
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{kind}: {block.mime_type}, {_size(_b64_size(block.data))}; not shown]"
    if isinstance(block, mcp_types.ResourceLink):
        mime = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link: {block.uri} ({block.name}{mime}, {_size(block.size)})]"
    if isinstance(block, mcp_types.EmbeddedResource):
        res = block.resource
        mime = res.mime_type or "type unknown"
        if isinstance(res, mcp_types.TextResourceContents):
            return f"[resource {res.uri} ({mime})]\n{res.text}"
        blob = getattr(res, "blob", "")
        return f"[resource {res.uri}: {mime}, {_size(_b64_size(blob))} of binary data; not shown]"
    return f"[{kind} content; not shown]"


def result_text(result: mcp_types.CallToolResult) -> str:
    """The text of a tool result: its content blocks joined, else its structured content."""
    if result.content:
        return "\n".join(describe_content(b) for b in result.content)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "(the tool returned no content)"


# --- the transport watch -----------------------------------------------------------------


class _WatchedRead:
    """The transport's read stream, setting ``ended`` when the server side is gone.

    The SDK notices a dead server only when a request fails; this lets an idle death
    start a new server before the next call instead of failing it.
    """

    def __init__(self, inner: Any, ended: asyncio.Event) -> None:
        self._inner = inner
        self._ended = ended

    def __getattr__(self, name: str) -> Any:  # last_context and any other extras
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except _END_OF_STREAM:
            self._ended.set()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, *_END_OF_STREAM):
            self._ended.set()
            raise

    async def __aenter__(self) -> _WatchedRead:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._ended.set()
        result: bool | None = await self._inner.__aexit__(exc_type, exc, tb)
        return result


@contextlib.asynccontextmanager
async def _watched(inner: Any, ended: asyncio.Event) -> AsyncIterator[tuple[Any, Any]]:
    try:
        async with inner as (read, write):
            yield _WatchedRead(read, ended), write
    finally:
        ended.set()


class _Connection:
    """One live session with the server (one server process, for a command)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.client: Any = None
        self.stop = asyncio.Event()
        self.ended = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def usable(self) -> bool:
        return self.client is not None and not self.ended.is_set() and not self.stop.is_set()


# --- the provider ------------------------------------------------------------------------


class McpProvider:
    """Runs the tools of one MCP server (a command over stdio, or a streamable-HTTP URL).

    Construction starts the server and lists its tools, raising :class:`McpError` with
    the reason if that fails. ``max_output_bytes`` (``tools.max_output_bytes``) cuts a
    result's text, with a note saying so. Approval is not decided here: the tool host
    answers ``PendingApproval`` for a tool whose spec says ``needs_approval`` before ``run``
    is ever called.
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        url: str | None = None,
        *,
        connect_timeout_s: float = 30.0,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        max_output_bytes: int | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("McpProvider needs exactly one of command (stdio) or url (HTTP)")
        self._command: list[str] | None = None
        if command is not None:
            words = [] if isinstance(command, str) else list(command)
            if not words or not all(isinstance(c, str) for c in words):
                raise ValueError(
                    f"MCP server command {command!r}: must be a non-empty list of strings, "
                    'e.g. ["uvx", "mcp-server-time"]'
                )
            self._command, self.label = words, shlex.join(words)
            if shutil.which(words[0]) is None:
                raise McpError(
                    f"MCP server command {words[0]!r} was not found (not on PATH, not an "
                    "executable file); check the command in [[tools.hosts]] (is it installed?)"
                )
        else:
            assert url is not None
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"MCP server url {url!r}: must start with http:// or https://")
            self.label = _strip_userinfo(url)
        self._restarted = "restarted" if command is not None else "reconnected"
        self._url = url
        self._connect_timeout_s = connect_timeout_s
        self._probe_timeout_s = probe_timeout_s
        self._max_output = max_output_bytes
        self._closed = False
        self._lock = asyncio.Lock()
        self._count = 0
        self._conn: _Connection | None = None
        self._retired: set[asyncio.Task[None]] = set()
        self._probe: asyncio.Task[None] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"mcp {self.label[:40]}", daemon=True
        )
        self._thread.start()
        try:
            listing = self._submit(self._first_listing())
            tools = listing.result(timeout=2 * connect_timeout_s + 5)
        except BaseException as e:
            self.close()
            if isinstance(e, concurrent.futures.TimeoutError):
                raise McpError(
                    f"MCP server {self.label} did not start within {connect_timeout_s:g} s"
                ) from None
            raise
        self._specs = [tool_spec(t) for t in tools]
        self._by_name = {s.name: s for s in self._specs}

    @property
    def connected(self) -> bool:
        """Whether a live session is open (False once the server is gone, until the next call)."""
        conn = self._conn
        return conn is not None and conn.usable

    # --- ToolProvider ---

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def run(
        self, tool: str, arguments: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer:
        """One call; given up early when ``cancel`` is set (the server is told, as on a timeout)."""
        spec = self._by_name.get(tool)
        if spec is None:
            return Failed(message=f"MCP server {self.label} has no tool named {tool!r}")
        if self._closed:
            return Failed(message=f"MCP server {self.label} is closed")
        # Answer a little before the host gives up, so the message is ours and precise.
        own_s = max(0.001, timeout_s - min(0.5, timeout_s * 0.1))
        future = self._submit(self._call(tool, dict(arguments), own_s, timeout_s))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                answer: Answer = future.result(timeout=_CANCEL_POLL_S)
                return answer
            except concurrent.futures.TimeoutError:
                if cancel.is_set():
                    future.cancel()  # the SDK sends notifications/cancelled on the way out
                    return Failed(message=f"the call to {tool} was cancelled")
                if time.monotonic() >= deadline:
                    future.cancel()
                    return Failed(message=self._timeout_message(tool, timeout_s))
            except concurrent.futures.CancelledError:  # close() ended it
                return Failed(message=f"MCP server {self.label} was closed during the call")
            except Exception as e:  # a bug on our side must still answer the call
                log.exception("MCP call %s on %s failed", tool, self.label)
                return Failed(message=f"MCP call {tool} on {self.label} failed: {e!r}")

    def close(self) -> None:
        """Stop the server (the whole process tree, for a command) and the loop thread."""
        if self._closed:
            return
        self._closed = True
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                self._submit(self._shutdown()).result(timeout=_CLOSE_TIMEOUT_S + 2)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> McpProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- inside the loop thread ---

    def _submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _transport(self, ended: asyncio.Event) -> Any:
        if self._command is not None:
            # Tethered, so the server dies with this host even if the host is killed.
            argv = tethered(self._command)
            params = StdioServerParameters(command=argv[0], args=argv[1:])
            return _watched(stdio_client(params), ended)
        assert self._url is not None
        return _watched(streamable_http_client(self._url), ended)

    async def _first_listing(self) -> list[mcp_types.Tool]:
        conn = await self._open(self._connect_timeout_s)
        try:
            return await asyncio.wait_for(self._list_tools(conn), self._connect_timeout_s)
        except Exception as e:
            self._retire(conn)
            raise McpError(f"MCP server {self.label} did not list its tools: {_reason(e)}") from e

    async def _list_tools(self, conn: _Connection) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_TOOL_PAGES):
            page = await conn.client.list_tools(cursor=cursor, cache_mode="bypass")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    async def _open(self, timeout_s: float) -> _Connection:
        """Start the server and finish the MCP handshake, or raise McpError."""
        self._count += 1
        conn = _Connection(self._count)
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        ready.add_done_callback(_retrieved)  # nobody may be waiting any more
        conn.task = asyncio.create_task(self._hold(conn, ready))
        try:
            conn.client = await asyncio.wait_for(asyncio.shield(ready), timeout_s)
        except Exception as e:
            self._retire(conn, cancel=True)
            raise McpError(self._start_failure(e, timeout_s)) from None
        self._conn = conn
        return conn

    async def _hold(self, conn: _Connection, ready: asyncio.Future[Any]) -> None:
        """Own the SDK client for the connection's life (anyio scopes need one task)."""
        try:
            client = Client(
                self._transport(conn.ended),
                cache=None,
                client_info=mcp_types.Implementation(name="loopd", version=_version()),
            )
            async with client:
                if not ready.done():
                    ready.set_result(client)
                await conn.stop.wait()
        except BaseException as e:
            if not ready.done():
                if isinstance(e, Exception):
                    ready.set_exception(e)
                else:
                    ready.cancel()
            elif isinstance(e, Exception):
                log.info("MCP server %s connection %d ended: %r", self.label, conn.number, e)
            if not isinstance(e, Exception):
                raise
        finally:
            conn.ended.set()

    def _retire(self, conn: _Connection, *, cancel: bool = False) -> None:
        """Let a connection wind down in the background (the SDK bounds the shutdown).

        ``cancel`` is for a connection still in its handshake, which does not see ``stop``.
        """
        conn.stop.set()
        if self._conn is conn:
            self._conn = None
        if conn.task is not None and not conn.task.done():
            if cancel:
                conn.task.cancel()
            self._retired.add(conn.task)
            conn.task.add_done_callback(self._retired.discard)

    async def _connection(self, deadline: float) -> _Connection:
        """The live connection, starting a new one if the old one died or hung."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            probe = self._probe
            if probe is not None and not probe.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(probe), max(0.0, deadline - loop.time()))
            conn = self._conn
            if conn is not None and conn.usable:
                return conn
            if conn is not None:
                self._retire(conn)
            if self._closed:
                raise McpError(f"MCP server {self.label} is closed")
            budget = min(self._connect_timeout_s, deadline - loop.time())
            return await self._open(max(0.001, budget))

    async def _call(
        self, tool: str, arguments: dict[str, Any], own_s: float, timeout_s: float
    ) -> Answer:
        """One call within ``own_s``; ``timeout_s`` is the caller's limit, for messages."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + own_s
        try:
            conn = await self._connection(deadline)
        except McpError as e:
            return Failed(message=f"{e}; the call to {tool} did not run")
        remaining = deadline - loop.time()
        if remaining <= 0:
            return Failed(message=self._timeout_message(tool, timeout_s))
        try:
            result = await conn.client.call_tool(tool, arguments, read_timeout_seconds=remaining)
        except MCPError as e:
            if e.code == mcp_types.REQUEST_TIMEOUT:
                self._start_probe(conn)
                return Failed(message=self._timeout_message(tool, timeout_s))
            if e.code == mcp_types.CONNECTION_CLOSED or conn.ended.is_set():
                self._retire(conn)
                return Failed(
                    message=f"MCP server {self.label} exited or closed the connection during "
                    f"the call to {tool}; it is {self._restarted} for the next call",
                )
            return Failed(message=f"MCP server {self.label} refused the call to {tool}: {e}")
        except Exception as e:
            # Not an MCP answer (a transport or protocol fault): start afresh next time.
            self._retire(conn)
            log.info("MCP call %s on %s raised", tool, self.label, exc_info=True)
            return Failed(message=f"MCP call {tool} on {self.label} failed: {_reason(e)}")
        text = result_text(result)
        if result.is_error:
            return Failed(message=text)
        untrusted = self._by_name[tool].untrusted
        return Result(content=self._cut(text), class_=ResultClass.PUBLIC, untrusted=untrusted)

    def _cut(self, text: str) -> str:
        """The text cut at ``max_output_bytes`` (``tools.max_output_bytes``), saying so."""
        if self._max_output is None:
            return text
        shown, size, total = cut(text, self._max_output, "bytes")
        if size == total:
            return text
        return shown + f"\n[cut: showing {size} of {total} bytes of the answer]"

    def _start_probe(self, conn: _Connection) -> None:
        """After a timeout: a server that cannot list its tools either is hung; replace it."""
        if self._probe is not None and not self._probe.done():
            return

        async def probe() -> None:
            try:
                await asyncio.wait_for(self._list_tools(conn), self._probe_timeout_s)
            except Exception as e:
                log.warning(
                    "MCP server %s did not answer after a timed-out call (%s); restarting it",
                    self.label, _reason(e),
                )
                self._retire(conn)

        self._probe = asyncio.create_task(probe())

    async def _shutdown(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._conn is not None:
            self._retire(self._conn)
        tasks = list(self._retired)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT_S)
            for t in pending:
                t.cancel()
        current = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not current]
        for t in others:
            t.cancel()
        if others:
            await asyncio.wait(others, timeout=2)

    # --- messages ---

    def _start_failure(self, e: Exception, timeout_s: float) -> str:
        if isinstance(e, TimeoutError):
            return (
                f"MCP server {self.label} did not finish the MCP handshake within {timeout_s:g} s"
            )
        if isinstance(e, OSError):
            return (
                f"MCP server command {self.label} could not be started: {e}; "
                "check the command in [[tools.hosts]] (is it installed and on PATH?)"
            )
        return (
            f"MCP server {self.label} did not start: {_reason(e)}; "
            "run the command by hand to see its error output"
        )

    def _timeout_message(self, tool: str, timeout_s: float) -> str:
        return (
            f"{tool} on MCP server {self.label} did not answer within {timeout_s:g} s; "
            "the call was cancelled on the server"
        )


# --- helpers ----------------------------------------------------------------------------


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _reason(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_reason(x) for x in e.exceptions)
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _strip_userinfo(url: str) -> str:
    """The url without user:password, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopd")
    except PackageNotFoundError:
        return "0"
