"""Agents (docs/agents.md): a turn hands tasks to child sessions, warm, at once, on one budget.

The model gets a tool ``agent`` (:data:`AGENT_TOOL`, the session's own, like ``find_tool``).
Each call makes a child: a session of its own named after its parent (``PARENT.a1``), an
:class:`~actors.log.records.AgentLink` in both logs, its own session actor (the only writer
of its log) running one turn on the task. Its result is the child's final answer; a failure
says why and never ends the parent's turn by itself.

- **Warm.** A fresh child is a new session: the inference handle's warm start restores the
  baseline's saved KV state into its slot (``SlotKeeper.warm_start``). A forked child is
  ``fork_session`` of the parent as it is now (its state saved first and copied, as ``loopd
  sessions fork`` does). Either way its first request processes only its task; a state
  that cannot be restored is a CacheLoss with its cause, and the child runs anyway.
- **At once.** The agent calls of one response start together, each in a thread of its
  own; at most ``agents.max_parallel`` run (0: the servers' slots), the rest wait.
- **One budget.** A :class:`Tree` is shared by the turn and every child: the tool
  iterations of all of them count together (``loop.tool_iterations``), and so do the tokens
  they generate (``loop.turn_tokens``) and the wall time (``loop.turn_seconds``). When one is
  spent every turn of the tree is cancelled, the children's calls return a failure naming
  the limit, and the parent's turn ends with it (TurnLimit, exit 3).
- **The person in charge.** A child's call that needs approval is asked with the child and
  its task named (one question at a time); the person's cancel reaches every child; a
  child that read untrusted content passes the mark to its result.

:class:`TurnAgents` is what a turn holds (:mod:`actors.session.turn` only calls it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from actors.base import telemetry
from actors.base.cancel import CancelToken
from actors.base.config import Config
from actors.base.errors import Cancelled, LoopdError, TurnLimit
from actors.base.events import (
    AgentDone,
    AgentEvent,
    AgentStarted,
    ApprovalRequested,
    Approver,
    Decision,
    Event,
)
from actors.inference.types import InferError
from actors.log.file import SessionLog
from actors.log.records import AgentLink, Baseline, Record, ToolCall, ToolResult, Usage, now
from actors.log.sessiondir import check_name, list_sessions
from actors.session.limits import FAILED, Answered
from actors.wire.fieldchecks import parse_json

if TYPE_CHECKING:
    from actors.session.turn import Runtime

__all__ = [
    "AGENT", "AGENT_TOOL", "Tree", "TurnAgents", "agent_arguments", "agent_tool", "parent_of",
    "under_parents", "without_agent",
]  # fmt: skip

AGENT = "agent"
CONTEXTS = ("fresh", "fork")
AGENT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": AGENT,
        "description": (
            "Hand a task to another agent, which works on it alone with the same tools and "
            "answers with its result. Several agent calls in one response run at once. Say "
            "in the task what to do and what to answer."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "what to do and what to answer"},
                "context": {
                    "type": "string", "enum": list(CONTEXTS),
                    "description": "fresh (default): the agent sees only the task; fork: "
                                   "it sees this conversation so far too",
                },
            },
            "required": ["task"],
        },
    },
}
_WAIT_S = 0.05  # how often a wait looks at the cancel token (events, not sleeps, elsewhere)
_STOP_S = 10.0


def agent_tool() -> dict[str, Any]:
    """A copy of the ``agent`` tool for a baseline (a baseline's tools are its own)."""
    return {"type": "function", "function": dict(AGENT_TOOL["function"])}


def without_agent(tools: Sequence[Any]) -> tuple[Any, ...]:
    """``tools`` less the ``agent`` tool: a child at the depth cap gets none."""
    return tuple(t for t in tools if t.get("function", {}).get("name") != AGENT)


def agent_arguments(call: ToolCall) -> str | None:
    """The arguments of an agent call (made directly, or through ``call_tool`` as a small
    model may); None: not an agent call."""
    if call.name == AGENT:
        return call.arguments
    if call.name != "call_tool":
        return None
    try:
        wrapped = parse_json(call.arguments)
    except ValueError:
        return None
    if not isinstance(wrapped, dict) or wrapped.get("name") != AGENT:
        return None
    inner = wrapped.get("arguments", {k: v for k, v in wrapped.items() if k != "name"})
    return inner if isinstance(inner, str) else json.dumps(inner)


def _offers_agent(tools: Sequence[Any]) -> bool:
    return len(without_agent(tools)) != len(tools)


class Tree:
    """The one budget of a turn and every child it starts, and what they share; thread-safe.

    ``cancel`` is the token every turn of the tree is linked to: the person's cancel and a
    spent budget both set it."""

    def __init__(self, config: Config, cancel: CancelToken, slots: int) -> None:
        self.config, self.cancel = config, cancel
        self.iterations = self.tokens = 0
        self.children = 0  # started in the whole tree
        self.limit: tuple[str, str] | None = None  # (limit, detail) once spent
        self._lock = threading.Lock()
        self.asking = threading.RLock()  # one approval question to the person at a time
        self.emitting = threading.RLock()  # children's events reach the sink one at a time (a
        # grandchild's pass through its parent's sink, under the same lock)
        parallel = config.agents.max_parallel or max(slots, 1)
        self.running = threading.BoundedSemaphore(parallel)
        self._names: set[str] = set()
        self.depths: dict[str, int] = {}  # child session -> its depth (1: the turn's own)
        seconds = config.loop.turn_seconds
        self._timer: threading.Timer | None = None
        if seconds > 0:
            self._timer = threading.Timer(seconds, self.spend, (
                "turn time", f"the turn and its agents ran {seconds:g} s "
                f"(loop.turn_seconds = {seconds:g})"))
            self._timer.daemon = True
            self._timer.start()

    @property
    def spent(self) -> bool:
        return self.limit is not None

    def error(self) -> TurnLimit:
        assert self.limit is not None
        return TurnLimit(*self.limit)

    def spend(self, limit: str, detail: str) -> TurnLimit:
        """The budget is spent: every turn of the tree is cancelled; the first limit stays."""
        with self._lock:
            if self.limit is None:
                self.limit = (limit, detail)
        self.cancel.cancel()
        return self.error()

    def iteration(self) -> None:
        """One more response with tool calls in the tree; TurnLimit past the cap."""
        cap = self.config.loop.tool_iterations
        with self._lock:
            self.iterations += 1
            over, children = self.iterations > cap, self.children
        if over:
            whose = " and its agents" if children else ""
            raise self.spend("tool iterations", f"the model asked for tools {cap} times in "
                             f"this turn{whose} (loop.tool_iterations = {cap})")
        if self.spent:
            raise self.error()

    def generated(self, usage: Usage) -> None:
        """A response's tokens counted; TurnLimit past ``loop.turn_tokens``."""
        cap = self.config.loop.turn_tokens
        with self._lock:
            self.tokens += usage.completion_tokens
            over = bool(cap) and self.tokens > cap
        if over:
            raise self.spend("turn tokens", f"the turn and its agents generated more than "
                             f"{cap} tokens (loop.turn_tokens = {cap})")

    def name_for(self, parent: str, depth: int) -> str:
        """A new child name of ``parent`` (at ``depth``): ``PARENT.aN``, N the first not
        taken."""
        taken = set(list_sessions(self.config)) | self._names
        n = 1
        while f"{parent}.a{n}" in taken:
            n += 1
        name = f"{parent}.a{n}"
        with self._lock:
            self._names.add(name)
            self.depths[name] = depth
            self.children += 1
        return name

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


@dataclasses.dataclass(slots=True)
class _Child:
    """One agent call: its child and, once ended, its answer."""

    name: str
    task: str
    context: str
    token: CancelToken
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    answer: Answered | None = None
    thread: threading.Thread | None = None
    span: str = ""  # the parent's turn span, as a traceparent ("": tracing off)


def _failure(why: str) -> Answered:
    return Answered(f"{FAILED}{why}", outcome="failed")


class TurnAgents:
    """A turn's agents: the tree it belongs to (its own for a person's turn, else its
    parent's), the children its responses start, and the end of them.

    A context manager around the turn: leaving it cancels and waits for any child still
    running, and turns a cancel caused by the spent budget into that limit's TurnLimit."""

    def __init__(self, log: SessionLog, runtime: Runtime, cancel: CancelToken,
                 emit: Callable[[Event], None], approver: Approver | None) -> None:
        self.log, self.runtime, self.emit, self.approver = log, runtime, emit, approver
        self._person, self._own = cancel, runtime.tree is None
        # by the call object (the response's, logged): two calls may share an id
        self._children: dict[int, _Child] = {}
        self._lock = threading.Lock()
        self.started = 0
        self.cancel = cancel
        self.tree: Tree = runtime.tree if runtime.tree is not None else Tree(
            runtime.config, CancelToken(), _slots(runtime.inference))
        self.depth = self.tree.depths.get(log.name, 0)  # 0: the person's turn
        # agent calls are this module's: the session offers the tool, or is a child (which
        # is told why it has none)
        self._ours = self.depth > 0 or _offers_agent(log.baseline.tools)

    def __enter__(self) -> TurnAgents:
        if self._own:  # the person's cancel reaches the whole tree
            self._link = self._person.linked()
            self.tree.cancel = self.cancel = self._link.__enter__()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        finally:
            if self._own:
                self.tree.close()
                self._link.__exit__(None, None, None)
        if isinstance(e, Cancelled) and self.tree.spent and not self._person.cancelled:
            raise self.tree.error() from None

    @property
    def spent(self) -> bool:
        return self.tree.spent

    # --- a response's agent calls ---------------------------------------------------------

    def start(self, calls: Sequence[ToolCall]) -> None:
        """Start the children of ``calls``' agent calls at once; the others are not ours."""
        if not self._ours:
            return
        for call in calls:
            arguments = agent_arguments(call)
            if arguments is None or id(call) in self._children:
                continue
            problem, task, context = self._checked(arguments)
            if problem:
                self._children[id(call)] = _Child("", task, context, CancelToken(),
                                                  answer=_failure(problem))
                continue
            self._begin(id(call), task, context)

    def answer(self, call: ToolCall) -> Answered | None:
        """The result of agent call ``call`` once its child has ended; None: not an agent
        call (the tree's budget spent: no call runs, its result names the limit)."""
        if self.tree.spent and id(call) not in self._children:
            return _failure(f"not run: {self.tree.error()}")
        if agent_arguments(call) is None or not self._ours:
            return None
        child = self._children.get(id(call))
        if child is None:  # not seen by start (a bare-JSON call): started now
            self.start([call])
            child = self._children[id(call)]
        if child.answer is None and self.depth == 0:
            child.done.wait()
        elif child.answer is None:  # a child waiting for its own: its place goes to them
            self.tree.running.release()
            try:
                child.done.wait()
            finally:
                self.tree.running.acquire()
        assert child.answer is not None
        return child.answer

    def close(self) -> None:
        """Cancel the children still running and wait for them (their logs end whole)."""
        with self._lock:
            for child in self._children.values():
                if not child.done.is_set():
                    child.token.cancel()
        for child in self._children.values():
            if child.thread is not None:
                child.thread.join()

    def _checked(self, arguments: str) -> tuple[str, str, str]:
        """(problem, task, context) of an agent call's arguments; problem "" when fine."""
        agents = self.runtime.config.agents
        try:
            args = parse_json(arguments) if arguments.strip() else {}
        except ValueError as e:
            return f'the agent call\'s arguments are not JSON ({e}); send {{"task": "..."}}', "", ""
        if not isinstance(args, dict):
            return 'the agent call\'s arguments must be an object: {"task": "..."}', "", ""
        task, context = args.get("task"), args.get("context", "fresh")
        if not isinstance(task, str) or not task.strip():
            return ('the agent call needs "task": what the agent should do and answer '
                    "(it was empty)"), "", ""
        if len(task) > agents.max_task_chars:
            return (f"the task is {len(task)} characters, more than agents.max_task_chars "
                    f"= {agents.max_task_chars}; say it shorter"), task, ""
        if context not in CONTEXTS:
            return (f'unknown context {context!r}: "fresh" (the task only) or "fork" (this '
                    "conversation too)"), task, str(context)
        if self.depth >= agents.max_depth:
            return (f"an agent cannot start agents of its own here (agents.max_depth = "
                    f"{agents.max_depth}); do the task yourself"), task, context
        if self.started >= agents.max_children:
            return (f"this turn already started {self.started} agents, the most one turn "
                    f"may (agents.max_children = {agents.max_children})"), task, context
        return "", task, context

    def _begin(self, call: int, task: str, context: str) -> None:
        parent = self.log.name
        name = self.tree.name_for(parent, self.depth + 1)
        try:
            check_name(name)
        except LoopdError:
            self._children[call] = _Child(name, task, context, CancelToken(), answer=(
                _failure(f"the child's name {name} would be too long; start agents from a "
                         "session with a shorter name")))
            return
        self.started += 1
        child = _Child(name, task, context, CancelToken())
        self._children[call] = child
        link = AgentLink(parent=parent, child=name, task=task, context=context)
        child.span = telemetry.traceparent()  # the parent's turn: the child's turn's parent
        self.log.append(link)  # the parent's, before the call's result
        self.emit(AgentStarted(agent=name, task=task, context=context))
        child.thread = threading.Thread(target=self._run, args=(child, link),
                                        name=f"agent-{name}", daemon=True)
        child.thread.start()

    # --- one child, in its own thread ----------------------------------------------------

    def _run(self, child: _Child, link: AgentLink) -> None:
        started, tokens = time.monotonic(), 0
        try:
            with self.tree.cancel.linked() as token:
                with self._lock:
                    child.token, stopped = token, child.token.cancelled
                if stopped:  # the turn ended before this child began
                    token.cancel()
                answered, tokens = self._child_turn(child, link, token)
        except Exception as e:  # a bug: said, never a dead parent turn
            answered = _failure(f"agent {child.name} failed: {type(e).__name__}: {e}")
        child.answer = answered
        self._emit(AgentDone(agent=child.name, ok=answered.outcome == "result", tokens=tokens,
                             seconds=round(time.monotonic() - started, 3),
                             reason="" if answered.outcome == "result" else answered.text))
        child.done.set()

    def _child_turn(self, child: _Child, link: AgentLink, token: CancelToken
                    ) -> tuple[Answered, int]:
        """The child's one turn on its task: its answer (or why not) and its tokens."""
        from actors.session.actor import open_session

        records: tuple[Record, ...] = ()
        try:
            self._wait_for_room(token)
            try:
                baseline: Baseline | None = self._child_baseline()
                if child.context == "fork":
                    self._fork(child.name)
                    baseline = None
                proxy = open_session(self.runtime.config, child.name, baseline=baseline)
                try:
                    proxy.append(link).get(timeout=_STOP_S)
                    runtime = dataclasses.replace(self.runtime, tree=self.tree,
                                                  traceparent=child.span)
                    try:
                        outcome = proxy.turn(runtime, child.task, self._child_sink(child.name),
                                             token, self._child_approver(child)).get()
                    finally:
                        records = proxy.records().get(timeout=_STOP_S)
                finally:
                    _stop(proxy)
            finally:
                self.tree.running.release()
        except LoopdError as e:
            return self._failed(child, e), _tokens(records, link)
        mine = records[_after(records, link):]
        untrusted = any(isinstance(r, ToolResult) and r.untrusted for r in mine)
        return Answered(outcome.content, untrusted=untrusted), _tokens(records, link)

    def _failed(self, child: _Child, e: LoopdError) -> Answered:
        """Why a child gave no answer, as its call's result."""
        if isinstance(e, Cancelled) and self.tree.spent:
            return _failure(f"agent {child.name} was stopped: {self.tree.error()}")
        if isinstance(e, Cancelled):
            return _failure(f"agent {child.name} was cancelled")
        if isinstance(e, TurnLimit):
            return _failure(f"agent {child.name} was stopped: {e}")
        if isinstance(e, InferError):
            return _failure(f"agent {child.name}: its model server failed: {e}")
        return _failure(f"agent {child.name}: {e}")

    def _wait_for_room(self, token: CancelToken) -> None:
        """A place among ``agents.max_parallel`` running children (cancel applies)."""
        while not self.tree.running.acquire(timeout=_WAIT_S):
            if token.cancelled:
                raise Cancelled()

    def _child_baseline(self) -> Baseline:
        """The parent's baseline, less the agent tool at the depth cap: a fresh child's
        first request finds it saved (warm start) and processes only its task."""
        base = self.log.baseline
        tools = base.tools
        if self.depth + 1 >= self.runtime.config.agents.max_depth:
            tools = without_agent(tools)
        return Baseline(system=base.system, tools=tools, model=base.model, created=now())

    def _fork(self, name: str) -> None:
        """The child made from the parent's log as it is now and its saved KV state."""
        from actors.session.fork import fork_session

        save: Callable[[str], None] | None = getattr(self.runtime.inference, "save_state", None)
        fork_session(self.runtime.config, self.log.name, name, save=save)

    def _emit(self, event: Event) -> None:
        with self.tree.emitting:
            self.emit(event)

    def _child_sink(self, name: str) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            own = isinstance(event, AgentStarted | AgentDone | AgentEvent)
            self._emit(event if own else AgentEvent(name, event))

        return sink

    def _child_approver(self, child: _Child) -> Approver | None:
        approver = self.approver
        if approver is None:
            return None
        short = child.task if len(child.task) <= 80 else child.task[:77] + "..."
        tree = self.tree

        def ask(request: ApprovalRequested, cancel: CancelToken, deadline: float
                ) -> Decision | None:
            named = dataclasses.replace(
                request, prompt=f"[agent {child.name}, task: {short}] {request.prompt}",
                child=request.child or child.name)  # a grandchild's stays its own
            while not tree.asking.acquire(timeout=_WAIT_S):
                if cancel.cancelled:
                    return None
            try:
                return approver(named, cancel, deadline)
            finally:
                tree.asking.release()

        return ask


def _after(records: Sequence[Record], link: AgentLink) -> int:
    """The index after the child's own link record (its turn's records follow it)."""
    for i in range(len(records) - 1, -1, -1):
        if records[i] == link:
            return i + 1
    return 0


def _slots(inference: Any) -> int:
    """The slots of the model servers (``agents.max_parallel = "auto"``); 1 when unknown."""
    count = getattr(inference, "slot_count", None)
    return int(count()) if callable(count) else 1


def _tokens(records: Sequence[Record], link: AgentLink) -> int:
    """The tokens the child's turn generated (its Usage records after its link)."""
    return sum(r.completion_tokens for r in records[_after(records, link):]
               if isinstance(r, Usage))


def _stop(proxy: Any) -> None:
    with contextlib.suppress(Exception):  # stopped already, or busy: it stops when done
        proxy.actor_ref.stop(timeout=_STOP_S)


# --- the listing: a child under its parent -----------------------------------------------------


def parent_of(name: str, records: Sequence[Record]) -> str:
    """The session that made ``name`` an agent ("" when none): its own link record says."""
    return next((r.parent for r in records if isinstance(r, AgentLink) and r.child == name), "")


def under_parents(logs: Mapping[str, Sequence[Record]]) -> list[tuple[str, int]]:
    """The sessions of ``logs`` (name -> records) in order, each child right under its
    parent, with its depth (0: no parent among them), for ``loopd sessions``."""
    children: dict[str, list[str]] = {}
    roots = []
    for name in sorted(logs):
        parent = parent_of(name, logs[name])
        if parent in logs and parent != name:
            children.setdefault(parent, []).append(name)
        else:
            roots.append(name)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()

    def walk(name: str, depth: int) -> None:
        if name in seen:  # a link loop (hand-made logs): each once
            return
        seen.add(name)
        out.append((name, depth))
        for child in children.get(name, []):
            walk(child, depth + 1)

    for root in roots:
        walk(root, 0)
    for name in sorted(logs):  # only in a loop: listed all the same
        walk(name, 0)
    return out
