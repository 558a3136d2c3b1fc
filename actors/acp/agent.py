"""The ACP agent: the SDK's ``Agent`` methods over loopd sessions (docs/acp.md).

The SDK calls these coroutines on its event loop; loopd's turns block, so each runs in a
worker thread and talks back through one queue per turn (:class:`_Run`). The prompt
coroutine is the only reader of that queue: it turns events into ``session/update``
notifications in the order the turn made them, and a call waiting for approval into a
``session/request_permission`` sent in the same order (after the call's ``tool_call``).

- ``initialize`` answers at once; the backend (the session service: the daemon when it
  serves the workspace, else a world in this process, :mod:`actors.service.choose`) starts
  with the first ``session/new`` or ``session/load``, whose ``cwd`` is the workspace. One
  ``loopd acp`` serves one workspace.
- ``session/cancel``, an approval answered "cancelled", or the client going away cancel the
  turn like Ctrl-C: it ends cleanly (the log stays valid) with stop reason ``cancelled``.
- A session's id is its loopd name: ``loopd chat --session NAME`` and ``loopd log show
  NAME`` see the same conversation, and ``session/load`` opens any of them.
- ``session/fork`` (unstable in ACP: ``loopd acp`` runs the SDK with its unstable methods
  on, and ``initialize`` declares the ``fork`` session capability) is ``loopd sessions
  fork``: the whole session, into a new session name, starting from its source's KV state
  (docs/rendering.md#fork-and-rewind); the answer's ``_meta.loopd`` says from which turn and
  how many tokens of state. The source is not touched, and need not be open here.
- ``session/resume`` opens a session without replaying it: its KV state is still in the
  slot (or restored from its file), so the next prompt processes only itself.
  ``session/close`` cancels the session's turn, waits for it to wind down and detaches it
  (its log and KV state stay; resume or load opens it again); a session not open here is
  -32002 (resource not found), which the TypeScript SDK takes as "already closed".
  ``session/delete`` is ``loopd sessions rm`` (the pinned Python SDK has its types but no
  route for it: :func:`actors.acp.main.route_delete` adds one, and ``initialize`` declares
  it only then).
- Methods loopd does not have (modes, config options, authentication) are not defined
  here, so the SDK answers "method not found"; ``initialize`` declares none of them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import errno
import itertools
import json
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError
from acp.interfaces import Client
from acp.schema import (
    AcpMcpServer,
    AgentCapabilities,
    CloseSessionResponse,
    DeleteSessionResponse,
    DeniedOutcome,
    ForkSessionResponse,
    HttpMcpServer,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    McpServerStdio,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionDeleteCapabilities,
    SessionForkCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SessionResumeCapabilities,
    SseMcpServer,
)

from actors.acp import updates as up
from actors.base.cancel import CancelToken
from actors.base.config import Config
from actors.base.durable import replace_file
from actors.base.errors import LoopdError, SessionError
from actors.base.events import ApprovalRequested, Choice, Compacted, Compacting, Decision, Event
from actors.log.sessiondir import check_name, kept_workspace, list_sessions, session_path
from actors.service.choose import choose
from actors.service.types import McpServer, Opened, SessionService, TurnOutcome
from actors.session.workspace import other_workspace

__all__ = ["LoopdAgent"]

INTERNAL = -32603  # a loopd error that is not a stop reason: its one-line message
NOT_FOUND = -32002  # ACP's "resource not found": no such session (or not open here)


def _invalid(message: str) -> RequestError:
    return RequestError(-32602, message)


def _not_found(message: str) -> RequestError:
    """ACP's "resource not found" for a session: the data a SessionError's answer has."""
    return RequestError(NOT_FOUND, message, {"loopd": SessionError.__name__,
                                             "exitCode": SessionError.exit_code})


def _loopd_error(error: LoopdError) -> RequestError:
    return RequestError(INTERNAL, str(error), {"loopd": type(error).__name__,
                                               "exitCode": error.exit_code})


@dataclasses.dataclass(slots=True)
class _Ask:
    """A call waiting for approval, on its way to the client; ``answer`` gets the decision."""

    request: ApprovalRequested
    answer: concurrent.futures.Future[Decision | None]


@dataclasses.dataclass(slots=True)
class _End:
    outcome: TurnOutcome | None = None
    error: BaseException | None = None


class _Run:
    """One turn in a worker thread: its cancel token, and its queue to the prompt coroutine."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.cancel = CancelToken()
        self.queue: asyncio.Queue[Event | _Ask | _End] = asyncio.Queue()
        self.finished = asyncio.Event()  # the prompt has answered: the turn is over
        self.compaction = ""  # the id of the compaction under way (its updates share it)

    def put(self, item: Event | _Ask | _End) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is ending
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def approve(self, request: ApprovalRequested, cancel: CancelToken,
                deadline: float) -> Decision | None:
        """The turn's approver (actors.approval.gate): ask the client, in order with the
        turn's events; None at the deadline or on a cancel (of the turn, or by the daemon)."""
        answer: concurrent.futures.Future[Decision | None] = concurrent.futures.Future()
        self.put(_Ask(request, answer))
        while not (cancel.cancelled or self.cancel.cancelled):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                return answer.result(timeout=min(0.05, left))
            except concurrent.futures.TimeoutError:
                continue
            except concurrent.futures.CancelledError:
                return None
        answer.cancel()
        return None


@dataclasses.dataclass(slots=True)
class _Session:
    name: str
    run: _Run | None = None  # the turn in flight
    size: int = 0  # tokens of context its slot holds (0: not known)


class LoopdAgent:
    """The agent side of ACP for one client (one ``loopd acp`` process)."""

    def __init__(
        self, config: Config, *, local: bool = False, workspace: Path | None = None,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:  # fmt: skip
        self.config, self.local, self.say = config, local, say
        self.fixed_workspace = workspace  # --workspace: every session's, whatever its cwd
        self.client: Client | None = None
        self.backend: SessionService | None = None
        self.sessions: dict[str, _Session] = {}
        self._starting = asyncio.Lock()
        self._work: set[concurrent.futures.Future[Any]] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="loopd-acp")
        self._busy = 0  # requests being handled (the end of input waits for them)
        self._idle = asyncio.Event()
        self._idle.set()
        self.can_delete = False  # session/delete is routed (actors.acp.main.route_delete)
        # the client advertised session.compaction (draft ACP; the pinned SDK drops it):
        # compaction_update notifications, sent raw through ``notify``
        self.compaction_updates = False
        self._compaction_ids = itertools.count(1)
        self.notify: Callable[[dict[str, Any]], Awaitable[None]] | None = None

    def on_connect(self, conn: Client) -> None:
        self.client = conn

    def saw(self, message: dict[str, Any]) -> None:
        """A message as it came (before the SDK's types): ``initialize``'s
        ``clientCapabilities.session.compaction``, which the pinned SDK has no field for; an
        MCP server of a transport ACP does not name (:func:`mark_transports`)."""
        if message.get("method") in ("session/new", "session/load", "session/resume",
                                     "session/fork"):
            mark_transports(message)
        if message.get("method") != "initialize":
            return
        params = message.get("params")
        caps = params.get("clientCapabilities") if isinstance(params, dict) else None
        session = caps.get("session") if isinstance(caps, dict) else None
        self.compaction_updates = (isinstance(session, dict)
                                   and isinstance(session.get("compaction"), dict))

    # --- the requests ------------------------------------------------------------------

    async def initialize(self, protocol_version: int, **_: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=False, audio=False,
                                                       embedded_context=False),
                mcp_capabilities=McpCapabilities(http=True, sse=False, acp=False),
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities(), fork=SessionForkCapabilities(),
                    resume=SessionResumeCapabilities(), close=SessionCloseCapabilities(),
                    delete=SessionDeleteCapabilities() if self.can_delete else None),
            ),
            auth_methods=[],
            agent_info=Implementation(name="loopd", title="loopd", version=_version()),
        )  # fmt: skip

    async def new_session(self, cwd: str, mcp_servers: Any = None,
                          **_: Any) -> NewSessionResponse:
        async with self._handling():
            backend = await self._backend(cwd)
            servers, refused = _servers(mcp_servers)
            for _attempt in range(5):
                name = _new_name()
                opened = await self._call(backend.open, name, True, servers)
                if opened.created:
                    self.sessions[name] = _Session(name, size=opened.context)
                    await asyncio.to_thread(_remember, self.config, name, opened)
                    return NewSessionResponse(session_id=name, field_meta=self._mcp_meta(
                        name, mcp_servers, opened, refused))
            raise _invalid("could not find a free session name; try again")

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           **_: Any) -> LoadSessionResponse:
        async with self._handling():
            name = _name(session_id)
            backend = await self._backend(cwd)
            await self._known(name, backend)  # as resume: another workspace's is refused
            opened, refused = await self._open(backend, name, mcp_servers)
            records = await self._call(backend.records, name)
            for update in up.history(records, backend.workspace):
                await self._client().session_update(session_id=name, update=update)
            return LoadSessionResponse(field_meta=self._mcp_meta(name, mcp_servers, opened,
                                                                 refused))

    async def resume_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                             **_: Any) -> ResumeSessionResponse:
        """Open ``session_id`` without replaying it (the client shows what it has): warm, its
        KV state still in a slot or restored from its file, as ``loopd run`` reopens one."""
        async with self._handling():
            name = _name(session_id)
            backend = await self._backend(cwd)
            await self._known(name, backend)
            opened, refused = await self._open(backend, name, mcp_servers)
            return ResumeSessionResponse(field_meta=self._mcp_meta(name, mcp_servers, opened,
                                                                   refused))

    async def close_session(self, session_id: str, **_: Any) -> CloseSessionResponse:
        """Its turn cancelled and waited for, then detached: its log and KV state stay, and
        session/resume or session/load opens it again."""
        async with self._handling():
            session = self.sessions.pop(session_id, None)
            if session is None or self.backend is None:
                raise _not_found(f"session {session_id} is not open in this loopd acp (closed "
                                 "already, or never opened): nothing to close")
            run = session.run
            if run is not None:
                run.cancel.cancel()
                await run.finished.wait()
            await self._call(self.backend.close, session.name)
            return CloseSessionResponse(field_meta=up.loopd_meta(cancelledTurn=run is not None))

    async def delete_session(self, session_id: str, **_: Any) -> DeleteSessionResponse:
        """``loopd sessions rm``: its log and saved KV state; closed first when open here,
        refused while its turn runs here or another process has it open."""
        async with self._handling():
            name = _name(session_id)
            session = self.sessions.get(name)
            if session is not None and session.run is not None:
                raise RequestError(-32600, f"session {name} is running a turn; cancel it "
                                           "(session/cancel) before deleting it")
            if not await asyncio.to_thread(session_path(self.config, name).is_file):
                raise _not_found(f"session {name} does not exist (session/list names them)")
            if self.backend is not None:
                await self._call(self.backend.remove, name)
            else:  # nothing started here: exactly the command's way
                await self._call(_remove, self.config, name)
            self.sessions.pop(name, None)
            self.say(f"session {name} deleted")
            return DeleteSessionResponse()

    async def fork_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           loopd: Any = None, **_: Any) -> ForkSessionResponse:
        """A new session from ``session_id``'s conversation and its KV state: its first
        prompt processes only itself. The whole conversation, or its first turns when
        ``_meta.loopd.atTurn`` names a turn (``loopd sessions fork --at``; the SDK passes
        ``_meta``'s keys as arguments). The source stays as it was."""
        async with self._handling():
            at = _at_turn(loopd)
            source = _name(session_id)
            backend = await self._backend(cwd)
            await self._known(source, backend)
            for _attempt in range(5):
                name = _new_name()
                if not await asyncio.to_thread(session_path(self.config, name).parent.exists):
                    break
            else:
                raise _invalid("could not find a free session name; try again")
            forked = await self._call(backend.fork, source, name, at)
            opened, refused = await self._open(backend, name, mcp_servers)
            self.say(f"session {name}: forked from {source} at turn {forked.at}"
                     + (f", from its KV state ({forked.state_tokens:,} tokens)"
                        if forked.state_tokens else " (it had no saved KV state)"))
            meta = up.loopd_meta(forkedFrom=source, atTurn=forked.at,
                                 stateTokens=forked.state_tokens)
            note = self._mcp_meta(name, mcp_servers, opened, refused)
            if note is not None:
                meta["loopd"].update(note["loopd"])
            return ForkSessionResponse(session_id=name, field_meta=meta)

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None,
                            **_: Any) -> ListSessionsResponse:
        """Every loopd session (they are not tied to a directory), newest first."""
        async with self._handling():
            workspace = self.backend.workspace if self.backend else self._workspace(cwd)
            rows = await asyncio.to_thread(_session_rows, self.config)
            return ListSessionsResponse(sessions=[
                SessionInfo(session_id=name, cwd=str(workspace), title=name, updated_at=when)
                for name, when in rows
            ])  # fmt: skip

    async def prompt(self, session_id: str, prompt: list[Any], **_: Any) -> PromptResponse:
        async with self._handling():
            session = self.sessions.get(session_id)
            if session is None or self.backend is None:
                raise _invalid(f"no session {session_id!r} in this loopd acp; create it with "
                               "session/new or open it with session/resume or session/load first")
            if session.run is not None:
                raise RequestError(-32600, f"session {session_id} is already running a turn; "
                                           "cancel it first (session/cancel)")
            try:
                text = up.prompt_text(prompt, self.backend.workspace)
            except ValueError as e:
                raise _invalid(str(e)) from None
            if not text.strip():
                raise _invalid("the prompt is empty: send some text")
            run = session.run = _Run(asyncio.get_running_loop())
            try:
                return await self._turn(session, run, text)
            finally:
                session.run = None
                run.finished.set()

    async def cancel(self, session_id: str, **_: Any) -> None:
        session = self.sessions.get(session_id)
        if session is not None and session.run is not None:
            session.run.cancel.cancel()

    # --- a turn ------------------------------------------------------------------------

    async def _turn(self, session: _Session, run: _Run, text: str) -> PromptResponse:
        backend = self.backend
        assert backend is not None

        def work() -> None:
            try:
                run.put(_End(outcome=backend.turn(session.name, text, run.put, run.approve,
                                                  run.cancel)))
            except BaseException as e:  # every end reaches the coroutine
                run.put(_End(error=e))

        self._start(work)
        view = up.TurnView(backend.workspace, session.size)
        end, gone = await self._drain(session.name, run, view)
        error = end.error
        if error is not None and not isinstance(error, LoopdError):
            raise error  # a bug: the SDK answers "internal error" and logs its traceback
        reason = (up.stop_reason(end.outcome) if end.outcome is not None
                  else up.stop_for_error(error) if error is not None else None)
        why = "the turn was cancelled" if reason == "cancelled" else str(error or "")
        gone = gone or await self._send(session.name, view.end(why), run)
        if gone is not None:
            raise gone
        if reason is None:
            assert error is not None
            raise _loopd_error(error)
        meta = up.loopd_meta(limit=str(error)) if reason == "max_turn_requests" else None
        return PromptResponse(stop_reason=reason, field_meta=meta)

    async def _drain(
        self, name: str, run: _Run, view: up.TurnView
    ) -> tuple[_End, Exception | None]:
        """The turn's queue until its end: updates sent in order, approvals asked."""
        asks: set[asyncio.Task[None]] = set()
        gone: Exception | None = None
        try:
            while not isinstance(item := await run.queue.get(), _End):
                if isinstance(item, _Ask):
                    asks.add(asyncio.create_task(self._ask(name, run, item)))
                elif gone is None:
                    gone = await self._send(name, view.event(item), run)
                    if gone is None and self.compaction_updates:
                        gone = await self._compaction(name, item, run)
            return item, gone
        except asyncio.CancelledError:  # the connection closes: the turn winds down alone
            run.cancel.cancel()
            raise
        finally:
            for task in asks:
                task.cancel()

    async def _compaction(self, name: str, event: Event, run: _Run) -> Exception | None:
        """A compaction's start and end as draft ACP's ``compaction_update`` (for a client
        that opted in), sent raw: the pinned SDK has no type for it."""
        if not isinstance(event, Compacting | Compacted):
            return None
        if isinstance(event, Compacting) or not run.compaction:
            run.compaction = f"{name}-compaction-{next(self._compaction_ids)}"
        update = up.compaction(event, run.compaction)
        assert self.notify is not None, "main gives the agent its raw notify"
        try:
            await self.notify({"jsonrpc": "2.0", "method": "session/update",
                               "params": {"sessionId": name, "update": update}})
        except (ConnectionError, OSError) as e:
            run.cancel.cancel()
            return e
        return None

    async def _send(self, name: str, updates: Iterable[up.Update], run: _Run) -> Exception | None:
        """Send updates; a client that can no longer be reached cancels the turn."""
        try:
            for update in updates:
                await self._client().session_update(session_id=name, update=update)
        except (ConnectionError, OSError) as e:
            run.cancel.cancel()
            return e
        return None

    async def _ask(self, name: str, run: _Run, ask: _Ask) -> None:
        tool_call, options = up.permission(ask.request, self._workspace_now())
        decision: Decision | None = None
        try:
            answer = await self._client().request_permission(
                session_id=name, tool_call=tool_call, options=options)
            if isinstance(answer.outcome, DeniedOutcome):  # "cancelled": the person cancelled
                run.cancel.cancel()
            else:
                decision = up.decision_of(answer.outcome.option_id, options)
        except (ConnectionError, OSError):  # the client is gone: like Ctrl-C
            run.cancel.cancel()
        except (RequestError, ValueError) as e:  # an error answer, or not a valid one
            decision = Decision(Choice.DENY, f"the editor could not ask for approval: {e}",
                                by="editor")
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            ask.answer.set_result(decision)

    # --- plumbing ----------------------------------------------------------------------

    async def _open(self, backend: SessionService, name: str,
                    mcp_servers: Any) -> tuple[Opened, list[str]]:
        """Open ``name`` (load, resume) with the client's servers, which replace those it had
        open here; (what opening said, the servers refused before any started)."""
        servers, refused = _servers(mcp_servers)
        opened: Opened = await self._call(backend.open, name, False, servers)
        if opened.cut_bytes:
            self.say(f"session {name}: a torn last record ({opened.cut_bytes} bytes, a write "
                     "a crash interrupted) was cut; every whole record is kept")
        if name not in self.sessions:
            self.sessions[name] = _Session(name, size=opened.context)
        changed = await asyncio.to_thread(_remember, self.config, name, opened)
        return opened, [*refused, *([changed] if changed else [])]

    def _mcp_meta(self, name: str, given: Any, opened: Opened,
                  refused: list[str]) -> dict[str, Any] | None:
        """The client's MCP servers as the answer's ``_meta.loopd.mcpServers``: those started,
        their tools, and a note per problem (each said on stderr, and as an agent message
        right after the answer: :meth:`following`)."""
        if not given and not refused and not opened.notes:
            return None
        notes = [*refused, *opened.notes]
        for note in notes:
            self.say(f"session {name}: {note}")
        return up.loopd_meta(mcpServers={"session": name, "started": list(opened.servers),
                                         "tools": list(opened.tools), "notes": notes})

    def following(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """What to send right after ``message`` goes out: a session's MCP server notes, as
        agent messages once the client knows the session (after session/new's answer)."""
        result = message.get("result")
        meta = result.get("_meta") if isinstance(result, dict) else None
        loopd = meta.get("loopd") if isinstance(meta, dict) else None
        servers = loopd.get("mcpServers") if isinstance(loopd, dict) else None
        if not isinstance(servers, dict) or not servers.get("notes"):
            return []
        return [{"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": servers["session"], "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"loopd: {note}\n"}}}}
            for note in servers["notes"]]

    async def _known(self, name: str, backend: SessionService) -> None:
        """``name`` exists (else -32002) and was made in this workspace (else -32602)."""
        if not await asyncio.to_thread(session_path(self.config, name).is_file):
            raise _not_found(f"session {name} does not exist (session/list names them; "
                             "session/new makes one)")
        kept = await asyncio.to_thread(kept_workspace, self.config, name)
        if kept is not None and kept != backend.workspace:
            raise _invalid(other_workspace(name, kept, backend.workspace))

    def _client(self) -> Client:
        assert self.client is not None, "on_connect gives the agent its connection"
        return self.client

    def _workspace_now(self) -> Path:
        assert self.backend is not None
        return self.backend.workspace

    def _workspace(self, cwd: str | None) -> Path:
        if self.fixed_workspace is not None:
            return self.fixed_workspace
        if not cwd:
            return self.config.workspace
        path = Path(cwd)
        if not path.is_absolute():
            raise _invalid(f"cwd must be an absolute path, not {cwd!r}")
        if not path.is_dir():
            raise _invalid(f"cwd {cwd} is not a directory")
        return path.resolve()

    async def _backend(self, cwd: str) -> SessionService:
        workspace = self._workspace(cwd)
        async with self._starting:
            if self.backend is None:
                self.backend = await self._call(
                    _start_service, self.config, workspace, self.local, self.say)
                self.say(f"serving {workspace} (turns run in {self.backend.where})")
        if self.backend.workspace != workspace:
            raise _invalid(f"this loopd acp serves {self.backend.workspace}; a session in "
                           f"{workspace} needs a loopd acp of its own")
        return self.backend

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn`` in a worker thread; a LoopdError becomes a JSON-RPC error (its message)."""
        try:
            return await asyncio.wrap_future(self._start(lambda: fn(*args, **kwargs)))
        except LoopdError as e:
            raise _loopd_error(e) from None

    def _start(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future = self._pool.submit(fn)
        self._work.add(future)
        future.add_done_callback(self._work.discard)
        return future

    @contextlib.asynccontextmanager
    async def _handling(self) -> Any:
        self._busy += 1
        self._idle.clear()
        try:
            yield
        except OSError as e:  # out of descriptors, a disk error: an answer, not a traceback
            raise RequestError(INTERNAL, _os_error(e), {"loopd": type(e).__name__}) from None
        finally:
            self._busy -= 1
            if not self._busy:
                self._idle.set()

    async def wind_down(self) -> None:
        """The input ended: cancel every turn, and let the requests already read finish (their
        answers go out)."""
        await asyncio.sleep(0)  # the handlers of the last messages read start (and count)
        for session in self.sessions.values():
            if session.run is not None:
                session.run.cancel.cancel()
        await self._idle.wait()

    async def aclose(self) -> None:
        """Cancel what still runs, wait for the worker threads, close the backend (the world:
        sessions stopped, KV state saved, the server stopped; or the daemon connection)."""
        for session in self.sessions.values():
            if session.run is not None:
                session.run.cancel.cancel()
        if self._work:
            await asyncio.wait([asyncio.wrap_future(f) for f in self._work])
        if self.backend is not None:
            await asyncio.to_thread(self.backend.shutdown)
        self._pool.shutdown(wait=True)


def _os_error(error: OSError) -> str:
    """An OSError as the one line an editor shows; running out of descriptors says how."""
    if error.errno == errno.EMFILE:
        return (f"loopd acp has no file descriptor left ({error.strerror}): close sessions "
                "(or lower daemon.max_sessions_per_client), or raise the process's limit "
                "(ulimit -n)")
    return f"loopd acp: {error}"


def _version() -> str:
    try:
        return metadata.version("loopd")
    except metadata.PackageNotFoundError:
        return "0"


def _new_name() -> str:
    """A new session's name: when it was made, and a few random letters."""
    return f"acp-{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def _start_service(config: Config, workspace: Path, local: bool,
                   say: Callable[[str], None]) -> SessionService:
    """The daemon when it answers and serves ``workspace`` (and not ``local``: also --url or
    --log-dir, a world of this command's own), else a world here; exactly as ``loopd run``
    decides (README, "Keep it running")."""
    return choose(config.replace("tools", workspace=str(workspace)), say, local=local,
                  fixed=True)


def _at_turn(meta: Any) -> int | None:
    """``_meta.loopd.atTurn`` of a fork: a turn number (0: only the session's start), or
    None (the whole session)."""
    if meta is None:
        return None
    at = meta.get("atTurn") if isinstance(meta, dict) else None
    if at is None and isinstance(meta, dict):
        return None
    if type(at) is not int or at < 0:
        raise _invalid(f"_meta.loopd.atTurn must be a turn number (0: only the session's "
                       f"start), not {at!r}; leave it out to fork the whole session")
    return at


# the transports ACP names; one it does not is taken as SSE by main's raw read, marked
_TRANSPORTS = ("stdio", "http", "sse", "acp")
_SPEAKS = "loopd starts MCP servers over stdio (a command) or http (a url)"


def _servers(given: Any) -> tuple[tuple[McpServer, ...], list[str]]:
    """The client's ``mcpServers`` as the session service's records, and a note for each
    one loopd cannot start (a transport it does not speak: SSE, MCP over ACP, or one ACP
    does not name, which :meth:`LoopdAgent.saw` marks)."""
    servers: list[McpServer] = []
    refused: list[str] = []
    for s in given or ():
        if isinstance(s, McpServerStdio):
            servers.append(McpServer(s.name, (s.command, *s.args),
                                     env=tuple(f"{v.name}={v.value}" for v in s.env)))
        elif isinstance(s, HttpMcpServer):
            servers.append(McpServer(s.name, url=s.url,
                                     headers=tuple(f"{h.name}: {h.value}" for h in s.headers)))
        else:
            marked = ((s.field_meta or {}).get("loopd") or {}).get("transport")
            kind = (marked if isinstance(s, SseMcpServer) and marked
                    else "sse" if isinstance(s, SseMcpServer)
                    else "acp" if isinstance(s, AcpMcpServer) else type(s).__name__)
            refused.append(f"MCP server {getattr(s, 'name', '?')} was not started: its "
                           f"transport {kind!r} is not one loopd speaks ({_SPEAKS}); give it "
                           "as one of those in the client's MCP server settings")
    return tuple(servers), refused


SERVERS_FILE = "acp-mcp-servers.json"  # in a session's directory: its editor's servers


def _remember(config: Config, name: str, opened: Opened) -> str:
    """Keep which editor's servers and tools session ``name`` has now (beside its log), and
    say which of those it had when last opened are gone ("": none). Nothing else changes
    with them: a session's prompt prefix (its Baseline) never holds them."""
    path = session_path(config, name).parent / SERVERS_FILE
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        before = None
    except (OSError, ValueError):
        before = {}
    if before is None and not opened.tools:
        return ""  # never had any: no file
    with contextlib.suppress(OSError):  # a note lost, nothing else
        replace_file(path, json.dumps({"servers": list(opened.servers),
                                       "tools": list(opened.tools)}).encode())
    had = before if isinstance(before, dict) else {}
    gone = sorted({t for t in had.get("tools") or () if isinstance(t, str)} - set(opened.tools))
    if not gone:
        return ""
    servers = ", ".join(str(s) for s in had.get("servers") or ()) or "?"
    return (f"the tools {', '.join(gone)} (of the MCP servers {servers} it had when last "
            "opened) are not offered to this session now: give those servers again to have "
            "them back; its conversation and KV state are kept as they were")


def mark_transports(message: dict[str, Any]) -> None:
    """In a raw session/new|load|resume|fork, an MCP server of a transport ACP does not
    name, made an SSE one marked with it (``_meta.loopd.transport``): the SDK's types would
    refuse the whole request, where loopd refuses that server alone (a note)."""
    params = message.get("params")
    listed = params.get("mcpServers") if isinstance(params, dict) else None
    if not isinstance(listed, list):
        return
    for i, server in enumerate(listed):
        kind = server.get("type") if isinstance(server, dict) else None
        if kind is not None and kind not in _TRANSPORTS:
            listed[i] = {"type": "sse", "name": str(server.get("name", "?")), "url": "",
                         "headers": [], "_meta": {"loopd": {"transport": str(kind)}}}


def _remove(config: Config, name: str) -> None:
    from actors.service.local import remove_session  # its KV state's files too

    remove_session(config, name)


def _name(session_id: str) -> str:
    try:
        return check_name(session_id)
    except LoopdError as e:
        raise _invalid(str(e)) from None


def _session_rows(config: Config) -> list[tuple[str, str | None]]:
    """(name, last change as ISO 8601) of every session, the newest first."""
    rows = []
    for name in list_sessions(config):
        try:
            mtime = session_path(config, name).stat().st_mtime
        except OSError:
            mtime = -math.inf
        rows.append((mtime, name))
    rows.sort(reverse=True)
    return [(name, dt.datetime.fromtimestamp(m, dt.UTC).isoformat() if m > -math.inf else None)
            for m, name in rows]
