"""What the person sees while a turn runs: rich output on the terminal, or JSON lines.

Reasoning is dimmed, the answer streams as it comes, prompt processing shows as a bar,
each tool call shows with the class of its result, and every turn ends with one summary
line (prompt tokens, how many came from the cache, generated tokens, time, tool calls).
Text from outside loopd (a model's, a tool's, a server's) is escaped before it meets rich
markup: "[/]" in a tool's arguments would otherwise raise in the sink and end the turn; no
byte of it reaches the terminal as a control sequence (:mod:`actors.cli.terminal`).
"""

from __future__ import annotations

import threading
import time
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from actors.base import events as ev
from actors.cli.terminal import ReaderGone, json_line, quiet
from actors.log import records as rec
from actors.service.types import TurnOutcome

__all__ = [
    "CUT_WORDS",
    "JsonView",
    "LiveView",
    "compacted",
    "compacting",
    "decided",
    "describe",
    "notice",
    "summary",
    "time_left",
    "torn_tail",
    "torn_tail_left",
]


# What the summary line says of a cut answer, by its finish_reason (the event and the log's
# Cut record say it in full).
CUT_WORDS = {
    "length": "answer cut at loop.max_tokens",
    "repeat": "answer cut: it repeated itself (loop.runaway_repeat_tokens)",
    "copy": "answer cut: it copied the prompt word for word (loop.runaway_copy_tokens)",
    "echo": "answer cut: it gave again what an earlier answer copied (loop.runaway_echo_tokens)",
    "timeout": "answer cut: the request timed out; what streamed is kept",
    "error": "answer cut: the stream failed; what streamed is kept",
}


def summary(outcome: TurnOutcome, seconds: float) -> str:
    """The one line that closes a turn."""
    timings = outcome.usage.timings
    cached = int(timings.get("cache_n", 0))
    cut = f" · {CUT_WORDS.get(outcome.usage.finish_reason, CUT_WORDS['length'])}" if (
        outcome.cut) else ""
    if outcome.compactions:
        times = "" if outcome.compactions == 1 else f" {outcome.compactions} times"
        cut += f" · conversation compacted{times} (loopd log show has it all)"
    slot = outcome.restored
    restored = (f"; restored {slot.restored:,} tokens in {slot.restore_ms:.0f} ms"
                + (f" ({slot.reason})" if slot.reason else "") if slot is not None else "")
    return (
        f"{outcome.usage.prompt_tokens} prompt tokens ({cached} from cache{restored}) · "
        f"{outcome.usage.completion_tokens} generated · {seconds:.1f} s · "
        f"{outcome.tool_calls} tool call{'s' if outcome.tool_calls != 1 else ''}{cut}"
    )


_WHY = {"auto": "the next prompt would pass session.compact_at of the context",
        "person": "asked for", "overflow": "the server said the prompt exceeds its context"}


def compacting(why: str, tokens: int, how: str) -> str:
    """What the live view says when a compaction starts."""
    writer = "the model writes a summary" if how == "summary" else "the old turns listed"
    return (f"compacting the conversation ({_WHY.get(why, why)}): {tokens:,} tokens; "
            f"{writer}, the last turns kept word for word (the log keeps everything)")


def compacted(event: ev.Compacted) -> str:
    """What the live view (and a turn's summary line) says of a compaction done."""
    turns = f"{event.turns_kept} turn{'s' if event.turns_kept != 1 else ''}"
    return (f"compacted: {event.tokens_before:,} -> about {event.tokens_after:,} tokens, "
            f"{turns} kept verbatim, {event.ms / 1000:.1f} s")


def notice(event: ev.Event) -> str:
    """The words of a notice (a turn's own, shown in yellow, or a child agent's, indented
    under its name); "" when ``event`` is not one."""
    match event:
        case ev.CacheLossEvent(expected=expected, got=got, cause=cause):
            why = f" ({cause})" if cause else ""
            return f"prompt cache lost: {got} of {expected} tokens reused{why}"
        case ev.Compacting(why=why, tokens_before=before, how=how):
            return compacting(why, before, how)
        case ev.Compacted():
            return compacted(event)
        case ev.TornTail(session=session, cut_bytes=cut):
            return torn_tail(session, cut)
        case ev.ThinkingCapped(cap=cap):
            return f"thinking capped at {cap} tokens"
        case ev.AnswerCut(note=note):
            return note
    return ""


def decided(event: ev.ApprovalDecided) -> str:
    """What was decided for a call that needed approval, in words."""
    return _decided(event.decision, event.scope, event.by, event.rule, event.reason)


def time_left(done: int, left: int, seconds: float) -> str:
    """What prompt processing has still to go, once its rate is known: ``done`` tokens
    processed in ``seconds`` (cached ones not counted), ``left`` to go; "" until then."""
    if done <= 0 or seconds <= 0 or left <= 0:
        return ""
    eta = left * seconds / done
    if eta < 1:
        return "under a second left"
    return f"about {eta:.0f} s left" if eta < 90 else f"about {eta / 60:.0f} min left"


def torn_tail(session: str, cut_bytes: int) -> str:
    """What opening a session says when it cut a torn last record."""
    return (f"session {session}: the log ended in a torn record (a write cut short by a crash); "
            f"cut {cut_bytes:,} bytes, every whole record kept")


def torn_tail_left(session: str, torn_bytes: int) -> str:
    """What ``loopd log show`` says of bytes after the last whole record (it cuts nothing)."""
    return (f"session {session}: the log ends in {torn_bytes:,} bytes that are not a whole "
            "record (a write cut short by a crash, or one being written now); not shown: the "
            "session's next run or chat cuts them")


def _short(text: str | None, limit: int = 160) -> str:
    if text is None:
        return "-"
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def describe(record: rec.Record) -> str:
    """One readable line for a record (``loopd log show``); ``--json`` has every field."""
    match record:
        case rec.Baseline():
            names = ", ".join(t.get("function", {}).get("name", "?") for t in record.tools)
            return f"model {record.model}; tools: {names}; system: {_short(record.system, 80)}"
        case rec.User():
            return _short(record.content)
        case rec.Assistant():
            calls = "; ".join(f"{c.name}({_short(c.arguments, 80)}) id={c.id}"
                              for c in record.tool_calls)
            thought = f" [reasoning: {len(record.reasoning)} chars]" if record.reasoning else ""
            return f"{_short(record.content)}{thought}" + (f" -> {calls}" if calls else "")
        case rec.Usage():
            capped = ", thinking capped" if record.thinking_capped else ""
            return (f"{record.prompt_tokens} prompt ({record.timings.get('cache_n', '?')} cached), "
                    f"{record.completion_tokens} generated, {record.reasoning_tokens} reasoning, "
                    f"finish {record.finish_reason}{capped}{_slot(record.slot)}")
        case rec.Cut():
            return f"loopd cut the response above ({record.why}): {record.note}"
        case rec.CacheLoss():
            cause = f" ({record.cause})" if record.cause else ""
            return (f"prompt cache lost: expected {record.expected} tokens, "
                    f"reused {record.got}{cause}")
        case rec.ToolResult():
            flags = "".join([" untrusted" if record.untrusted else "",
                             " truncated" if record.truncated else ""])
            return (f"call {record.call} (id {record.tool_call_id}) {record.class_.value}{flags}: "
                    f"{_short(record.content)}")
        case rec.Approval():
            return (f"call {record.call} {record.tool}: " + _decided(
                record.decision.value, record.scope.value, record.by, record.rule,
                record.reason))
        case rec.Compaction():
            return (f"({record.by.value}) at {record.tokens_before:,} prompt tokens: from here "
                    f"on the model sees this summary and the records from #{record.kept + 1} "
                    f"on; summary{_OUTSIDE if record.outside else ''}: "
                    f"{_short(record.summary, 240)}")
        case rec.Forked():
            return (f"forked from session {record.from_} after its turn {record.at}: the "
                    "records before this one are its, as they were")
        case rec.AgentLink():
            return (f"agent: session {record.parent} handed session {record.child} a task "
                    f"({record.context}): {_short(record.task)}")
        case rec.Rewind():
            back = f"turn {record.to_turn}" if record.to_turn else "its start"
            why = f"; refused for a full context: {record.refused}" if record.refused else ""
            return (f"the conversation goes back to {back}: the turns after it are rewound "
                    f"(kept here, no longer sent){why}")
    raise AssertionError(f"no description for {type(record).__name__}")


_OUTSIDE = " (holds text from outside: untrusted tool results, marked so for the model)"


def _decided(decision: str, scope: str, by: str, rule: str, reason: str) -> str:
    """One line for an approval decision (the live view and ``loopd log show``)."""
    if decision != "allow":
        return f"denied ({by}): {reason}" if reason else f"denied ({by})"
    if by == "rule":
        line = f"allowed by the rule {rule}"
    elif by == "session":
        line = f"allowed by this session's earlier answer ({rule})"
    elif scope == "once":
        line = f"allowed once ({by})"
    else:
        line = f"allowed {'for this session' if scope == 'session' else 'always'}: {rule} ({by})"
    return f"{line}; {reason}" if reason else line


def _slot(use: rec.SlotUse | None) -> str:
    """What the slot keeper did, for a Usage line; "" for logs written before it."""
    if use is None:
        return ""
    where = f"; {use.server} slot {use.slot}"
    if use.state is rec.SlotState.RESTORED:
        origin = f" ({use.reason})" if use.reason else ""  # a fork's: its source's state
        return f"{where}: restored {use.restored:,} tokens in {use.restore_ms:.0f} ms{origin}"
    if use.state is rec.SlotState.KEPT:
        return f"{where}: state kept in the slot"
    return f"{where}: nothing restored ({use.reason or 'nothing saved'})"


class LiveView:
    """A sink for turn events that draws them with rich; thread-safe (events come from actors)."""

    def __init__(self, console: Console, answer: Console | None = None,
                 stream: bool = True) -> None:
        self.console = console  # the live view (stderr for `run`)
        self.answer = answer or console  # where answer text streams
        self.stream = stream  # False: answer text is not streamed (it is printed whole)
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._since = (0.0, 0)  # when the bar started, and the tokens processed then
        self._mode = ""  # "reasoning" | "content" | "": what the current line holds
        self.started = time.monotonic()

    def __call__(self, event: ev.Event) -> None:
        with self._lock:
            self._show(event)

    def _show(self, event: ev.Event) -> None:
        """One event of the turn: streamed text, a tool call, a notice, an agent, a wait."""
        if self._stream(event):
            return
        words = notice(event)
        if words:
            self._switch("")
            self.console.print(f"[yellow]{escape(words)}[/]", highlight=False)
            return
        match event:
            case ev.ToolCallStarted(name=name, arguments=args):
                self._switch("")
                shown = args if len(args) <= 120 else args[:117] + "..."
                self.console.print(f"[bold cyan]→ {escape(name)}[/] {escape(shown)}",
                                   highlight=False)
            case ev.ToolResultEvent(name=name, class_=cls, truncated=cut, outcome=outcome):
                note = " (truncated)" if cut else ""
                self.console.print(f"  [cyan]← {escape(name)}[/]: {escape(outcome)}, "
                                   f"{escape(cls)}{note}")
            case ev.AgentStarted() | ev.AgentDone() | ev.AgentEvent():
                self._agents(event)
            case _:
                self._asked(event)

    def _stream(self, event: ev.Event) -> bool:
        """The prompt's progress bar and the streamed text; False: not such an event."""
        match event:
            case ev.Progress(processed=done, total=total, cache=cache, time_ms=ms):
                self._bar(done, total, cache, ms)
            case ev.Reasoning(text=text):
                self._switch("reasoning")
                self.console.print(text, style="dim", end="", markup=False, highlight=False)
            case ev.Content(text=text):
                if self.stream:
                    self._switch("content")
                    self.answer.print(text, end="", markup=False, highlight=False)
            case ev.Retrying(attempt=n, delay=delay, reason=reason):
                streamed = self._mode in ("reasoning", "content")
                self._switch("")
                dropped = " (the partial answer above is dropped)" if streamed else ""
                self.console.print(
                    f"[yellow]retrying ({n}) in {delay:.1f} s: {escape(reason)}{dropped}[/]",
                    highlight=False,
                )
            case _:
                return False
        return True

    def _asked(self, event: ev.Event) -> None:
        """Approvals, questions, a tool's progress and a wait for a slot."""
        match event:
            case ev.ApprovalRequested() | ev.ElicitationRequested():
                self._switch("")  # the approver (actors.cli.approvers) asks on this console
            case ev.ToolProgress(tool=tool, done=done, total=total, message=message):
                self._switch("")
                of = f"/{total:g}" if total else ""
                note = f": {message}" if message else ""
                self.console.print(f"  [dim]… {escape(tool)} {done:g}{of}{escape(note)}[/]",
                                   highlight=False)
            case ev.ElicitationAnswered(action=action, by=by):
                self._switch("")
                said = {"accept": "answered", "decline": "declined", "cancel": "cancelled"}
                self.console.print(f"  [{'green' if action == 'accept' else 'yellow'}]"
                                   f"{said.get(action, escape(action))} ({escape(by)})[/]",
                                   highlight=False)
            case ev.ApprovalDecided(decision=decision):
                self._switch("")
                self.console.print(f"  [{'green' if decision == 'allow' else 'yellow'}]"
                                   f"{escape(decided(event))}[/]", highlight=False)
            case ev.Queued(ahead=ahead, waiting_for=what, sessions=others):
                self._switch("")
                whom = f", in use by {'sessions' if ',' in others else 'session'} {others}"
                self.console.print(
                    f"[dim]queued: waiting for {escape(what)}"
                    f"{escape(whom) if others else ''} ({ahead} in line)[/]", highlight=False,
                )

    def _agents(self, event: ev.Event) -> None:
        """A child agent's start and end, and its events indented under its name: its calls,
        results and notices; its text streams only into its answer (the parent's call
        result)."""
        match event:
            case ev.AgentStarted(agent=agent, task=task, context=context):
                self._switch("")
                self.console.print(f"[bold magenta]⇉ agent {escape(agent)}[/] "
                                   f"({escape(context)}): "
                                   f"{escape(_short(task, 100))}", highlight=False)
            case ev.AgentDone(agent=agent, ok=ok, tokens=tokens, seconds=seconds, reason=why):
                self._switch("")
                ended = "answered" if ok else f"failed: {_short(why, 160)}"
                self.console.print(f"  [magenta]⇇ agent {escape(agent)}[/]: {escape(ended)} "
                                   f"({tokens:,} tokens, {seconds:.1f} s)", highlight=False)
            case ev.AgentEvent(agent=agent, event=inner):
                line = ""
                match inner:
                    case ev.ToolCallStarted(name=name, arguments=args):
                        line = f"→ {name} {_short(args, 100)}"
                    case ev.ToolResultEvent(name=name, outcome=outcome, class_=cls):
                        line = f"← {name}: {outcome}, {cls}"
                    case ev.ApprovalDecided():
                        line = decided(inner)
                    case ev.ApprovalRequested() | ev.ElicitationRequested():
                        self._switch("")  # the approver asks on this console
                    case _:
                        line = notice(inner)
                if line:
                    self._switch("")
                    self.console.print(f"    [dim]{escape(agent)}[/] {escape(line)}",
                                       highlight=False)

    def _bar(self, done: int, total: int, cache: int, time_ms: float) -> None:
        now = time.monotonic()
        if self._progress is None:
            self._switch("")
            self._progress = Progress(
                TextColumn("prompt"), BarColumn(),
                TextColumn("{task.completed:,}/{task.total:,} tokens"),
                TextColumn(f"({cache:,} cached)"), TextColumn("{task.fields[left]}"),
                console=self.console, transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("prompt", total=max(total, 1), left="")
            self._since = (now, done)
        assert self._task is not None
        # the server's own clock when it gives one, else ours from the first progress seen
        start, base = (time_ms / 1000, cache) if time_ms > 0 else (now - self._since[0],
                                                                   self._since[1])
        self._progress.update(self._task, completed=done, total=max(total, 1),
                              left=time_left(done - base, total - done, start))
        if done >= total:
            self._stop_bar()

    def _stop_bar(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _switch(self, mode: str) -> None:
        self._stop_bar()
        if self._mode and mode != self._mode:
            (self.answer if self._mode == "content" else self.console).print()
        self._mode = mode

    def finish(self) -> None:
        with self._lock:
            self._switch("")


class JsonView:
    """A sink that writes every event as one JSON line (for scripts: ``--json``).

    When the reader goes away (``loopd run --json | head``) the view writes nothing more and
    points the stream at /dev/null (so the interpreter's last flush is quiet too); ``closed``
    says so to the in-process turn's wait (which cancels the turn), and a line written from
    the main thread (a daemon turn's events, the last line) raises :class:`ReaderGone`, which
    cancels the turn the way Ctrl-C does and ends the command quietly."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.closed = False
        self._lock = threading.Lock()

    def __call__(self, event: ev.Event) -> None:
        self.line(ev.to_json(event))

    def line(self, data: dict[str, Any]) -> None:
        with self._lock:
            if not self.closed:
                try:
                    self.out.write(json_line(data) + "\n")
                    self.out.flush()
                    return
                except BrokenPipeError:
                    self.closed = True
                    quiet(self.out)
        if threading.current_thread() is threading.main_thread():
            raise ReaderGone
