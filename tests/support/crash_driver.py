"""A loopd daemon that runs numbered turns on one session until it is killed (crash tests).

``python -m tests.support.crash_driver --url URL --log-dir DIR --workspace DIR --turns N``
opens (or creates) session ``crash`` the way ``loopd`` does
(:func:`actors.session.world.start_world`,
its own local tool host, fsync "always"), prints ``ready {"hosts": [pids]}``, then runs turn
*n* for every *n* after the last User record of the log, printing ``done n`` after each, and
``finished`` at the end. Turn *n* is :func:`message` (n): one tool call (run_command,
read_file or list_dir in turn) and an answer, as the agent script of
:mod:`tests.support.scripted_llama` makes the fake llama-server do.

:func:`drive` is the same thing in-process, for the clean reference run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from actors.base.config import Config, parse
from actors.log.records import User
from actors.session.world import start_world

__all__ = ["SESSION", "config", "drive", "main", "message"]

SESSION = "crash"
_STEPS = (
    'run_command {"command": "echo hello from the shell"}',
    'read_file {"path": "notes.txt"}',
    'list_dir {"path": "."}',
)


def message(n: int) -> str:
    """The user message of turn ``n`` (the agent script reads its orders from it).

    The number has a fixed width, so every turn of a kind has the same token counts.
    """
    return f"turn {n:06d} :: {_STEPS[(n - 1) % len(_STEPS)]}"


def config(url: str, log_dir: str, workspace: str) -> Config:
    """The daemon's config: the given server and log directory, one local tool host."""
    return parse({
        "inference": {"url": url, "retries": 2, "backoff_s": 0.01, "timeout_s": 30},
        "log": {"dir": log_dir, "fsync": "always"},
        "tools": {
            "standard": False, "workspace": workspace, "allow": ["run_command"],
            # a busy machine may starve a healthy host for a second; a dead one is seen at once
            "heartbeat_s": 1.0, "start_timeout_s": 120,
            "hosts": [{"name": "tools", "tools": ["run_command", "read_file", "list_dir"]}],
        },
    })  # fmt: skip


def drive(cfg: Config, turns: int, say: Callable[[str], None]) -> None:
    """Run the turns after the last one in the log, up to ``turns``; ``say`` reports progress."""
    with start_world(cfg) as world:
        session = world.session(SESSION)
        hosts = _host_pids(world)
        say("ready " + json.dumps({"hosts": hosts}))
        records = session.records().get(timeout=30)
        start = sum(1 for r in records if isinstance(r, User)) + 1
        for n in range(start, turns + 1):
            session.turn(world.runtime, message(n), _ignore).get(timeout=60)
            say(f"done {n}")
    say("finished")


def _host_pids(world: Any) -> list[int | None]:
    """The tool hosts' pids, through the registry's ports (the world keeps no Toolbox)."""
    return [port.status().pid for port in world.runtime.registry.ports]


def _ignore(event: object) -> None:
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    drive(config(args.url, args.log_dir, args.workspace), args.turns, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
