"""A client in its own process: ``python -m tests.daemon.turn_client CONFIG SESSION TEXT
[--hang-on-approval]``.

Runs one turn through the daemon and prints each event's name as it comes (flushed), then
``done`` or ``error KIND``; the client-killed tests SIGKILL it mid-turn. With
``--hang-on-approval`` it prints ``asked`` when an approval comes and never answers.
"""

from __future__ import annotations

import sys
import time

from actors.base import config as cfg
from actors.base.errors import LoopdError
from actors.base.events import event_name
from actors.daemon.client import Client


def _hang(request: object, cancel: object, deadline: float) -> None:
    print("asked", flush=True)
    time.sleep(3600)


def main(argv: list[str]) -> int:
    path, session, text, *flags = argv
    with Client.from_config(cfg.load(path)) as client:
        turn = client.turn(session, text, _hang if "--hang-on-approval" in flags else None)
        try:
            for event in turn:
                print(event_name(event), flush=True)
        except LoopdError as e:
            print(f"error {type(e).__name__}", flush=True)
            return 1
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
