"""Every error loopd raises on purpose, under one root, each with the exit code it means.

The CLI catches :class:`LoopdError` and nothing else: it prints the message and exits with
``exit_code``. Anything else that escapes is a bug and shows its traceback. A message names
the thing that failed and what to do about it.

::

    LoopdError                      exit 1: a failure that fits no group below
    ├── UsageError                  exit 2: bad usage, config or set-up; fix it and run again
    │   ├── ConfigError               a config value (the key is named)
    │   ├── KeyFileError              a CURVE key file or key text
    │   └── RulesError                the approval rules file (the line is named)
    ├── LimitError                  exit 3: a limit ended the turn; the log is whole
    │   ├── TurnLimit                 tool iterations, repeated call, calls per response
    │   └── SessionFull               the conversation no longer fits the context
    ├── ServerError                 exit 4: the model server (or a process loopd needs) failed
    │   ├── InferError                one request (kinds: http, connect, timeout, protocol,
    │   │                             cancelled); in actors.inference.types
    │   ├── EmbeddedError             the embedded server or model cannot be used
    │   ├── DaemonError               no daemon answers, or it went away (``loopd serve``)
    │   └── McpError                  an MCP server could not be started or listed
    ├── SessionError                exit 5: the session cannot be used
    │   ├── SessionLocked             open in another process
    │   ├── SessionInUse              attached to another client of the daemon
    │   ├── LogCorrupt                corruption before the tail (``offset`` says where)
    │   └── RecordError               a record that cannot be encoded or decoded
    ├── ProtocolError               a peer sent something that is not the protocol
    │   ├── WireError                 a tool-wire frame (``id`` when it could be read)
    │   └── RecordingError            a recorded .http exchange (tests and tools)
    └── Cancelled                   exit 130: the person (or a signal) cancelled

``InferError`` with kind ``cancelled`` is how the inference side reports a cancel; the turn
turns it into :class:`Cancelled`. A denied tool call, a failed one, or a path outside the
workspace is not an error here: it is an answer the model reads.
"""

from __future__ import annotations

__all__ = [
    "Cancelled",
    "ConfigError",
    "DaemonError",
    "EmbeddedError",
    "KeyFileError",
    "LimitError",
    "LogCorrupt",
    "LoopdError",
    "McpError",
    "ProtocolError",
    "RecordError",
    "RecordingError",
    "RulesError",
    "ServerError",
    "SessionError",
    "SessionFull",
    "SessionInUse",
    "SessionLocked",
    "TurnLimit",
    "UsageError",
    "WireError",
]


class LoopdError(Exception):
    """The root: a failure loopd expects and explains. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UsageError(LoopdError):
    exit_code = 2


class ConfigError(UsageError):
    """A configuration value that cannot be used; the message names the key and the fix."""


class KeyFileError(UsageError):
    """A key file or key text that cannot be used; the message says which and the fix."""


class RulesError(UsageError):
    """The approval rules file cannot be read or written; the message names the file and line."""


class LimitError(LoopdError):
    exit_code = 3


class TurnLimit(LimitError):
    """A loop limit ended the turn; ``limit`` names it (e.g. ``tool iterations``)."""

    def __init__(self, limit: str, detail: str) -> None:
        super().__init__(f"Stopped by the {limit} limit: {detail}")
        self.limit = limit


_FATES = {  # SessionFull: what became of the turn's message
    "taken back": " Your message was taken back: it stays in the log and is never answered, "
                  "not even later.",
    "not sent": " Your message was not sent (nor kept): alone it does not fit.",
}


class SessionFull(LimitError):
    """The prompt no longer fits the model's context. ``message``, what became of the turn's
    message: "taken back" (it was logged; a Rewind keeps it in the log, never sent again) or
    "not sent" (refused before anything was logged); "" when not known."""

    def __init__(self, prompt_tokens: object = "?", n_ctx: object = "?", *,
                 message: str = "") -> None:
        self.prompt_tokens, self.n_ctx = prompt_tokens, n_ctx
        self.detail = f"the prompt is {prompt_tokens} tokens and the model's context holds {n_ctx}"
        super().__init__(
            f"The conversation is full: {self.detail}.{_FATES.get(message, '')} Start a new "
            "session (or give the server a larger context)."
        )


class ServerError(LoopdError):
    exit_code = 4


class EmbeddedError(ServerError):
    """The embedded server or model cannot be used; the message says why and what to do."""


class DaemonError(ServerError):
    """No daemon answers at its socket, or it stopped answering; the message says where."""


class McpError(ServerError):
    """The MCP server could not be started or listed; the message names it and the fix."""


class SessionError(LoopdError):
    """A session log that cannot be opened or written; the message names the session and fix."""

    exit_code = 5


class SessionLocked(SessionError):
    """Another writer holds the session's log."""


class SessionInUse(SessionError):
    """The daemon has the session attached to another client (one client per session)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"session {name} is in use by another client")
        self.name = name


class LogCorrupt(SessionError):
    """Corruption that is not a torn tail; ``offset`` is where the bad bytes start."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class RecordError(SessionError):
    """A record that cannot be encoded or decoded; the message names the kind and field."""


class ProtocolError(LoopdError):
    """Bytes from a peer that do not follow the protocol they should."""


class WireError(ProtocolError):
    """A frame that is not a valid message; ``id`` is the request id when it could be read."""

    def __init__(self, message: str, id: int | None = None) -> None:
        super().__init__(message)
        self.id = id


class RecordingError(ProtocolError):
    """A .http file that does not follow the format; the message names the place."""


class Cancelled(LoopdError):
    """The turn was cancelled; the session keeps everything before the cancel."""

    exit_code = 130

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "Cancelled; the session keeps everything before the cancel.")
