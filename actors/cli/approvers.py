"""The CLI's approvers (actors.approval.gate's ``Approver``): the terminal, JSON lines, nobody.

- :class:`TerminalApprover` (``loopd chat``, ``loopd run`` on a terminal): shows the tool, its
  arguments (long ones folded; ``v`` shows them whole) and the choices, and takes one key:
  ``y`` allow once, ``s`` for this session, ``a`` always (saved as a rule), ``n`` deny (then
  an optional reason for the model, one line). The terminal is in cbreak mode only while
  the key is read, so Ctrl-C stays a signal: the CLI cancels the turn and the approver sees
  the token at once.
- :class:`JsonApprover` (``loopd run --json``): the ``approval_requested`` event is already on
  stdout as a JSON line (the JSON view printed it); the answer is one JSON line on stdin,
  ``{"decision": "once" | "session" | "always" | "deny", "reason": "..."}``. A line that is
  not such an answer is reported as an ``approval_invalid`` line and another is awaited; the
  end of stdin is a denial.
- :class:`NoTerminal` (``loopd run`` without a terminal): denies, naming the ``--approve``
  flag (and the rule) that would allow the call.

Each waits on stdin with ``select`` in short steps so a cancel or the deadline ends the wait
within a tenth of a second; none holds anything the turn needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import shlex
import termios
import time
import tty
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape

from actors.base.cancel import CancelToken
from actors.base.events import (
    ApprovalRequested,
    Choice,
    Decision,
    ElicitationRequested,
    Elicited,
)
from actors.base.rules import parse_rule

__all__ = [
    "KEYS", "JsonApprover", "NoTerminal", "TerminalApprover", "allows", "approve_flag", "fold",
]

KEYS = {"y": Choice.ONCE, "s": Choice.SESSION, "a": Choice.ALWAYS, "n": Choice.DENY}
_STEP = 0.1  # seconds between looks at the cancel token and the clock
FOLD_CHARS, FOLD_LINES = 300, 6


def fold(value: Any, chars: int = FOLD_CHARS, lines: int = FOLD_LINES) -> str:
    """An argument's value for the prompt: text as it is, cut after ``lines`` lines or
    ``chars`` characters with a note of how much more there is."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    shown = "\n".join(text.splitlines()[:lines])[:chars]
    if len(shown) >= len(text):
        return text
    return f"{shown}… [{len(text) - len(shown)} more characters; v shows all]"


def _arguments(request: ApprovalRequested) -> dict[str, Any]:
    try:
        parsed = json.loads(request.arguments)
    except ValueError:
        return {"arguments": request.arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def _wait_readable(fd: int, cancel: CancelToken, deadline: float) -> bool:
    """True when ``fd`` has input; False on cancel or at the deadline."""
    while not cancel.cancelled:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], min(_STEP, left))
        if ready:
            return True
    return False


class _Lines:
    """Lines from ``fd``, read without blocking past a cancel or a deadline; bytes after a
    line (answers sent ahead) are kept for the next call."""

    def __init__(self, fd: int) -> None:
        self.fd, self._buffer = fd, b""

    def read(self, cancel: CancelToken, deadline: float) -> str | None:
        """The next line (without its newline); None on cancel, deadline or end of input."""
        while b"\n" not in self._buffer:
            if not _wait_readable(self.fd, cancel, deadline):
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:  # the end: a last line without a newline still counts
                rest, self._buffer = self._buffer, b""
                return rest.decode(errors="replace") if rest else None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")


@contextlib.contextmanager
def _cbreak(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class TerminalApprover:
    """The inline prompt: one key per answer, on the terminal of ``fd`` (stdin)."""

    def __init__(self, console: Console, fd: int = 0) -> None:
        self.console, self.fd = console, fd

    def __call__(
        self, request: ApprovalRequested, cancel: CancelToken, deadline: float
    ) -> Decision | None:
        self._show(request, whole=False)
        choices = {k: c for k, c in KEYS.items() if request.rule or c in (Choice.ONCE,
                                                                          Choice.DENY)}
        while True:
            if (key := self._key(cancel, deadline)) is None:
                return None
            if key == "v":
                self._show(request, whole=True)
            elif key in choices:
                break
            else:
                keys = "/".join(choices)
                self.console.print(f"[dim]press {keys} (or v to see all arguments)[/]")
        choice = choices[key]
        self.console.print()  # the key is not echoed: the decision's own line says it
        if choice is not Choice.DENY:
            return Decision(choice)
        self.console.print("reason for the model (Enter for none): ", end="")
        reason = _Lines(self.fd).read(cancel, deadline)
        if reason is None and cancel.cancelled:
            self._gone(cancel)
            return None
        return Decision(Choice.DENY, (reason or "").strip())

    def _key(self, cancel: CancelToken, deadline: float) -> str | None:
        """One key pressed, in lower case; None (and said so) when the turn was cancelled or
        the deadline passed first."""
        with _cbreak(self.fd):
            if not _wait_readable(self.fd, cancel, deadline):
                self._gone(cancel)
                return None
            return os.read(self.fd, 1).decode(errors="replace").lower()

    def elicit(
        self, request: ElicitationRequested, cancel: CancelToken, deadline: float
    ) -> Elicited | None:
        """An MCP server's question: its message and form (each field with its default),
        then a key: ``a`` answer (field by field, Enter keeps the default), ``n`` decline,
        ``c`` cancel."""
        say = self._say
        fields, required = form_of(request.fields)
        say(f"[bold yellow]? {escape(request.server)}[/] asks [dim](during {escape(request.tool)}"
            f", call {request.call})[/]: {escape(request.message)}")
        for name, prop in fields.items():
            say(f"    [cyan]{escape(name)}[/]: {escape(describe(prop, name in required))}")
        say("  [bold]a[/]  answer [dim](field by field; Enter keeps the default)[/]")
        say("  [bold]n[/]  decline")
        say("  [bold]c[/]  cancel")
        limit = (f"no answer in {request.timeout_s:g} s cancels it; "
                 if request.timeout_s > 0 else "")
        say(f"  [dim]{limit}Ctrl-C cancels the turn[/] ", end="")
        while True:
            if (key := self._key(cancel, deadline)) is None:
                return None
            if key in ("a", "n", "c"):
                break
            self.console.print("[dim]press a, n or c[/]")
        self.console.print()
        if key != "a":
            return Elicited("decline" if key == "n" else "cancel")
        lines, content = _Lines(self.fd), {}
        for name, prop in fields.items():
            while True:
                shown = f" [{_text(prop['default'])}]" if "default" in prop else ""
                self.console.print(f"  {escape(name)}{escape(shown)}: ", end="",
                                   highlight=False)
                line = lines.read(cancel, deadline)
                if line is None:
                    self._gone(cancel)
                    return None
                value = read_value(line.strip(), prop, name in required)
                if isinstance(value, Problem):
                    self.console.print(f"[yellow]{escape(value.text)}[/]", highlight=False)
                    continue
                if value is not _UNSET:
                    content[name] = value
                break
        return Elicited("accept", content)

    def _show(self, request: ApprovalRequested, *, whole: bool) -> None:
        say = self._say
        say(f"[bold yellow]? {escape(request.tool)}[/] wants to run [dim](call {request.call})[/]")
        if request.prompt.startswith("loopd: "):  # loopd's own word on why it asks
            say(f"  [yellow]{escape(request.prompt.splitlines()[0])}[/]")
        for key, value in _arguments(request).items():
            text = (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                    ) if whole else fold(value)
            say(f"    [cyan]{escape(str(key))}[/]: {escape(text)}")
        say("  [bold]y[/]  allow once")
        if request.rule:
            reach = escape(allows(request.rule))
            say(f"  [bold]s[/]  allow for this session: {reach}")
            say(f"  [bold]a[/]  always allow: {reach} [dim](saved in your rules file: every "
                "session, every workspace, until you remove it)[/]")
        else:
            say("  [dim](only once: no rule can match this call, e.g. a command with shell "
                "operators)[/]")
        say("  [bold]n[/]  deny")
        limit = (f"no answer in {request.timeout_s:g} s denies it; "
                 if request.timeout_s > 0 else "")
        say(f"  [dim]{limit}Ctrl-C cancels the turn[/] ", end="")

    def _say(self, text: str, end: str = "\n") -> None:
        self.console.print(text, highlight=False, soft_wrap=True, end=end)

    def _gone(self, cancel: CancelToken) -> None:
        self.console.print("[yellow]cancelled[/]" if cancel.cancelled
                           else "[yellow]no answer in time[/]")


# --- an MCP server's form (elicitation), field by field -------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """Why a typed value does not fit its field (the person types it again)."""

    text: str


_UNSET = object()  # an optional field left empty: not sent


def form_of(fields: str) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """The form's fields (name -> property schema) and the names it requires."""
    try:
        schema = json.loads(fields)
    except ValueError:
        return {}, set()
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return {}, set()
    required = schema.get("required", [])
    return ({str(k): v for k, v in props.items() if isinstance(v, dict)},
            {r for r in required if isinstance(r, str)} if isinstance(required, list) else set())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def describe(prop: Mapping[str, Any], required: bool) -> str:
    """A field as the person reads it: its title or description, type, choices, default."""
    kind = prop.get("type", "string")
    words = [str(prop.get("description") or prop.get("title") or "")]
    choices = prop.get("enum") or (prop.get("items") or {}).get("enum")
    what = f"{kind}, one of {', '.join(_text(c) for c in choices)}" if choices else str(kind)
    words.append(f"({what}{', required' if required else ''})")
    if "default" in prop:
        words.append(f"default: {_text(prop['default'])}")
    return " ".join(w for w in words if w)


def read_value(text: str, prop: Mapping[str, Any], required: bool) -> Any:
    """The value typed for a field, as its type; the default for an empty line; _UNSET
    for an empty optional field; a :class:`Problem` when it does not fit."""
    if not text:
        if "default" in prop:
            return prop["default"]
        return Problem("this field is required: type a value") if required else _UNSET
    kind = prop.get("type", "string")
    value: Any = text
    try:
        if kind == "integer":
            value = int(text)
        elif kind == "number":
            value = float(text)
        elif kind == "boolean":
            yes, no = ("y", "yes", "true", "1"), ("n", "no", "false", "0")
            if text.lower() not in yes + no:
                return Problem("type yes or no")
            value = text.lower() in yes
        elif kind == "array":
            value = [part.strip() for part in text.split(",") if part.strip()]
    except ValueError:
        return Problem(f"not {'an' if kind == 'integer' else 'a'} {kind}: {text}")
    choices = prop.get("enum") or (prop.get("items") or {}).get("enum")
    if choices:
        bad = [v for v in (value if isinstance(value, list) else [value]) if v not in choices]
        if bad:
            return Problem(f"not one of {', '.join(_text(c) for c in choices)}: {_text(bad[0])}")
    return value


class JsonApprover:
    """The answer as one JSON line on stdin; problems reported with ``say`` (a JSON line)."""

    def __init__(self, say: Callable[[dict[str, Any]], None], fd: int = 0) -> None:
        self.say, self.lines = say, _Lines(fd)

    def __call__(
        self, request: ApprovalRequested, cancel: CancelToken, deadline: float
    ) -> Decision | None:
        while True:
            line = self.lines.read(cancel, deadline)
            if line is None:
                if cancel.cancelled or time.monotonic() >= deadline:
                    return None
                return Decision(Choice.DENY, "stdin ended before an answer came",
                                by="no answer on stdin")
            if not line.strip():
                continue
            decision = parse_answer(line)
            if isinstance(decision, Decision):
                return decision
            self.say({"event": "approval_invalid", "call": request.call, "message": decision})

    def elicit(
        self, request: ElicitationRequested, cancel: CancelToken, deadline: float
    ) -> Elicited | None:
        """The answer as one JSON line on stdin: ``{"action": "accept", "content": {...}}``,
        ``{"action": "decline"}`` or ``{"action": "cancel"}``; the end of stdin declines."""
        while True:
            line = self.lines.read(cancel, deadline)
            if line is None:
                if cancel.cancelled or time.monotonic() >= deadline:
                    return None
                return Elicited("decline")
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError:
                data = None
            if (isinstance(data, dict) and data.get("action") in ("accept", "decline", "cancel")
                    and isinstance(data.get("content", {}), dict)):
                return Elicited(data["action"], dict(data.get("content", {}))
                                if data["action"] == "accept" else {})
            self.say({"event": "elicitation_invalid", "call": request.call, "message":
                      'an answer is a JSON object with "action" (accept, decline or cancel) and, '
                      'to accept, "content" (the form\'s values by field)'})


def parse_answer(line: str) -> Decision | str:
    """A JSON answer line as a Decision, or what is wrong with it."""
    allowed = ", ".join(c.value for c in Choice)
    try:
        data = json.loads(line)
    except ValueError as e:
        return f"not JSON ({e}); send e.g. {{\"decision\": \"once\"}}"
    if not isinstance(data, dict) or "decision" not in data:
        return f'an answer is a JSON object with "decision" ({allowed})'
    try:
        choice = Choice(data["decision"])
    except ValueError:
        return f"decision {data['decision']!r} is not one of {allowed}"
    reason = data.get("reason", "")
    if not isinstance(reason, str):
        return '"reason" must be a string'
    return Decision(choice, reason)


def allows(rule: str) -> str:
    """What an "allow for this session" or "always" answer granting ``rule`` lets run
    without asking, in words (the rule in brackets)."""
    try:
        parsed = parse_rule(rule)
    except ValueError:
        return rule
    if parsed.prefix is None:
        return f"every {parsed.tool} call, whatever its arguments [{rule}]"
    words = str(parsed).split(" = " if parsed.exact else ": ", 1)[1]
    if parsed.tool == "run_command":
        what = f"the command `{words}`"
        return (f"{what} exactly, nothing added [{rule}]" if parsed.exact
                else f"commands starting with `{words}` [{rule}]")
    if parsed.exact:
        return f"{parsed.tool} on the path {words} only [{rule}]"
    return f"{parsed.tool} on paths under {words} [{rule}]"


def approve_flag(request: ApprovalRequested) -> str:
    """The ``--approve`` flag that would allow this call, as one would type it."""
    return f"--approve {shlex.quote(request.rule or request.tool)}"


class NoTerminal:
    """``loopd run`` with nobody to ask: deny, and say which flag or rule would allow it."""

    def __call__(
        self, request: ApprovalRequested, cancel: CancelToken, deadline: float
    ) -> Decision:
        flag = approve_flag(request)
        if request.rule:
            how = (f"run again with {flag}, or add \"{request.rule}\" to tools.allow "
                   "(or the rules file)")
        else:
            how = (f"a command with shell operators matches no prefix rule: only {flag} "
                   "(every call of the tool) would allow it")
        return Decision(Choice.DENY, f"there is no terminal to ask for approval; {how}",
                        by="no terminal")
