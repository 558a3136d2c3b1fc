"""A client in its own process: ``python -m tests.daemon.turn_client CONFIG SESSION TEXT``.

Runs one turn through the daemon and prints each event's name as it comes (flushed), then
``done`` or ``error KIND``; the client-killed test SIGKILLs it mid-turn.
"""

from __future__ import annotations

import sys

from actors import config as cfg
from actors.client import Client
from actors.errors import LoopdError
from actors.events import event_name


def main(argv: list[str]) -> int:
    path, session, text = argv
    with Client.from_config(cfg.load(path)) as client:
        turn = client.turn(session, text)
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
