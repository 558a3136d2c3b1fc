"""An editor and a raw client for `loopd acp` over its stdio, and the fake model they meet,
for the ACP tests (their fixtures are in tests/acp/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
from acp.schema import (
    AllowedOutcome,
    EnvVariable,
    McpServerStdio,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)

from actors.log.file import read_log
from actors.log.records import Approval, Record, ToolResult, User
from tests.support.fake_llama import Reply, answer, stall
from tests.support.scripted_llama import agent
from tests.support.watch import HANG_S

__all__ = [
    "MAX_TOKENS", "PROBE", "ROOT", "TOOL_ITERATIONS", "AcpEnv", "Editor", "RawAgent",
    "assert_gone", "check_flow_log", "children_of", "model", "probe",
]


ROOT = Path(__file__).resolve().parents[2]


MAX_TOKENS = 64  # loop.max_tokens: a [long] answer is cut here


TOOL_ITERATIONS = 3  # loop.tool_iterations


def _last_user(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return content if isinstance(content, str) else json.dumps(content)


def model() -> Callable[[dict[str, Any]], Reply]:
    orders = agent()

    def script(body: dict[str, Any]) -> Reply:
        text = _last_user(body)
        if "[stall]" in text:
            return stall(6)
        if "[long]" in text:
            return answer("word " * (4 * MAX_TOKENS))
        return orders(body)

    return script


class Editor:
    """The client's side: keeps every update, answers permission requests from a list."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self._came = asyncio.Event()
        self.asked: list[tuple[ToolCallUpdate, list[PermissionOption]]] = []
        self.answers: list[str] = []  # option kinds, in order
        self.on_update: Callable[[str, Any], Awaitable[None]] | None = None

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append((session_id, update))
        self._came.set()
        if self.on_update is not None:
            await self.on_update(session_id, update)

    async def wait_for_updates(self, count: int, timeout: float = HANG_S) -> None:
        """Until ``count`` updates have come (woken by each one), or a hang guard fails."""
        async with asyncio.timeout(timeout):
            while len(self.updates) < count:
                self._came.clear()
                await self._came.wait()

    async def request_permission(self, options: list[PermissionOption], session_id: str,
                                 tool_call: ToolCallUpdate, **_: Any) -> RequestPermissionResponse:
        self.asked.append((tool_call, options))
        kind = self.answers.pop(0)
        (chosen,) = [o for o in options if o.kind == kind]
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id))

    def on_connect(self, conn: Any) -> None:
        pass

    def since(self, mark: int) -> list[Any]:
        return [u for _, u in self.updates[mark:]]


class AcpEnv:
    """A workspace (``ws``, with notes.txt), a rules file, a session directory and a config
    for ``loopd acp`` against ``url``."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url
        self.workspace = root / "ws"
        self.workspace.mkdir(parents=True, exist_ok=True)
        (self.workspace / "notes.txt").write_text("Buy seeds.\n")
        self.rules = root / "rules.toml"
        self.sessions = root / "sessions"
        self.stderr = root / "acp-stderr.txt"
        self.config = root / "loopd.toml"
        self.config.write_text(
            f'[log]\ndir = "{self.sessions}"\nfsync = "always"\n'
            f'[tools]\nstandard = false\nrules_file = "{self.rules}"\napproval_timeout_s = 60\n'
            "start_timeout_s = 120\n"  # a hang guard: hosts (the editor's too) on a busy machine
            '[[tools.hosts]]\nname = "files"\n'
            'tools = ["read_file", "write_file", "list_dir", "run_command"]\n'
            # no bubblewrap needed: the commands of these tests touch only the workspace
            '[tools.shell]\nsandbox = "none"\n'
            f'[inference]\nurl = "{url}"\nretries = 1\nbackoff_s = 0.01\ntimeout_s = 30\n'
            f"[loop]\ntool_iterations = {TOOL_ITERATIONS}\nmax_tokens = {MAX_TOKENS}\n"
        )

    def argv(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "actors.cli", "acp", "--config", str(self.config), *extra]

    def environ(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT)}

    def records(self, session: str) -> list[Record]:
        """The session's log, read as ``loopd log show`` reads it: it must be valid."""
        records, torn = read_log(self.sessions / session / "log.bin", name=session)
        assert torn == 0, f"session {session}: a torn tail of {torn} bytes"
        return records


def check_flow_log(env: AcpEnv, session: str) -> None:
    """After the flow both SDK clients run (test_python_client.py, flow.mjs): the log is
    valid and says what was decided, and the rules file keeps both "always" answers."""
    records = env.records(session)
    assert [r.content for r in records if isinstance(r, User)][-1] == "t12"
    decided = [(a.decision.value, a.scope.value, a.by, a.rule) for a in records
               if isinstance(a, Approval)]
    assert decided == [
        ("allow", "once", "person", ""),
        ("allow", "always", "person", "run_command = touch made.txt"),
        ("allow", "always", "rule", "run_command = touch made.txt"),
        ("deny", "once", "person", ""),
        ("deny", "always", "person", "run_command = rm notes.txt"),
        ("deny", "always", "rule", "run_command = rm notes.txt"),
    ]
    assert sum(isinstance(r, ToolResult) for r in records) >= 9
    rules = env.rules.read_text()
    assert 'allow = ["run_command = touch made.txt"]' in rules
    assert 'deny = ["run_command = rm notes.txt"]' in rules


def children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def assert_gone(processes: list[psutil.Process]) -> None:
    """Every process in ``processes`` has ended (tool hosts exit when loopd does)."""
    _, alive = psutil.wait_procs(processes, timeout=20)
    for p in alive:
        p.kill()
    assert not alive, f"left running: {alive}"


class RawAgent:
    """``loopd acp`` driven line by line: for bytes no SDK client would send."""

    def __init__(self, argv: list[str], stderr: Path) -> None:
        self.stderr = stderr
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=stderr.open("ab"),
        )  # fmt: skip
        self.lines: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.stdout_bytes: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.ids = iter(range(1, 1_000_000))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout_bytes.append(line)
            self.lines.put(line)
        self.lines.put(b"")

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, method: str, params: Any = None, *, notify: bool = False) -> int:
        rid = next(self.ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if not notify:
            message["id"] = rid
        self.write(json.dumps(message).encode() + b"\n")
        return rid

    def read(self, timeout: float = 60) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout)
        assert line, "loopd acp closed its stdout"
        message: dict[str, Any] = json.loads(line)  # every line on stdout is JSON-RPC
        return message

    def answer(self, rid: Any, timeout: float = 60) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The answer to request ``rid``, and the notifications that came before it."""
        seen = []
        while True:
            message = self.read(timeout)
            if "method" not in message and message.get("id") == rid:
                return message, seen
            seen.append(message)

    def request(self, method: str, params: Any = None) -> dict[str, Any]:
        message, _ = self.answer(self.send(method, params))
        return message

    def start(self, cwd: Path) -> str:
        """initialize and session/new; the new session's id."""
        assert "result" in self.request("initialize", {"protocolVersion": 1})
        made = self.request("session/new", {"cwd": str(cwd), "mcpServers": []})
        session: str = made["result"]["sessionId"]
        return session

    def close(self, timeout: float = 60) -> int:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


PROBE = ROOT / "tests" / "acp" / "mcp_probe.py"  # an MCP server an editor names (stdio)


def probe(name: str = "probe", **env: str) -> McpServerStdio:
    """The editor's ``mcpServers`` entry for :data:`PROBE`, with ``env`` given to it."""
    return McpServerStdio(name=name, command=sys.executable, args=[str(PROBE)],
                          env=[EnvVariable(name=k, value=v) for k, v in env.items()])
