"""The load workload shared by the load test and the sessions bench: 4 hosts, one tool each.

Every turn makes one tool call on one of the 4 hosts (in turn by session and turn number),
then the agent script (:mod:`tests.support.scripted_llama`) answers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.base.config import Config, HostConfig, parse
from actors.log.file import SessionLog
from actors.log.records import Assistant, Baseline, CacheLoss, Record, ToolResult, User
from actors.tools.toolbox import Toolbox
from tests.support.scripted_llama import call_id

__all__ = [
    "HOSTS", "SLOTS", "TOOLS", "TURN_KINDS", "check_log", "check_reopen", "expected_results",
    "load_config", "message",
]  # fmt: skip

SLOTS = 4
TOOLS = {  # host name: (its tool, the arguments a turn gives it; %s is the turn's tag)
    "h_read": ("read_file", '{"path": "notes.txt"}'),
    "h_list": ("list_dir", '{"path": "."}'),
    "h_search": ("search_files", '{"pattern": "hello"}'),
    "h_echo": ("echo", '{"text": "echo %s"}'),
}
HOSTS = list(TOOLS)
TURN_KINDS = ["User", "Assistant", "Usage", "ToolResult", "Assistant", "Usage"]


def run_at_once(drive: Callable[[int], None], n: int) -> float:
    """``drive(0)`` ... ``drive(n - 1)``, each in its own thread, all at once: the wall time in
    seconds. The first error a driver raised is raised here, once all have ended."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            drive(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return wall


def message(session: int, n: int) -> str:
    """Turn ``n`` of session ``session``: the agent script's call of one host's tool."""
    tool, args = TOOLS[HOSTS[(session + n) % len(HOSTS)]]
    tag = f"s{session:02d} t{n:03d}"
    return f"{tag} :: {tool} {args.replace('%s', tag)}"


def load_config(root: Path, url: str, **sections: dict[str, Any]) -> Config:
    """A workspace under ``root`` and the config of the 4 hosts; ``sections`` add keys."""
    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello from the workspace\n")
    hosts = tuple(HostConfig(name=h, tools=(tool,)) for h, (tool, _) in TOOLS.items())
    table: dict[str, dict[str, Any]] = {
        "inference": {"url": url, "parallel": SLOTS, "timeout_s": 60},
        "log": {"dir": str(root / "sessions")},
        "tools": {"standard": False, "workspace": str(workspace), "timeout_s": 30,
                  "max_concurrent_calls": 32, "start_timeout_s": 120},  # a hang guard
    }  # fmt: skip
    for name, keys in sections.items():
        table[name] = {**table.get(name, {}), **keys}
    return parse(table).replace("tools", hosts=hosts)


def expected_results(toolbox: Toolbox) -> dict[str, str]:
    """What each host's tool answers (echo aside), asked once before the load."""
    out = {}
    for host, (tool, args) in TOOLS.items():
        if tool == "echo":
            continue
        entry = toolbox.registry.entry(tool)
        assert entry is not None and entry[1].name == host
        port = entry[1]
        answer = port.call(session="probe", call=1, tool=tool, arguments=json.loads(args))
        out[tool] = getattr(answer, "content", repr(answer))
    return out


def check_log(
    records: tuple[Record, ...], session: int, expected: dict[str, str], turns: int
) -> None:
    """Session ``session``'s log holds ``turns`` whole turns of :func:`message`, in order."""
    assert isinstance(records[0], Baseline)
    body = [r for r in records[1:] if not isinstance(r, CacheLoss)]
    assert [type(r).__name__ for r in body] == TURN_KINDS * turns, f"session {session}"
    for n in range(turns):
        user, call, _, result, answer, _ = body[6 * n : 6 * n + 6]
        text = message(session, n)
        tag = text.split(" ::")[0]
        tool = TOOLS[HOSTS[(session + n) % len(HOSTS)]][0]
        assert isinstance(user, User) and user.content == text
        assert isinstance(call, Assistant) and call.tool_calls[0].id == call_id(tag, 0)
        assert isinstance(result, ToolResult) and result.call == n + 1
        assert result.content == expected.get(tool, f"echo {tag}"), f"session {session} turn {n}"
        assert isinstance(answer, Assistant) and answer.content == f"done {tag}."


def check_reopen(log_dir: Path, counts: dict[int, int]) -> None:
    """Each load session, closed cleanly, reopens with nothing cut and all its records."""
    for s, count in counts.items():
        log, report = SessionLog.open(log_dir / f"load{s:02d}" / "log.bin", fsync="never")
        log.close()
        assert report.cut_bytes == 0 and report.records == count, f"session {s}"
