"""A fork run in a process of its own that stops at a chosen point, says so on stdout and
waits to be SIGKILLed (tests/faults/test_fork_kill.py). The points, in the order a fork
passes them: ``locked`` (it holds the fork lock), ``state`` (the KV state is copied, the
log not yet written), ``half-log`` (half of the new log written), ``before-rename`` (the
hidden directory whole), ``after-rename`` (NEW in place, its directory entry not synced).

    python -m tests.faults.fork_child ROOT POINT
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.base.config import Config, parse
from actors.session import fork

POINTS = ("locked", "state", "half-log", "before-rename", "after-rename")


def config_at(root: Path) -> Config:
    """The child's and the test's config: sessions, a save directory loopd can reach."""
    return parse({"log": {"dir": str(root / "sessions")}, "slots": {"save_dir": str(root / "save")},
                  "embedded": {"data_dir": str(root / "embedded")}})


def stop(point: str) -> None:
    print(point, flush=True)
    while True:
        signal.pause()


def after(point: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        stop(point)
        return out
    return wrapped


def main(root: str, point: str) -> None:
    if point == "locked":
        fork._sweep = after(point, fork._sweep)  # type: ignore[attr-defined]
    elif point == "state":
        fork.copy_state = after(point, fork.copy_state)  # type: ignore[attr-defined]
    elif point == "half-log":
        def half(fd: int, data: bytes) -> None:
            os.write(fd, data[: len(data) // 2])
            os.fsync(fd)
            stop(point)
        fork.write_all = half  # type: ignore[attr-defined]
    elif point in ("before-rename", "after-rename"):
        real = os.rename

        def rename(a: Any, b: Any) -> None:
            if point == "before-rename":
                stop(point)
            real(a, b)
            stop(point)
        os.rename = rename
    else:
        raise SystemExit(f"no point {point!r}: one of {', '.join(POINTS)}")
    fork.fork_session(config_at(Path(root)), "src", "new")
    print("finished", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
