"""The life of one MCP server connection, on the provider's asyncio loop.

:class:`McpLink` starts the server (a command over stdio, through :func:`tethered`, so it
dies with the host even if the host is killed; or a streamable-HTTP url), finishes the MCP
handshake, and keeps one live connection. A server that exits, closes the connection or
stops answering makes the call ``Failed`` with a message naming it; the next call starts a
new connection (a new server process for a command). A call that times out is cancelled on
the server with MCP's ``notifications/cancelled``; a server that then does not answer a
``tools/list`` probe is treated as hung and replaced. Every method runs on the loop thread
(:class:`~actors.tools.providers.asyncloop.LoopThread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from actors.base.errors import McpError
from actors.base.processes.tether import tethered
from actors.tools.protocol.provider import Asker, Reporter
from actors.tools.protocol.wire import Answer, Failed, Result
from actors.tools.providers.mcp_auth import Authorizer, elicitation_answer, http_auth
from actors.tools.providers.mcp_mapping import (
    answer_of,
    cut_text,
    describe_content,
    reason,
    timeout_message,
)
from actors.tools.providers.mcp_settings import ElicitationMode, McpAuth

try:
    import anyio
    import httpx2
    import mcp_types
    from mcp import Client, StdioServerParameters, stdio_client
    from mcp.client.session import ClientRequestContext
    from mcp.client.streamable_http import streamable_http_client
    from mcp.client.subscriptions import ListenNotSupportedError
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"MCP tool hosts need the MCP SDK ({e}); install it with: pip install 'loopd[mcp]'"
    ) from e

__all__ = ["PROBE_TIMEOUT_S", "McpLink"]

log = logging.getLogger("loopd.mcp")

# How long a hung-looking server gets to answer a tools/list probe after a call timed out.
PROBE_TIMEOUT_S = 5.0
# The stdio SDK's own shutdown is bounded (stdin close 2 s, SIGTERM 2 s, SIGKILL 2 s).
CLOSE_TIMEOUT_S = 10.0
_MAX_TOOL_PAGES = 100
_MAX_RESOURCE_PAGES = 10
_END_OF_STREAM = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)


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


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """An HTTP error status the server answered with (what a 401 says is lost in the SDK)."""

    status: int
    phrase: str
    challenge: str  # its WWW-Authenticate header, "" when none

    def advice(self, label: str) -> str:
        """Why the server refused, and what to change in the config."""
        said = f"MCP server {label} answered HTTP {self.status} {self.phrase}".rstrip()
        if self.challenge:
            said += f" (WWW-Authenticate: {self.challenge[:200]})"
        if self.status in (401, 403):
            return (
                f"{said}: it wants authorization loopd did not give or it did not accept; "
                'give it in this [[tools.hosts]] entry: bearer = "env:NAME" (or "file:PATH"), '
                'headers = ["Name: env:NAME"], or oauth = "authorization_code" '
                "(docs/tools.md, MCP servers)"
            )
        return f"{said}; check url in [[tools.hosts]]: is it the server's MCP endpoint?"


_OAUTH_LOG = logging.getLogger("mcp.client.auth")


class _LastError(logging.Handler):
    """Keeps the exception of the last error the SDK's OAuth client logged."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: BaseException | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.last = record.exc_info[1]


@contextlib.asynccontextmanager
async def _http(
    url: str, headers: dict[str, str], auth: httpx2.Auth | None,
    on_refusal: Callable[[Refusal | None], None],
) -> AsyncIterator[tuple[Any, Any]]:
    """The streamable-HTTP transport on a client of our own: headers, auth, and a note of
    each refusal (the SDK turns a 401 into "Server returned an error response")."""

    endpoint = httpx2.URL(url)

    async def note(response: httpx2.Response) -> None:
        # only the endpoint's own answers: OAuth discovery meets 404s on its way
        if response.request.url != endpoint:
            return
        if response.status_code >= 400:
            on_refusal(Refusal(response.status_code, response.reason_phrase,
                               response.headers.get("www-authenticate", "")))
        else:  # the 401 before an OAuth flow that then succeeded is no longer the story
            on_refusal(None)

    client = create_mcp_http_client(headers=headers or None, auth=auth)
    client.event_hooks = {"request": [], "response": [note]}
    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams


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
        self.watch: asyncio.Task[None] | None = None  # tools/list_changed

    @property
    def usable(self) -> bool:
        return self.client is not None and not self.ended.is_set() and not self.stop.is_set()


# --- the link ------------------------------------------------------------------------------


class McpLink:
    """One MCP server's connections: the live one, and those winding down.

    ``label`` names the server in messages; ``closed`` is set by the provider when it
    closes (no new connection is opened after that).
    """

    def __init__(
        self, label: str, *, command: Sequence[str] | None = None, url: str | None = None,
        connect_timeout_s: float, probe_timeout_s: float,
        auth: McpAuth | None = None, elicitation: ElicitationMode = "ask",
        on_authorize: Callable[[str], None] = lambda _url: None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.label = label
        self._env = dict(env) if env else None  # over the SDK's default environment
        self.refusal: Refusal | None = None  # the last HTTP error status, for messages
        self._auth_spec = auth or McpAuth()
        self._headers = self._auth_spec.header_values(label) if url is not None else {}
        self._auth: httpx2.Auth | None = None
        self._authorizer: Authorizer | None = None
        self._prepared = False
        self._on_authorize = on_authorize
        # The tools the server lists after it said they changed (on the loop thread).
        self.on_tools: Callable[[list[mcp_types.Tool]], None] = lambda _tools: None
        self._elicitation: ElicitationMode = elicitation
        # Who can answer a question now: the askers of the calls in flight (loop thread).
        self._askers: list[Asker] = []
        # The SDK logs why an OAuth flow failed, then the request goes on to its 401.
        self._oauth_errors = _LastError()
        self.restarted = "restarted" if command is not None else "reconnected"
        self.closed = False
        self._command = list(command) if command is not None else None
        self._url = url
        self._connect_timeout_s = connect_timeout_s
        self._probe_timeout_s = probe_timeout_s
        self._lock = asyncio.Lock()
        self._count = 0
        self._conn: _Connection | None = None
        self._retired: set[asyncio.Task[None]] = set()
        self._probe: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        """Whether a live session is open (False once the server is gone, until the next call)."""
        conn = self._conn
        return conn is not None and conn.usable

    @property
    def protocol_version(self) -> str:
        """The MCP version the live session speaks ("" when none is open): the SDK negotiates
        the 2026-07-28 stateless wire where the server speaks it, an older one otherwise."""
        conn = self._conn
        return str(conn.client.protocol_version) if conn is not None and conn.usable else ""

    def _transport(self, ended: asyncio.Event) -> Any:
        if self._command is not None:
            # Tethered, so the server dies with this host even if the host is killed.
            argv = tethered(self._command)
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=self._env)
            return _watched(stdio_client(params), ended)
        assert self._url is not None
        return _watched(_http(self._url, self._headers, self._auth, self._refused), ended)

    def _refused(self, refusal: Refusal | None) -> None:
        self.refusal = refusal

    async def _prepare(self) -> None:
        """The OAuth client (and its loopback listener), once, kept across reconnections."""
        if self._prepared or self._url is None:
            return
        self._auth, self._authorizer = await http_auth(
            self._auth_spec, self._url, self.label, self._on_authorize
        )
        if self._auth is not None:
            _OAUTH_LOG.addHandler(self._oauth_errors)
        self._prepared = True

    async def _elicit(
        self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """Ask the person through the latest call in flight that can ask (the SDK does not
        say which call a question belongs to); nobody: ``tools.elicitation`` answers."""
        if not self._askers or not isinstance(params, mcp_types.ElicitRequestFormParams):
            return elicitation_answer(self._elicitation, params, self.label)
        asker = self._askers[-1]
        action, content = await asyncio.to_thread(asker, self.label, params.message,
                                                  params.requested_schema)
        log.info("MCP server %s asked %r: the person answered %s", self.label,
                 params.message[:80], action)
        if action == "accept":
            return mcp_types.ElicitResult(action="accept", content=content)
        return mcp_types.ElicitResult(action="decline" if action == "decline" else "cancel")

    async def resources(self) -> list[mcp_types.Resource]:
        """The server's resources (first pages), or none when it offers none or fails."""
        conn = self._conn
        if conn is None or conn.client.server_capabilities.resources is None:
            return []
        found: list[mcp_types.Resource] = []
        cursor: str | None = None
        try:
            for _ in range(_MAX_RESOURCE_PAGES):
                page = await asyncio.wait_for(
                    conn.client.list_resources(cursor=cursor, cache_mode="bypass"),
                    self._connect_timeout_s,
                )
                found.extend(page.resources)
                cursor = page.next_cursor
                if cursor is None:
                    break
        except Exception as e:
            log.info("MCP server %s did not list its resources: %s", self.label, reason(e))
        return found

    async def read(self, uri: str, own_s: float, *, untrusted: bool,
                   max_output: int | None) -> Answer:
        """One resource's contents as an answer (text as is, binary described)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + own_s
        try:
            conn = await self._connection(deadline)
            result = await asyncio.wait_for(conn.client.read_resource(uri),
                                            max(0.001, deadline - loop.time()))
        except TimeoutError:
            return Failed(message=f"MCP server {self.label} did not send {uri} in time")
        except Exception as e:
            return Failed(message=f"MCP server {self.label} could not read {uri}: {reason(e)}")
        parts = [describe_content(mcp_types.EmbeddedResource(type="resource", resource=c))
                 for c in result.contents]
        return Result(content=cut_text("\n".join(parts) or f"({uri} is empty)", max_output),
                      untrusted=untrusted)

    async def first_listing(self) -> list[mcp_types.Tool]:
        """Start the server and list its tools, or raise McpError saying why not."""
        await self._prepare()
        conn = await self._open(self._connect_timeout_s)
        try:
            return await asyncio.wait_for(self._list_tools(conn), self._connect_timeout_s)
        except Exception as e:
            self._retire(conn)
            if self.refusal is not None or self._oauth_errors.last is not None:
                raise McpError(self._start_failure(e, self._connect_timeout_s)) from e
            raise McpError(f"MCP server {self.label} did not list its tools: {reason(e)}") from e

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
        conn.watch = asyncio.create_task(self._watch_tools(conn))
        return conn

    async def _watch_tools(self, conn: _Connection) -> None:
        """On the 2026-07-28 wire, a ``subscriptions/listen`` stream of tools/list_changed
        (the older wire's notification comes to :meth:`_notified`); each change lists the
        tools again and hands them to ``on_tools``."""
        try:
            async with conn.client.listen(tools_list_changed=True) as changes:
                async for _event in changes:
                    await self._relist(conn)
        except ListenNotSupportedError:
            pass
        except Exception as e:  # the server or the connection ended: the next one watches
            log.info("MCP server %s: tools/list_changed watch ended: %s", self.label, reason(e))

    async def _notified(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification) and self._conn is not None:
            asyncio.get_running_loop().create_task(self._relist(self._conn))

    async def _relist(self, conn: _Connection) -> None:
        try:
            tools = await asyncio.wait_for(self._list_tools(conn), self._connect_timeout_s)
        except Exception as e:
            log.warning("MCP server %s said its tools changed, then did not list them: %s",
                        self.label, reason(e))
            return
        log.info("MCP server %s: its tools changed (%d now)", self.label, len(tools))
        self.on_tools(tools)

    async def _hold(self, conn: _Connection, ready: asyncio.Future[Any]) -> None:
        """Own the SDK client for the connection's life (anyio scopes need one task)."""
        try:
            client = Client(
                self._transport(conn.ended),
                cache=None,
                client_info=mcp_types.Implementation(name="loopd", version=_version()),
                elicitation_callback=self._elicit,
                message_handler=self._notified,
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
        if conn.watch is not None:
            conn.watch.cancel()
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
            if self.closed:
                raise McpError(f"MCP server {self.label} is closed")
            budget = min(self._connect_timeout_s, deadline - loop.time())
            return await self._open(max(0.001, budget))

    async def call(
        self, tool: str, arguments: dict[str, Any], own_s: float, timeout_s: float, *,
        untrusted: bool, max_output: int | None, ask: Asker | None = None,
        progress: Reporter | None = None,
    ) -> Answer:
        """One call within ``own_s``; ``timeout_s`` is the caller's limit, for messages;
        ``ask`` asks the person a question the server has during the call; ``progress``
        hears the server's progress notifications."""
        if ask is None:
            return await self._call(tool, arguments, own_s, timeout_s, untrusted=untrusted,
                                    max_output=max_output, progress=progress)
        self._askers.append(ask)
        try:
            return await self._call(tool, arguments, own_s, timeout_s, untrusted=untrusted,
                                    max_output=max_output, progress=progress)
        finally:
            self._askers.remove(ask)

    async def _call(
        self, tool: str, arguments: dict[str, Any], own_s: float, timeout_s: float, *,
        untrusted: bool, max_output: int | None, progress: Reporter | None,
    ) -> Answer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + own_s
        try:
            conn = await self._connection(deadline)
        except McpError as e:
            return Failed(message=f"{e}; the call to {tool} did not run")
        remaining = deadline - loop.time()
        if remaining <= 0:
            return Failed(message=timeout_message(tool, self.label, timeout_s))
        try:
            result = await conn.client.call_tool(tool, arguments, read_timeout_seconds=remaining,
                                                 progress_callback=_progress_of(progress))
        except MCPError as e:
            if e.code == mcp_types.REQUEST_TIMEOUT:
                self._start_probe(conn)
                return Failed(message=timeout_message(tool, self.label, timeout_s))
            if e.code == mcp_types.CONNECTION_CLOSED or conn.ended.is_set():
                self._retire(conn)
                return Failed(
                    message=f"MCP server {self.label} exited or closed the connection during "
                    f"the call to {tool}; it is {self.restarted} for the next call",
                )
            return Failed(message=f"MCP server {self.label} refused the call to {tool}: {e}")
        except RuntimeError as e:
            if _breaks_its_schema(e, tool):  # the SDK checked the answer: a failed call
                return Failed(message=f"MCP server {self.label}: {e}; the call to {tool} failed")
            self._retire(conn)
            log.info("MCP call %s on %s raised", tool, self.label, exc_info=True)
            return Failed(message=f"MCP call {tool} on {self.label} failed: {reason(e)}")
        except Exception as e:
            # Not an MCP answer (a transport or protocol fault): start afresh next time.
            self._retire(conn)
            log.info("MCP call %s on %s raised", tool, self.label, exc_info=True)
            return Failed(message=f"MCP call {tool} on {self.label} failed: {reason(e)}")
        return answer_of(result, untrusted, max_output)

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
                    self.label, reason(e),
                )
                self._retire(conn)

        self._probe = asyncio.create_task(probe())

    async def shutdown(self) -> None:
        _OAUTH_LOG.removeHandler(self._oauth_errors)
        if self._authorizer is not None:
            await self._authorizer.close()
        if self._probe is not None:
            self._probe.cancel()
        if self._conn is not None:
            self._retire(self._conn)
        tasks = list(self._retired)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            for t in pending:
                t.cancel()
        current = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not current]
        for t in others:
            t.cancel()
        if others:
            await asyncio.wait(others, timeout=2)

    def _start_failure(self, e: Exception, timeout_s: float) -> str:
        if self._oauth_errors.last is not None:
            return (
                f"MCP server {self.label}: OAuth authorization failed: "
                f"{reason(self._oauth_errors.last)}; check the oauth keys of its "
                "[[tools.hosts]] entry"
            )
        if self.refusal is not None:
            return self.refusal.advice(self.label)
        if isinstance(e, TimeoutError):
            return (
                f"MCP server {self.label} did not finish the MCP handshake within {timeout_s:g} s"
            )
        if isinstance(e, OSError) and self._url is None:
            return (
                f"MCP server command {self.label} could not be started: {e}; "
                "check the command in [[tools.hosts]] (is it installed and on PATH?)"
            )
        if self._url is not None:
            return (
                f"MCP server {self.label} did not answer: {reason(e)}; is it running, and is "
                "url in [[tools.hosts]] its MCP endpoint?"
            )
        return (
            f"MCP server {self.label} did not start: {reason(e)}; "
            "run the command by hand to see its error output"
        )


# What the SDK raises when a result breaks the tool's output schema (the server is fine).
_SCHEMA_FAULTS = ("has an output schema but did not return", "Invalid structured content",
                  "Invalid schema for tool")


def _breaks_its_schema(e: RuntimeError, tool: str) -> bool:
    text = str(e)
    return tool in text and any(f in text for f in _SCHEMA_FAULTS)


def _progress_of(report: Reporter | None) -> Any:
    """The SDK's progress callback that tells ``report`` (None: ask for no progress)."""
    if report is None:
        return None

    async def progress(done: float, total: float | None, message: str | None) -> None:
        report(done, total, message or "")

    return progress


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopd")
    except PackageNotFoundError:
        return "0"
