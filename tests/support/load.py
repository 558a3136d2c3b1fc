"""The load workload shared by the load test and the sessions bench: 4 hosts, one tool each.

Every turn makes one tool call on one of the 4 hosts (in turn by session and turn number),
then the agent script (:mod:`tests.support.scripted_llama`) answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.config import Config, HostConfig, parse

__all__ = ["HOSTS", "SLOTS", "TOOLS", "load_config", "message"]

SLOTS = 4
TOOLS = {  # host name: (its tool, the arguments a turn gives it; %s is the turn's tag)
    "h_read": ("read_file", '{"path": "notes.txt"}'),
    "h_list": ("list_dir", '{"path": "."}'),
    "h_search": ("search_files", '{"pattern": "hello"}'),
    "h_echo": ("echo", '{"text": "echo %s"}'),
}
HOSTS = list(TOOLS)


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
                  "max_concurrent_calls": 32},
    }  # fmt: skip
    for name, keys in sections.items():
        table[name] = {**table.get(name, {}), **keys}
    return parse(table).replace("tools", hosts=hosts)
