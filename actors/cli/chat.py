"""``loopd chat``: turns typed at a prompt, chat commands, and how full the conversation is.

A line that starts with a slash and one word (``/help``, ``/new``) is a chat command: it
never goes to the model. The commands are one table (:data:`actors.cli.chat_commands.COMMANDS`)
the chat is given: each command's function lives with its kind of work (``/undo`` in
actors.cli.branch, ``/compact`` in actors.cli.compact) and ``/help`` lists the table; an
unknown one is said, not sent. ``//text`` sends ``/text``; a path (``/etc/hosts ...``) is text.

How full the conversation is (actors.cli.fullness): said after each turn from 75% of the
context on, with the ways on (the chat commands among them that exist), and after a turn
refused for a full context. A session opened nearly full (the last one ended there) says
so at once instead of failing on the next message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import time
from collections.abc import Callable, Mapping

from rich.console import Console
from rich.markup import escape

from actors.base.errors import LoopdError, SessionFull
from actors.cli.conversation import Conversation, shown_size
from actors.cli.fullness import size_note, ways_on
from actors.cli.view import LiveView, summary
from actors.log.sessiondir import list_sessions
from actors.service.types import TurnOutcome

__all__ = ["Chat", "Command", "line_reader", "new_session", "parse", "run_chat", "show_help"]

_WORD = re.compile(r"/([a-z][a-z-]*)(?:\s+(.*))?", re.DOTALL)


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    """A chat command: ``run(chat, argument)``; ``summary`` is its line in /help."""

    name: str
    usage: str  # e.g. "/new [NAME]"
    summary: str
    run: Callable[[Chat, str], None]


def parse(line: str) -> tuple[str, str] | str:
    """A typed line as ``(command, argument)``, or the text to send to the model."""
    if line.startswith("//"):
        return line[1:]
    found = _WORD.fullmatch(line.strip())
    if found is None:
        return line
    return found.group(1), (found.group(2) or "").strip()


@dataclasses.dataclass
class Chat:
    """One ``loopd chat``: the conversation, the console, the chat commands by name."""

    conversation: Conversation
    out: Console
    commands: Mapping[str, Command]

    @property
    def session(self) -> str:
        return self.conversation.name

    def say(self, text: str, style: str = "dim") -> None:
        self.out.print(f"[{style}]{escape(text)}[/]", highlight=False)

    def greet(self) -> None:
        self.say(f"session {self.session}: Ctrl-C cancels a turn, Ctrl-D leaves, /help lists "
                 "the chat commands")
        used = shown_size(self.conversation.config, self.session)
        if used:
            self.size(used, opened=True)

    def size(self, used: int, *, opened: bool = False) -> None:
        """Say how full the conversation is, when that is worth saying."""
        note = size_note(self.session, used, self.conversation.context(), self.commands,
                         chat=True,
                         opened=opened)
        if note is not None:
            self.say(note, "yellow")

    def line(self, text: str) -> None:
        """One typed line: a command, or a turn."""
        parsed = parse(text)
        if isinstance(parsed, tuple):
            name, argument = parsed
            found = self.commands.get(name)
            if found is None:
                self.say(f"there is no chat command /{name}: /help lists them (a message that "
                         "starts with / is sent as //...)", "yellow")
                return
            try:
                found.run(self, argument)
            except LoopdError as e:
                self.out.print(f"[red]{escape(str(e))}[/]", highlight=False)
            return
        self.turn(parsed)

    def turn(self, message: str) -> None:
        live = LiveView(self.out)
        started = time.monotonic()
        try:
            outcome: TurnOutcome = self.conversation.turn(message, live)
        except LoopdError as e:
            live.finish()
            self.out.print(f"[red]{escape(str(e))}[/]", highlight=False)
            if isinstance(e, SessionFull):
                self.say(ways_on(self.session, self.commands, chat=True), "yellow")
            return
        live.finish()
        self.say(summary(outcome, time.monotonic() - started))
        self.size(outcome.usage.prompt_tokens + outcome.usage.completion_tokens)


def show_help(chat: Chat, argument: str) -> None:
    """``/help``: the chat's commands."""
    chat.say("Chat commands (never sent to the model):", "bold")
    for found in sorted(chat.commands.values(), key=lambda c: c.name):
        chat.out.print(f"  {escape(found.usage):<14} {escape(found.summary)}", highlight=False)
    chat.say("Anything else is a message to the model; //text sends /text. Ctrl-C cancels a "
             "turn, Ctrl-D leaves.")


def new_session(chat: Chat, argument: str) -> None:
    """``/new [NAME]``: chat on in a new session, this one kept."""
    config = chat.conversation.config
    taken = set(list_sessions(config))
    if argument and argument in taken:
        chat.say(f"session {argument} exists: /new makes a new one (to go on with {argument}: "
                 f"loopd chat --session {argument})", "yellow")
        return
    base = re.sub(r"-\d+$", "", chat.session)
    name = argument or next(f"{base}-{n}" for n in range(2, 10_000)
                            if f"{base}-{n}" not in taken)
    left = chat.session
    chat.conversation.switch(name)
    chat.say(f"session {name}: a new conversation (session {left} is kept: loopd chat "
             f"--session {left} goes back to it)")


def line_reader(prompt: str = "> ") -> Callable[[], str]:
    """The chat prompt's ``input()``: on a terminal through GNU readline when Python has it,
    so a line may be of any length (the terminal's own line discipline cuts one at 4,095
    bytes without a word: a pasted text lost its end) and can be edited."""
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (imported, input() reads through it)
    return lambda: input(prompt)


def run_chat(chat: Chat, read: Callable[[], str], interrupted: Callable[[BaseException], bool]
             ) -> None:
    """Lines from ``read`` until it raises EOFError; ``interrupted(e)`` says whether an
    interrupt at the prompt only clears the line (Ctrl-C) or must end the chat (SIGTERM)."""
    chat.greet()
    while True:
        try:
            text = read()
        except EOFError:
            chat.out.print()
            return
        except KeyboardInterrupt as e:
            if not interrupted(e):
                raise
            chat.out.print()
            continue
        if text.strip():
            chat.line(text)
