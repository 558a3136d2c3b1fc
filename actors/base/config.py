"""loopd's configuration: one TOML file, every key with a default, checked and resolved at load.

A file only needs the keys it changes. Unknown sections or keys and values of the wrong
type or range are refused with the key's full name and what is allowed, so a typo never
silently falls back to a default.

Each key is one field below: its type is what the code reads (``typing.get_type_hints``
checks a file's value against it), its limits sit beside it in the field's metadata
(:class:`Allowed`), and its comment says what it does. Adding a key is adding a field (and
its line in ``config/loopd.toml``). A key that may say ``"auto"`` is resolved when the config
is loaded, for the model server the config names (the embedded one when neither
``inference.url`` nor ``inference.servers`` is set): the code only ever sees the answer.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from actors.base.errors import ConfigError

__all__ = [
    "AUTO_SWITCH",
    "AgentsConfig",
    "Allowed",
    "Config",
    "DaemonConfig",
    "EmbeddedConfig",
    "HostConfig",
    "InferenceConfig",
    "LogConfig",
    "LoopConfig",
    "SessionConfig",
    "ShellConfig",
    "SlotsConfig",
    "TelemetryConfig",
    "ToolsConfig",
    "WebConfig",
    "allowed",
    "auto",
    "data_home",
    "files_read",
    "limits",
    "load",
    "parse",
    "seconds",
]


# --- what a key allows, beside its field -----------------------------------------------------

_META = "loopd"  # the field-metadata key that holds a key's Allowed
_WEEK = 7 * 24 * 3600  # seconds beyond a week cannot work (1e308 overflowed the clock)


@dataclasses.dataclass(frozen=True, slots=True)
class Allowed:
    """What a key accepts beyond its type: kept in its field's metadata (see :func:`limits`,
    :func:`seconds`, :func:`auto`)."""

    low: float | None = None  # numbers: the smallest value that works
    high: float | None = None  # numbers: the largest value that works
    above: str = ""  # said of a value above ``high`` instead of "must be at most HIGH"
    # "auto" allowed: what it means (on the embedded model, for a server named by url), and
    # the file's words for the other values ({"on": True, "off": False})
    auto: tuple[Any, Any] | None = None
    words: tuple[tuple[str, Any], ...] = ()
    split: bool = False  # a string is split like a shell command line (a list is taken as is)


def limits(low: float | None = None, high: float | None = None, *, above: str = "",
           split: bool = False, auto: tuple[Any, Any] | None = None) -> dict[str, Allowed]:
    """Field metadata: a number's smallest and largest working value; ``auto``: the file
    may also say "auto" (the embedded model's value, a named server's; see :func:`auto`)."""
    return {_META: Allowed(low=low, high=high, above=above, split=split, auto=auto)}


def seconds(low: float = 0.001) -> dict[str, Allowed]:
    """Field metadata of a duration: at least ``low``, at most a week."""
    return limits(low, _WEEK)


def auto(embedded: Any, named: Any, **words: Any) -> dict[str, Allowed]:
    """Field metadata of a key that may say "auto": ``embedded`` on the embedded model,
    ``named`` for a server named by url; ``words`` are the file's other values (default: the
    field's Literal values as they are). The field's default must be ``embedded`` (a config
    built with no file is the embedded model's)."""
    return {_META: Allowed(auto=(embedded, named), words=tuple(words.items()))}


# A bool the file writes "auto", "on" or "off": "auto" is on for the embedded model only.
AUTO_SWITCH = auto(True, False, on=True, off=False)


def allowed(f: dataclasses.Field[Any]) -> Allowed:
    """The Allowed of a config field (no limits when it has none)."""
    found = f.metadata.get(_META)
    return found if isinstance(found, Allowed) else Allowed()


# The environment variables (fnmatch patterns) a sandboxed command gets by default; never
# loopd's own environment (API keys and other secrets stay out).
DEFAULT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_*", "TERM", "TZ")


# --- the sections --------------------------------------------------------------------------
# A config built in code (Config(), InferenceConfig(...)) takes these defaults as they are:
# those of the file-less config, which runs the embedded model. load() and parse() resolve
# "auto" for the server a file names.


@dataclasses.dataclass(frozen=True, slots=True)
class InferenceConfig:
    url: str = ""  # empty (and no servers): start the embedded model server
    servers: tuple[str, ...] = ()  # several llama-servers; url is the one-server form
    timeout_s: float = field(default=600.0, metadata=seconds())  # wall clock, one request
    connect_timeout_s: float = field(default=10.0, metadata=seconds())
    read_timeout_s: float = field(default=120.0, metadata=seconds())  # longest gap in a stream
    retries: int = field(default=3, metadata=limits(0, 100))
    backoff_s: float = field(default=0.5, metadata=seconds(0))  # first retry delay; doubles
    api_key: str = ""
    # Treat an answer whose content is exactly one JSON tool call as that call.
    # "auto": on for the embedded model, off for a server named by url.
    bare_json_tool_calls: bool = field(default=True, metadata=AUTO_SWITCH)
    # Send a grammar with every request so the answer is TOOL and exactly one schema-valid
    # call of a tool that can be called, or ANSWER and plain text; the word is taken off
    # again (docs/inference.md#small-model-aids). "auto": on for the embedded model, off
    # for a server named by url. On implies bare_json_tool_calls.
    constrained_calls: bool = field(default=True, metadata=AUTO_SWITCH)
    # Under constrained_calls: model responses of a turn that may call a tool; the one after
    # them may only be plain text (a small model calls again instead of answering).
    constrained_tool_steps: int = field(default=1, metadata=limits(1, 64))
    # Under constrained_calls: a question with a word that the workspace's files hold (their
    # names and text; not a common word nor a plain number) gets a call first, like one
    # that names a file, when those files hold at most this many bytes; 0: never.
    workspace_words: int = field(default=65536, metadata=limits(0, 16 * 1024 * 1024))
    # Requests this process streams from the server at once; more wait (Queued event).
    # Thousands cannot work (100,000 inference actors never started).
    parallel: int = field(default=4, metadata=limits(1, 64))
    # sampling temperature; below 0: the server's default
    temperature: float = field(default=-1.0, metadata=limits(-1))
    seed: int = field(default=-1, metadata=limits(-1))  # sampling seed; -1: the server's

    def __post_init__(self) -> None:
        # constrained_calls makes the model write its call as bare JSON, so it implies
        # bare_json_tool_calls: the turn reads only that one to know whether to take it
        if self.constrained_calls and not self.bare_json_tool_calls:
            object.__setattr__(self, "bare_json_tool_calls", True)


@dataclasses.dataclass(frozen=True, slots=True)
class SlotsConfig:
    # saved KV state kept on disk, at most (least recently used go first)
    disk_mb: int = field(default=2048, metadata=limits(0))
    # Save a session's KV state after each turn, off the answer's path. "auto": on for the
    # embedded server, off for servers named by url (they save before a slot changes hands
    # and when a command ends).
    save_after_turn: bool = field(default=True, metadata=AUTO_SWITCH)
    save_dir: str = ""  # the --slot-save-path of the named servers, when on this machine
    # The baseline's KV state (system prompt and tools) saved once and restored into the
    # slot of every new session, so its first request processes only its message.
    warm_start: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class LoopConfig:
    tool_iterations: int = field(default=16, metadata=limits(1))
    # tool calls one model response may ask for
    max_calls_per_response: int = field(default=32, metadata=limits(1))
    repeat_detection: bool = True
    thinking_cap: int = field(default=4096, metadata=limits(0))
    tool_result_cap: int = field(default=16000, metadata=limits(1))
    max_tokens: int = field(default=2048, metadata=limits(1))
    # The runaway-text limit (actors/inference/runaway.py): an answer or reasoning whose
    # last N pieces (a word, a number or a mark each, about a token) copy its own earlier
    # text, or the prompt, is cut there; 0: not watched. The eval's right answers reach 99
    # (repeat) and 146 (a file shown whole): scripts/runaway_scores.py.
    runaway_repeat_tokens: int = field(default=256, metadata=limits(0))
    runaway_copy_tokens: int = field(default=400, metadata=limits(0))
    # An answer repeating for N pieces a passage of a tool's result that an earlier answer,
    # to another question, already copied is cut there (the same README paragraph given
    # as the answer to four questions in a row); 0: not watched. docs/turn.md#limits.
    runaway_echo_tokens: int = field(default=32, metadata=limits(0))
    # One budget for a turn and every agent it starts (docs/agents.md): tokens generated
    # and wall time of the whole tree; 0: no cap.
    turn_tokens: int = field(default=0, metadata=limits(0))
    turn_seconds: float = field(default=0.0, metadata=limits(0, _WEEK))


@dataclasses.dataclass(frozen=True, slots=True)
class AgentsConfig:
    # The `agent` tool (docs/agents.md): a turn hands a task to a child session. Off by
    # default: it changes the baseline's tools, and the embedded model's eval has not shown
    # that it helps there.
    enabled: bool = False
    # children running at once; "auto" (0): as many as the model servers have slots
    max_parallel: int = field(default=0, metadata=limits(0, 64, auto=(0, 0)))
    max_depth: int = field(default=1, metadata=limits(1, 4))  # 1: a child has no agent tool
    max_children: int = field(default=8, metadata=limits(1, 64))  # per turn
    max_task_chars: int = field(default=4000, metadata=limits(1))  # a longer task is refused


def data_home() -> Path:
    """``$XDG_DATA_HOME/loopd``, else ``~/.local/share/loopd``: where a person's programs keep
    their data (the XDG base directories, as the rules file's place follows them too)."""
    base = os.environ.get("XDG_DATA_HOME") or "~/.local/share"
    return Path(base).expanduser() / "loopd"


@dataclasses.dataclass(frozen=True, slots=True)
class LogConfig:
    dir: str = ""  # "": $XDG_DATA_HOME/loopd/sessions (~/.local/share/loopd/sessions)
    fsync: Literal["always", "turn", "never"] = "always"


# The system prompt of a new session when session.system is empty (and not on the embedded
# model, which has embedded.system).
GENERAL_SYSTEM = (
    "You are a helpful assistant running inside loopd. Use find_tool to discover tools "
    "and call_tool to run one. Answer briefly."
)


@dataclasses.dataclass(frozen=True, slots=True)
class SessionConfig:
    # "": embedded.system on the embedded model, else GENERAL_SYSTEM.
    system: str = ""
    pinned: tuple[str, ...] = ()  # tools offered directly in the baseline as well
    # How a tool's result goes to the model (actors/session/messages.py): "tool" messages,
    # or "user" messages that name the tool and ask the question again; "auto": user for
    # the embedded model, tool for a server named by url.
    tool_results: Literal["tool", "user"] = field(default="user", metadata=auto("user", "tool"))
    # Compaction (docs/rendering.md#compaction): how the summary of the dropped turns is
    # written: "summary" (the model writes it on the warm slot, at most summary_tokens) or
    # "elide" (a deterministic list of what was dropped, no model call); "auto": elide for
    # the embedded model, summary for a server named by url; "off": never by itself (a full
    # context is SessionFull, as before compaction; `loopd compact` elides).
    compaction: Literal["summary", "elide", "off"] = field(default="elide",
                                                     metadata=auto("elide", "summary"))
    # Compact before a request whose prompt would pass this share of the slot's context.
    # "auto": 0.4 on the embedded model (a 0.5B model answers worse as its prompt grows:
    # the long chat of make eval passed 30/34 turns at 0.4, 25/34 at 0.8), 0.8 for a server
    # named by url. Raised (up to 0.8) where the baseline leaves too little room after it
    # (actors.session.compaction.threshold).
    compact_at: float = field(default=0.4, metadata=limits(0.05, 1.0, auto=(0.4, 0.8)))
    # The last whole turns that fit in this share of the context stay verbatim.
    compact_keep: float = field(default=0.25, metadata=limits(0.0, 0.9))
    summary_tokens: int = field(default=512, metadata=limits(16, 1 << 16))  # the summary's cap


# A host's name becomes part of its socket's and its log's file names.
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclasses.dataclass(frozen=True, slots=True)
class HostConfig:
    name: str
    kind: Literal["local", "remote", "mcp"] = "local"
    tools: tuple[str, ...] = ()  # local: standard tools this host runs
    endpoint: str = ""  # remote: tcp://host:port
    server_key: str = ""  # remote: the host's public CURVE key (Z85) or a key file
    client_key: str = ""  # remote: our secret key file (from `loopd keys`)
    # mcp: the MCP server's command line (stdio); a string is split like a shell's
    command: tuple[str, ...] = field(default=(), metadata=limits(split=True))
    url: str = ""  # mcp: the MCP server's streamable-HTTP url
    # mcp over HTTP: authorization. Values "env:NAME" (the environment) or "file:PATH" (a
    # file's text) keep secrets out of the config; see docs/tools.md (MCP servers).
    headers: tuple[str, ...] = ()  # "Name: value" sent with every request
    bearer: str = ""  # a token sent as "Authorization: Bearer TOKEN"
    oauth: Literal["", "authorization_code", "client_credentials"] = ""  # OAuth 2.1 (the SDK's)
    oauth_client_id: str = ""  # a pre-registered client; "": registered dynamically
    oauth_client_secret: str = ""
    oauth_private_key: str = ""  # client_credentials by private_key_jwt: the PEM key
    oauth_signing_algorithm: str = "ES256"
    oauth_client_metadata_url: str = ""  # an https client id document (CIMD), where supported
    oauth_scopes: tuple[str, ...] = ()  # (): the server's choice
    oauth_redirect_port: int = field(default=0, metadata=limits(0, 65535))  # 0: a free one
    oauth_timeout_s: float = field(default=300.0, metadata=seconds())  # time to authorize


@dataclasses.dataclass(frozen=True, slots=True)
class ShellConfig:
    """[tools.shell]: where run_command runs (see actors/tools/providers/sandbox.py)."""

    sandbox: Literal["bwrap", "none"] = "bwrap"  # none: no sandbox (warned at start)
    network: bool = False  # the sandbox keeps the network
    env: tuple[str, ...] = DEFAULT_ENV  # variables (fnmatch patterns) a command gets
    # Bounds of one command in the sandbox (0: none): the size of each of its /tmp, /run
    # and /dev/shm; each process's data memory, largest file and CPU seconds (cpu_s 0: the
    # call's time limit); processes and threads in the sandbox at once.
    tmpfs_mb: int = field(default=256, metadata=limits(0, 1 << 20))
    memory_mb: int = field(default=1024, metadata=limits(0, 1 << 30))
    processes: int = field(default=256, metadata=limits(0, 1 << 22))
    file_mb: int = field(default=512, metadata=limits(0, 1 << 30))
    cpu_s: float = field(default=0.0, metadata=seconds(0))


@dataclasses.dataclass(frozen=True, slots=True)
class WebConfig:
    """[tools.web]: what fetch_url may reach (see actors/tools/providers/web.py)."""

    allow_private: bool = False  # loopback, private and link-local addresses too


@dataclasses.dataclass(frozen=True, slots=True)
class ToolsConfig:
    workspace: str = "."
    timeout_s: float = field(default=60.0, metadata=seconds())
    heartbeat_s: float = field(default=2.0, metadata=seconds())
    allow: tuple[str, ...] = ()  # rules: TOOL or "TOOL: PREFIX" that run without asking
    deny: tuple[str, ...] = ()  # rules that never run (deny beats allow)
    # no answer by then is a denial; 0: wait as long as it takes
    approval_timeout_s: float = field(default=300.0, metadata=seconds(0))
    rules_file: str = ""  # the "always" answers (and rules by hand); "": the XDG place
    max_concurrent_calls: int = field(default=8, metadata=limits(1, 256))  # per host
    # largest ZeroMQ frame accepted
    max_frame_bytes: int = field(default=4 * 1024 * 1024, metadata=limits(1024, 1024**3))
    # a tool's output is cut here, at the host
    max_output_bytes: int = field(default=1024 * 1024, metadata=limits(1, 1024**3))
    standard: bool = True  # start the standard tool hosts
    # how long start-up waits for each host's tool list
    start_timeout_s: float = field(default=15.0, metadata=seconds())
    hosts: tuple[HostConfig, ...] = ()
    # An MCP server's question for the person (elicitation) when nobody can answer: "ask"
    # declines then, "defaults" accepts with the defaults its form gives, "decline" always
    elicitation: Literal["ask", "defaults", "decline"] = "ask"
    shell: ShellConfig = ShellConfig()
    web: WebConfig = WebConfig()


@dataclasses.dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    # the assembled model lives here; "": $XDG_DATA_HOME/loopd (~/.local/share/loopd)
    data_dir: str = ""
    ctx_size: int = field(default=8192, metadata=limits(512, 1 << 24))
    port: int = field(default=0, metadata=limits(0, 65535, above="must be a port number, "
                                                       "0 to 65535"))  # 0: a free port
    startup_timeout_s: float = field(default=300.0, metadata=seconds(1))
    # llama-server's -t; 0: the cores free at its start (server_threads in
    # actors/inference/embedded/server.py)
    threads: int = field(default=0, metadata=limits(0, 1024))
    # which model the embedded server runs (actors/inference/embedded/model.py MODELS): the
    # 1.5B (loopd[embedded-1.5b]) or the 0.5B (loopd[embedded]); docs/embedded.md the trade
    model: Literal["0.5b", "1.5b"] = "1.5b"
    # sessions whose KV state the server holds at once (-np)
    slots: int = field(default=2, metadata=limits(1, 64))
    # A new session's system prompt on the embedded model when session.system is empty, and
    # the tools offered to it directly, before session.pinned. Tuned with `make eval`.
    # Its worked examples hold no reply text: an example's answer became answers ("2 plus 2
    # is 4.", "written by William Shakespeare", a bare "ANSWER 4" answered "reply with OK"
    # and "6 times 7"), and so did a phrase after ANSWER ("and my own reply: ..."), so a
    # question that needs no tool shows the word ANSWER alone. Its first sentences say what
    # the tools are for, not "use a tool for a fact you cannot know yourself, answer
    # everything else yourself": with that rule the model described a file it had just read
    # in made-up words ("a list of tasks ... with a status") instead of saying what it says
    # (the long chat's first five turns 1/5 -> 5/5, the whole chat 23/34 -> 28/34; an
    # example answer after a result, tried instead, was copied: "When is the party?...").
    # "reply yourself", not "reply": "5 plus 7" was answered "10". docs/eval.md has the runs.
    system: str = (
        "You are a helpful assistant. You can use tools to look at the files in the "
        "workspace and to look up facts with a person's own tools (weather, tickets, "
        "databases...) that find_tool finds. Use a tool when the question asks about the "
        "workspace or what such a tool can look up.\n"
        "\n"
        "Begin with TOOL to call one tool, or with ANSWER to reply yourself.\n"
        "Examples of a first answer:\n"
        'Q: What files are there? A: TOOL {"name": "list_dir", "arguments": {}}\n'
        'Q: How many bytes is a.txt? A: TOOL {"name": "list_dir", "arguments": {}}\n'
        'Q: What does a.txt say? A: TOOL {"name": "read_file", "arguments": {"path": '
        '"a.txt"}}\n'
        'Q: When is the party? It is in a.txt. A: TOOL {"name": "read_file", '
        '"arguments": {"path": "a.txt"}}\n'
        'Q: Which file mentions apples? A: TOOL {"name": "search_files", "arguments": '
        '{"pattern": "apples", "path": "."}}\n'
        'Q: Where is the class Parser defined? A: TOOL {"name": "find_definition", '
        '"arguments": {"name": "Parser"}}\n'
        'Q: Write a file c.txt that says: hi A: TOOL {"name": "write_file", '
        '"arguments": {"path": "c.txt", "content": "hi"}}\n'
        'Q: How many orders are open? A: TOOL {"name": "find_tool", "arguments": '
        '{"query": "orders"}}\n'
        "Q: What is 2 plus 2? A: ANSWER\n"
        "Q: Who wrote Hamlet? A: ANSWER\n"
        "Q: How do you say thank you in Spanish? A: ANSWER\n"
        "Q: Hello! A: ANSWER\n"
        "\n"
        "After a tool's result, answer the question from it in one sentence."
    )
    pinned: tuple[str, ...] = ("list_dir", "read_file", "search_files", "write_file",
                               "find_definition")
    # The workspace map after embedded.system: at most this many files and folders of the
    # workspace (names and sizes) taken when a session is made
    # (actors/session/smallmodel/workspace_map.py); 0: none, the default: on the workspaces
    # never used for tuning the embedded model answered from the map's names and sizes
    # instead of calling a tool (make eval, docs/eval.md).
    workspace_map: int = field(default=0, metadata=limits(0, 10_000))
    # The embedded server's default sampling temperature (--temp): greedy, the small model's
    # most likely path. inference.temperature (when at least 0) overrides it per request.
    temperature: float = field(default=0.0, metadata=limits(0, 100))

    @property
    def data_path(self) -> Path:
        """``data_dir``, expanded; the person's data home when it is not set."""
        return Path(self.data_dir).expanduser() if self.data_dir else data_home()


@dataclasses.dataclass(frozen=True, slots=True)
class DaemonConfig:
    # `loopd serve` and the clients that find it (see actors/daemon/protocol.py).
    runtime_dir: str = ""  # pid file and socket; "": $XDG_RUNTIME_DIR/loopd or /tmp/loopd-UID
    endpoint: str = ""  # "": ipc://RUNTIME_DIR/loopd.sock; tcp://... needs the CURVE keys
    curve_secret: str = ""  # the daemon: its .key_secret file (tcp:// only)
    allow_keys: str = ""  # the daemon: directory of the .key files of the clients it lets in
    server_key: str = ""  # a client: the daemon's public key (Z85 text or .key file)
    client_key: str = ""  # a client: its own .key_secret file
    # a peer silent for 3 heartbeats is gone (its turn cancelled)
    heartbeat_s: float = field(default=1.0, metadata=seconds(0.01))
    # how long the CLI waits for an answer, else runs in-process
    connect_timeout_s: float = field(default=1.0, metadata=seconds(0.01))
    # largest message either side accepts
    max_frame_bytes: int = field(default=4 * 1024 * 1024, metadata=limits(1024, 1024**3))
    # the daemon: clients at once; one more is refused with the reason
    max_clients: int = field(default=64, metadata=limits(1, 65536))
    # the daemon: sessions one client may have open
    max_sessions_per_client: int = field(default=32, metadata=limits(1, 65536))
    # the daemon: requests (turns included) one client may have in progress, and all
    # clients together; one more is answered with an error naming the key
    max_requests_per_client: int = field(default=48, metadata=limits(1, 65536))
    max_requests: int = field(default=256, metadata=limits(1, 65536))
    # the daemon: bytes of answers it holds for a client that does not read them; past a
    # tenth its new requests are refused, past the whole it is given up (the bytes freed)
    max_client_bytes: int = field(default=64 * 1024 * 1024, metadata=limits(1024 * 1024, 1024**4))
    # how long a stop may take (the daemon's, and a run/chat/acp's own world's); past it,
    # what the process started is killed, it exits 1 (actors/base/processes/stop_deadline.py)
    stop_grace_s: float = field(default=60.0, metadata=seconds(1))


@dataclasses.dataclass(frozen=True, slots=True)
class TelemetryConfig:
    # Traces over OTLP/HTTP (docs/telemetry.md; needs loopd[telemetry]). Also on when
    # OTEL_EXPORTER_OTLP_ENDPOINT is set; OTEL_SDK_DISABLED=true turns it off whatever this says.
    enabled: bool = False
    # each export's bound: an endpoint that hangs costs its spans, never a turn
    export_timeout_s: float = field(default=2.0, metadata=seconds(0.01))


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    inference: InferenceConfig = InferenceConfig()
    slots: SlotsConfig = SlotsConfig()
    loop: LoopConfig = LoopConfig()
    agents: AgentsConfig = AgentsConfig()
    log: LogConfig = LogConfig()
    session: SessionConfig = SessionConfig()
    tools: ToolsConfig = ToolsConfig()
    embedded: EmbeddedConfig = EmbeddedConfig()
    daemon: DaemonConfig = DaemonConfig()
    telemetry: TelemetryConfig = TelemetryConfig()

    @property
    def embedded_model(self) -> bool:
        """No url and no servers: loopd starts its own model server (what "auto" is for)."""
        return _embedded_model(self.inference.url, self.inference.servers)

    @property
    def log_dir(self) -> Path:
        return Path(self.log.dir).expanduser() if self.log.dir else data_home() / "sessions"

    @property
    def rules_path(self) -> Path:
        """``tools.rules_file``, else ``$XDG_CONFIG_HOME/loopd/rules.toml``, else
        ``~/.config/loopd/rules.toml`` (where a person looks for a program's settings)."""
        if self.tools.rules_file:
            return Path(self.tools.rules_file).expanduser()
        base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
        return Path(base).expanduser() / "loopd" / "rules.toml"

    @property
    def workspace(self) -> Path:
        return Path(self.tools.workspace).expanduser().resolve()

    @property
    def uses_workspace(self) -> bool:
        """Whether a local tool host works on ``tools.workspace`` (remote hosts have their own)."""
        return self.tools.standard or any(h.kind != "remote" for h in self.tools.hosts)

    def replace(self, section: str, **changes: Any) -> Config:
        """A copy with some keys of one section changed, each checked like a file's
        ("auto" is resolved for this config's model server). Whether the embedded model is
        used cannot change here: the other "auto" keys were resolved for it at load; give a
        url to :func:`load` (``overrides``) instead."""
        current = getattr(self, section)
        built = _build(type(current), changes, section, self.embedded_model, base=current)
        changed = dataclasses.replace(self, **{section: built})
        if changed.embedded_model != self.embedded_model:
            raise ConfigError(
                f"{section}: replace() cannot switch between the embedded model and a named "
                "server (the \"auto\" keys were resolved at load); give inference.url or "
                "inference.servers to load(overrides=...)"
            )
        return changed


# --- reading a table ---------------------------------------------------------------------------

# Keys that existed once: a config naming one is told what replaced it.
_REMOVED = {
    "slots.main": "slots.main was removed: the slot keeper now gives each session a slot of "
    "its own (and saves and restores its KV state); delete the key. To choose how many "
    "slots the embedded server has, set embedded.slots",
}
_AUTO = "auto"


def _embedded_model(url: Any, servers: Any) -> bool:
    return not (url or servers)


def _check(key: str, kind: Any, rule: Allowed, value: Any, embedded: bool) -> Any:
    """``value`` (from a file) as the field of type ``kind`` holds it, or a ConfigError that
    names ``key`` and what is allowed."""
    if rule.auto is not None:
        if value == _AUTO and isinstance(value, str):
            return rule.auto[0] if embedded else rule.auto[1]
        if kind in (int, float):  # a number or "auto": a number is checked as any number
            if isinstance(value, str):
                raise ConfigError(f"{key} = {value!r}: must be a number or {_AUTO}")
        else:
            words = dict(rule.words) or {w: w for w in typing.get_args(kind)}
            if not isinstance(value, str) or value not in words:
                raise ConfigError(f"{key} = {value!r}: allowed values are "
                                  f"{', '.join([_AUTO, *words])}")
            return words[value]
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Literal:
        if value not in args or not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r}: allowed values are {', '.join(args)}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r}: must be true or false")
        return value
    if kind in (int, float):
        return _number(key, kind, rule, value)
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r}: must be a string")
        return value
    if origin is tuple and args[1:] == (Ellipsis,):
        return _array(key, args[0], rule, value, embedded)
    if _is_table(kind):  # a sub-table such as [tools.shell]
        return value if isinstance(value, kind) else _build(kind, value, key, embedded)
    raise AssertionError(f"no check for {key}: {kind}")  # a new kind of field needs one


def _is_table(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _number(key: str, kind: type, rule: Allowed, value: Any) -> Any:
    ok = isinstance(value, int) if kind is int else isinstance(value, int | float)
    if not ok or isinstance(value, bool):
        raise ConfigError(f"{key} = {value!r}: must be a number ({kind.__name__})")
    if not math.isfinite(value):
        raise ConfigError(f"{key} = {value!r}: must be a finite number")
    if rule.low is not None and value < rule.low:
        raise ConfigError(f"{key} = {value!r}: must be at least {rule.low:g}")
    if rule.high is not None and value > rule.high:
        raise ConfigError(f"{key} = {value!r}: {rule.above or f'must be at most {rule.high:g}'}")
    return float(value) if kind is float else value


def _array(key: str, item: Any, rule: Allowed, value: Any, embedded: bool) -> tuple[Any, ...]:
    if _is_table(item):  # an array of tables such as [[tools.hosts]]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: must be an array of tables ([[{key}]])")
        return tuple(v if isinstance(v, item) else _build(item, v, f"{key}[{i}]", embedded)
                     for i, v in enumerate(value))
    assert item is str, f"no check for {key}: tuple[{item}, ...]"  # a new kind needs one
    if isinstance(value, str) and rule.split:
        try:
            value = shlex.split(value)
        except ValueError as e:
            raise ConfigError(
                f"{key} = {value!r}: {e}; quote it like a shell command line") from None
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key} = {value!r}: must be a list of strings")
    return tuple(value)


def _build(cls: Any, table: Any, prefix: str, embedded: bool, base: Any = None) -> Any:
    """Section ``cls`` from a file's ``table``: keys it leaves out take their defaults ("auto"
    ones resolved), or those of ``base`` when one is given (replace)."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{prefix}] must be a table, got {type(table).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if f"{prefix}.{key}" in _REMOVED:
            raise ConfigError(_REMOVED[f"{prefix}.{key}"])
    unknown = set(table) - set(fields)
    if unknown:
        raise ConfigError(
            f"unknown key(s) in [{prefix}]: {', '.join(sorted(unknown))}; "
            f"known keys: {', '.join(fields)}"
        )
    kinds = typing.get_type_hints(cls)
    absent = {} if base is not None else {
        n: _AUTO for n, f in fields.items() if allowed(f).auto is not None}
    missing = [n for n, f in fields.items()
               if n not in table and f.default is dataclasses.MISSING and base is None]
    if missing:
        raise ConfigError(f"[{prefix}] needs {', '.join(missing)}")
    values = {k: _check(f"{prefix}.{k}", kinds[k], allowed(fields[k]), v, embedded)
              for k, v in {**absent, **table}.items()}
    built = cls(**values) if base is None else dataclasses.replace(base, **values)
    for check in _SECTION_CHECKS.get(cls, ()):
        check(prefix, built)
    return built


# --- checks across the keys of one section -----------------------------------------------------


def _one_server_form(prefix: str, inference: InferenceConfig) -> None:
    if inference.url and inference.servers:
        raise ConfigError(
            f"{prefix}.url and {prefix}.servers are both set: use url for one server or "
            "servers = [...] for several, not both"
        )


def _check_hosts(prefix: str, tools: ToolsConfig) -> None:
    key, hosts = f"{prefix}.hosts", tools.hosts
    names = [h.name for h in hosts]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(f"{key}: host names must be unique, repeated: {', '.join(sorted(dupes))}")
    for i, h in enumerate(hosts):
        if not _HOST_NAME.fullmatch(h.name):
            raise ConfigError(
                f"{key}[{i}].name = {h.name!r}: use 1 to 64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit (it becomes part of file names)"
            )
        where = f"{key}[{i}] ({h.name})"
        if h.kind == "remote" and not (h.endpoint and h.server_key):
            raise ConfigError(f"{where}: a remote host needs endpoint and server_key")
        if h.kind == "mcp" and not (h.command or h.url):
            raise ConfigError(f"{where}: an mcp host needs command or url")
        authorized = h.headers or h.bearer or h.oauth
        if authorized and not (h.kind == "mcp" and h.url):
            raise ConfigError(
                f"{where}: headers, bearer and oauth are for an mcp host with a url (HTTP); "
                "a command's server gets its secrets from its environment"
            )
        if h.kind == "local" and not h.tools:
            raise ConfigError(f"{where}: a local host needs tools = [...]")


def _check_rules(prefix: str, tools: ToolsConfig) -> None:
    from actors.base.rules import parse_rule

    for key in ("allow", "deny"):
        for text in getattr(tools, key):
            try:
                parse_rule(text)
            except ValueError as e:
                raise ConfigError(f"{prefix}.{key}: {e}") from None


_SECTION_CHECKS: dict[type, tuple[Callable[[str, Any], None], ...]] = {
    InferenceConfig: (_one_server_form,),
    ToolsConfig: (_check_hosts, _check_rules),
}


# --- loading ---------------------------------------------------------------------------------


def parse(data: Mapping[str, Any],
          overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """A Config from already-parsed TOML data (every key optional), each section's keys in
    ``overrides`` (a command's options) taking the place of the file's; "auto" resolved."""
    merged: dict[str, Any] = dict(data)
    for name, table in (overrides or {}).items():
        merged[name] = {**_table(merged.get(name, {}), name), **table}
    sections = {f.name: f for f in dataclasses.fields(Config)}
    unknown = set(merged) - set(sections)
    if unknown:
        raise ConfigError(
            f"unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(sections)}"
        )
    inference = merged.get("inference", {})
    embedded = not isinstance(inference, Mapping) or _embedded_model(
        inference.get("url"), inference.get("servers"))
    kinds = typing.get_type_hints(Config)
    return Config(**{name: _build(kinds[name], _table(merged.get(name, {}), name), name, embedded)
                     for name in sections})


def _table(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"[{name}] must be a table, got {type(value).__name__}")
    return value


# The config files this process was pointed at: loopd's own places, hidden from the tools
# (actors.base.private_places) like the rules file, for an inference.api_key may be in one.
_READ: dict[str, None] = {}


def files_read() -> tuple[str, ...]:
    """The absolute paths of the config files :func:`load` was given in this process."""
    return tuple(_READ)


def load(path: str | os.PathLike[str] | None = None,
         overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """The config from ``path``, else ``$LOOPD_CONFIG``, else the defaults, with a command's
    ``overrides`` ({"inference": {"url": ...}}) in place of the file's keys; "auto" keys are
    resolved here, once, for the model server this names."""
    chosen = path if path is not None else os.environ.get("LOOPD_CONFIG") or None
    if chosen is None:
        return parse({}, overrides)
    p = Path(chosen).expanduser()
    _READ.setdefault(os.path.abspath(p))
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {p} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
            f"{e.start}); save it as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {p} cannot be read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    try:
        return parse(data, overrides)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
