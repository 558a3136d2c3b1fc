"""loopd's configuration: one TOML file, every key with a default, checked at load.

A file only needs the keys it changes. Unknown sections or keys and values of the wrong
type or range are refused with the key's full name and what is allowed, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from actors.base.errors import ConfigError

__all__ = [
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
    "ToolsConfig",
    "WebConfig",
    "load",
    "parse",
]


# The environment variables (fnmatch patterns) a sandboxed command gets by default; never
# loopd's own environment (API keys and other secrets stay out).
DEFAULT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_*", "TERM", "TZ")


@dataclasses.dataclass(frozen=True, slots=True)
class InferenceConfig:
    url: str = ""  # empty (and no servers): start the embedded model server
    servers: tuple[str, ...] = ()  # several llama-servers; url is the one-server form
    timeout_s: float = 600.0  # wall-clock limit for one request
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0  # longest gap between two chunks
    retries: int = 3
    backoff_s: float = 0.5  # first retry delay; doubles, with jitter
    api_key: str = ""
    # Treat an answer whose content is exactly one JSON tool call as that call.
    # "auto": on for the embedded model, off for a server named by url.
    bare_json_tool_calls: Literal["auto", "on", "off"] = "auto"
    # Send a grammar with every request so the answer is TOOL and exactly one schema-valid
    # call of a tool that can be called, or ANSWER and plain text; the word is taken off
    # again (docs/inference.md#small-model-aids). "auto": on for the embedded model, off
    # for a server named by url. On implies bare_json_tool_calls.
    constrained_calls: Literal["auto", "on", "off"] = "auto"
    # Under constrained_calls: model responses of a turn that may call a tool; the one after
    # them may only be plain text (a small model calls again instead of answering).
    constrained_tool_steps: int = 1
    # Requests this process streams from the server at once; more wait (Queued event).
    parallel: int = 4
    temperature: float = -1.0  # sampling temperature; below 0: the server's default
    seed: int = -1  # sampling seed; -1: the server's default (random)


@dataclasses.dataclass(frozen=True, slots=True)
class SlotsConfig:
    disk_mb: int = 2048  # saved KV state kept on disk, at most (least recently used go first)
    # Save a session's KV state after each turn, off the answer's path. "auto": on for the
    # embedded server, off for servers named by url (they save before a slot changes hands
    # and when a command ends).
    save_after_turn: Literal["auto", "on", "off"] = "auto"
    save_dir: str = ""  # the --slot-save-path of the named servers, when on this machine


@dataclasses.dataclass(frozen=True, slots=True)
class LoopConfig:
    tool_iterations: int = 16
    max_calls_per_response: int = 32  # tool calls one model response may ask for
    repeat_detection: bool = True
    thinking_cap: int = 4096
    tool_result_cap: int = 16000
    max_tokens: int = 2048


@dataclasses.dataclass(frozen=True, slots=True)
class LogConfig:
    dir: str = "~/.local/share/loopd/sessions"
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
    # How a tool's result goes to the model (actors/session/messages.py): "tool" messages, or "user"
    # messages that name the tool and ask the question again; "auto": user for the
    # embedded model, tool for a server named by url.
    tool_results: Literal["auto", "tool", "user"] = "auto"


@dataclasses.dataclass(frozen=True, slots=True)
class HostConfig:
    name: str
    kind: Literal["local", "remote", "mcp"] = "local"
    tools: tuple[str, ...] = ()  # local: standard tools this host runs
    endpoint: str = ""  # remote: tcp://host:port
    server_key: str = ""  # remote: the host's public CURVE key (Z85) or a key file
    client_key: str = ""  # remote: our secret key file (from `loopd keys`)
    command: tuple[str, ...] = ()  # mcp: the MCP server's command line (stdio)
    url: str = ""  # mcp: the MCP server's streamable-HTTP url


@dataclasses.dataclass(frozen=True, slots=True)
class ShellConfig:
    """[tools.shell]: where run_command runs (see actors/tools/providers/sandbox.py)."""

    sandbox: Literal["bwrap", "none"] = "bwrap"  # none: no sandbox (warned at start)
    network: bool = False  # the sandbox keeps the network
    env: tuple[str, ...] = DEFAULT_ENV  # variables (fnmatch patterns) a command gets


@dataclasses.dataclass(frozen=True, slots=True)
class WebConfig:
    """[tools.web]: what fetch_url may reach (see actors/tools/providers/web.py)."""

    allow_private: bool = False  # loopback, private and link-local addresses too


@dataclasses.dataclass(frozen=True, slots=True)
class ToolsConfig:
    workspace: str = "."
    timeout_s: float = 60.0
    heartbeat_s: float = 2.0
    allow: tuple[str, ...] = ()  # rules: TOOL or "TOOL: PREFIX" that run without asking
    deny: tuple[str, ...] = ()  # rules that never run (deny beats allow)
    approval_timeout_s: float = 300.0  # no answer by then is a denial; 0: wait as long as it takes
    rules_file: str = ""  # the "always" answers (and rules by hand); "": the XDG place
    max_concurrent_calls: int = 8  # per host
    max_frame_bytes: int = 4 * 1024 * 1024  # largest ZeroMQ frame accepted
    max_output_bytes: int = 1024 * 1024  # a tool's output is cut here, at the host
    standard: bool = True  # start the standard tool hosts
    start_timeout_s: float = 15.0  # how long start-up waits for each host's tool list
    hosts: tuple[HostConfig, ...] = ()
    shell: ShellConfig = ShellConfig()
    web: WebConfig = WebConfig()


@dataclasses.dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    data_dir: str = "~/.local/share/loopd"  # the assembled model lives here
    ctx_size: int = 8192
    port: int = 0  # 0: a free loopback port
    startup_timeout_s: float = 300.0
    threads: int = 0  # 0: llama-server's default
    slots: int = 2  # sessions whose KV state the server holds at once (-np)
    # A new session's system prompt on the embedded model when session.system is empty, and
    # the tools offered to it directly, before session.pinned. Tuned with `make eval`.
    system: str = (
        "You are a helpful assistant. You can use tools to look at the files in the "
        "workspace. Use a tool only when the question is about the workspace or its "
        "files.\n"
        "\n"
        "Examples of a first answer:\n"
        'Q: What files are there? A: TOOL {"name": "list_dir", "arguments": {}}\n'
        'Q: How many bytes is a.txt? A: TOOL {"name": "list_dir", "arguments": {}}\n'
        'Q: What does a.txt say? A: TOOL {"name": "read_file", "arguments": {"path": '
        '"a.txt"}}\n'
        'Q: Show me b.md. A: TOOL {"name": "read_file", "arguments": {"path": "b.md"}}\n'
        'Q: When is the party? It is in a.txt. A: TOOL {"name": "read_file", '
        '"arguments": {"path": "a.txt"}}\n'
        'Q: Which file mentions apples? A: TOOL {"name": "search_files", "arguments": '
        '{"pattern": "apples", "path": "."}}\n'
        'Q: Write a file c.txt that says: hi A: TOOL {"name": "write_file", '
        '"arguments": {"path": "c.txt", "content": "hi"}}\n'
        "Q: What is 2 plus 2? A: ANSWER 2 plus 2 is 4.\n"
        "Q: What colour is grass? A: ANSWER Grass is green.\n"
        "Q: How do you say thank you in Spanish? A: ANSWER In Spanish, thank you is "
        "gracias.\n"
        "Q: Who wrote Hamlet? A: ANSWER Hamlet was written by William Shakespeare.\n"
        "\n"
        "After a tool's result, answer the question from it in one sentence."
    )
    pinned: tuple[str, ...] = ("list_dir", "read_file", "search_files", "write_file")
    # The embedded server's default sampling temperature (--temp): greedy, the small model's
    # most likely path. inference.temperature (when at least 0) overrides it per request.
    temperature: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class DaemonConfig:
    # `loopd serve` and the clients that find it (see actors/daemon/protocol.py).
    runtime_dir: str = ""  # pid file and socket; "": $XDG_RUNTIME_DIR/loopd or /tmp/loopd-UID
    endpoint: str = ""  # "": ipc://RUNTIME_DIR/loopd.sock; tcp://... needs the CURVE keys
    curve_secret: str = ""  # the daemon: its .key_secret file (tcp:// only)
    allow_keys: str = ""  # the daemon: directory of the .key files of the clients it lets in
    server_key: str = ""  # a client: the daemon's public key (Z85 text or .key file)
    client_key: str = ""  # a client: its own .key_secret file
    heartbeat_s: float = 1.0  # a peer silent for 3 heartbeats is gone (its turn cancelled)
    connect_timeout_s: float = 1.0  # how long the CLI waits for an answer, else runs in-process
    max_frame_bytes: int = 4 * 1024 * 1024  # largest message either side accepts


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    inference: InferenceConfig = InferenceConfig()
    slots: SlotsConfig = SlotsConfig()
    loop: LoopConfig = LoopConfig()
    log: LogConfig = LogConfig()
    session: SessionConfig = SessionConfig()
    tools: ToolsConfig = ToolsConfig()
    embedded: EmbeddedConfig = EmbeddedConfig()
    daemon: DaemonConfig = DaemonConfig()

    @property
    def log_dir(self) -> Path:
        return Path(self.log.dir).expanduser()

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

    def replace(self, section: str, **changes: Any) -> Config:
        """A copy with some keys of one section changed (checked like a file)."""
        merged = {**_as_table(getattr(self, section)), **changes}
        built = _build(type(getattr(self, section)), merged, section)
        return dataclasses.replace(self, **{section: built})


# --- checks -----------------------------------------------------------------------------

_MINIMUM: dict[str, float] = {
    "inference.timeout_s": 0.001,
    "inference.connect_timeout_s": 0.001,
    "inference.read_timeout_s": 0.001,
    "inference.retries": 0,
    "inference.backoff_s": 0,
    "inference.parallel": 1,
    "inference.constrained_tool_steps": 1,
    "inference.temperature": -1,
    "inference.seed": -1,
    "slots.disk_mb": 0,
    "loop.tool_iterations": 1,
    "loop.max_calls_per_response": 1,
    "loop.thinking_cap": 0,
    "loop.tool_result_cap": 1,
    "loop.max_tokens": 1,
    "tools.timeout_s": 0.001,
    "tools.heartbeat_s": 0.001,
    "tools.max_concurrent_calls": 1,
    "tools.max_frame_bytes": 1024,
    "tools.max_output_bytes": 1,
    "tools.start_timeout_s": 0.001,
    "tools.approval_timeout_s": 0,
    "embedded.ctx_size": 512,
    "embedded.port": 0,
    "embedded.startup_timeout_s": 1,
    "embedded.threads": 0,
    "embedded.slots": 1,
    "embedded.temperature": 0,
    "daemon.heartbeat_s": 0.01,
    "daemon.connect_timeout_s": 0.01,
    "daemon.max_frame_bytes": 1024,
}
# The largest value of a key where more cannot work: seconds beyond a week (1e308 overflowed
# the clock), threads or slots by the thousand (100,000 inference actors never started).
_WEEK = 7 * 24 * 3600
_MAXIMUM: dict[str, float] = {
    **{f"{section}.{f.name}": _WEEK
       for section, cls in (("inference", InferenceConfig), ("tools", ToolsConfig),
                            ("embedded", EmbeddedConfig), ("daemon", DaemonConfig))
       for f in dataclasses.fields(cls) if f.name.endswith("_s")},
    "inference.retries": 100,
    "inference.parallel": 64,
    "tools.max_concurrent_calls": 256,
    "tools.max_frame_bytes": 1024**3,
    "tools.max_output_bytes": 1024**3,
    "daemon.max_frame_bytes": 1024**3,
    "embedded.threads": 1024,
    "embedded.slots": 64,
    "embedded.temperature": 100,
    "inference.constrained_tool_steps": 64,
    "embedded.ctx_size": 1 << 24,
}
# A host's name becomes part of its socket's and its log's file names.
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Keys that existed once: a config naming one is told what replaced it.
_REMOVED = {
    "slots.main": "slots.main was removed: the slot keeper now gives each session a slot of "
    "its own (and saves and restores its KV state); delete the key. To choose how many "
    "slots the embedded server has, set embedded.slots",
}


def _as_table(section: Any) -> dict[str, Any]:
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def _check(key: str, annotation: str, value: Any) -> Any:
    ann = annotation.replace(" ", "")
    if ann.startswith("Literal["):
        allowed = [a.strip("'\"") for a in ann[len("Literal[") : -1].split(",")]
        if value not in allowed:
            raise ConfigError(f"{key} = {value!r}: allowed values are {', '.join(allowed)}")
        return value
    if ann == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r}: must be true or false")
        return value
    if ann in ("int", "float"):
        ok = isinstance(value, int) if ann == "int" else isinstance(value, int | float)
        if not ok or isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r}: must be a number ({ann})")
        if not math.isfinite(value):
            raise ConfigError(f"{key} = {value!r}: must be a finite number")
        low = _MINIMUM.get(key)
        if low is not None and value < low:
            raise ConfigError(f"{key} = {value!r}: must be at least {low:g}")
        if key == "embedded.port" and value > 65535:
            raise ConfigError(f"{key} = {value!r}: must be a port number, 0 to 65535")
        high = _MAXIMUM.get(key)
        if high is not None and value > high:
            raise ConfigError(f"{key} = {value!r}: must be at most {high:g}")
        return float(value) if ann == "float" else value
    if ann == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r}: must be a string")
        return value
    if ann == "tuple[str,...]":
        if isinstance(value, str) and key.endswith(".command"):
            try:
                value = shlex.split(value)
            except ValueError as e:
                raise ConfigError(
                    f"{key} = {value!r}: {e}; quote it like a shell command line"
                ) from None
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key} = {value!r}: must be a list of strings")
        return tuple(value)
    if ann in _TABLES:  # a sub-table such as [tools.shell]
        cls = _TABLES[ann]
        return value if isinstance(value, cls) else _build(cls, value, key)
    if ann == "tuple[HostConfig,...]":
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: must be an array of tables ([[tools.hosts]])")
        hosts = tuple(
            h if isinstance(h, HostConfig) else _build(HostConfig, h, f"{key}[{i}]")
            for i, h in enumerate(value)
        )
        _check_hosts(key, hosts)
        return hosts
    raise AssertionError(f"no check for {key}: {annotation}")  # a new field needs a check


_TABLES: dict[str, type[Any]] = {"ShellConfig": ShellConfig, "WebConfig": WebConfig}


def _check_hosts(key: str, hosts: tuple[HostConfig, ...]) -> None:
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
        if h.kind == "local" and not h.tools:
            raise ConfigError(f"{where}: a local host needs tools = [...]")


def _build(cls: Any, table: Any, prefix: str) -> Any:
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
    missing = [n for n, f in fields.items() if n not in table and f.default is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"[{prefix}] needs {', '.join(missing)}")
    values = {k: _check(f"{prefix}.{k}", str(fields[k].type), v) for k, v in table.items()}
    if cls is InferenceConfig and values.get("url") and values.get("servers"):
        raise ConfigError(
            "inference.url and inference.servers are both set: use url for one server or "
            "servers = [...] for several, not both"
        )
    if cls is ToolsConfig:
        _check_rules(prefix, values)
    return cls(**values)


def _check_rules(prefix: str, values: Mapping[str, Any]) -> None:
    from actors.base.rules import parse_rule

    for key in ("allow", "deny"):
        for text in values.get(key, ()):
            try:
                parse_rule(text)
            except ValueError as e:
                raise ConfigError(f"{prefix}.{key}: {e}") from None


def parse(data: Mapping[str, Any]) -> Config:
    """A Config from already-parsed TOML data; every key optional."""
    sections = {f.name: f for f in dataclasses.fields(Config)}
    unknown = set(data) - set(sections)
    if unknown:
        raise ConfigError(
            f"unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(sections)}"
        )
    built = {}
    for name, value in data.items():
        default = getattr(Config(), name)
        built[name] = _build(type(default), {**_as_table(default), **_table(value, name)}, name)
    return Config(**built)


def _table(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"[{name}] must be a table, got {type(value).__name__}")
    return value


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """The config from ``path``, else ``$LOOPD_CONFIG``, else the defaults."""
    chosen = path if path is not None else os.environ.get("LOOPD_CONFIG") or None
    if chosen is None:
        return Config()
    p = Path(chosen).expanduser()
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
        return parse(data)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
