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
import json
import os
import select
import shlex
import termios
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape

from actors.base.cancel import CancelToken
from actors.base.events import ApprovalRequested, Choice, Decision
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
            with _cbreak(self.fd):
                if not _wait_readable(self.fd, cancel, deadline):
                    self._gone(cancel)
                    return None
                key = os.read(self.fd, 1).decode(errors="replace").lower()
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
