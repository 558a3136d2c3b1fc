"""A compaction by hand run in a process of its own that stops at a chosen point, says so on
stdout and waits to be SIGKILLed (tests/faults/test_compact_kill.py): ``summary`` (the
model's summary is ready, the Compaction record not written) or ``record`` (just after the
record was appended). The log is ROOT/sessions/s/log.bin, as the test wrote it.

    python -m tests.faults.compact_child ROOT POINT
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.base.cancel import CancelToken
from actors.base.config import parse
from actors.inference.types import ChatRequest, Completion
from actors.log.file import SessionLog
from actors.session import compactor

POINTS = ("summary", "record")
SUMMARY = "They asked about five things."


class Model:
    """The model of the child: a context of 1,000 tokens, 4 characters a token."""

    def complete(self, request: ChatRequest, sink: Callable[[Any], None],
                 cancel: CancelToken) -> Completion:
        return Completion(content=SUMMARY, reasoning=None, tool_calls=(), timings={},
                          usage={}, reasoning_tokens=0, thinking_capped=False,
                          finish_reason="stop")

    def context(self, session: str) -> int:
        return 1000

    def tokens(self, session: str, text: str) -> int:
        return len(text) // 4


def stop(point: str) -> None:
    print(point, flush=True)
    while True:
        signal.pause()


def main(root: str, point: str) -> None:
    config = parse({"log": {"dir": str(Path(root) / "sessions")},
                    "session": {"compaction": "summary"}})
    if point == "summary":
        real = compactor.Compactor._summary

        def summary(self: compactor.Compactor, *args: Any) -> str:
            out = real(self, *args)
            stop(point)
            return out
        compactor.Compactor._summary = summary  # type: ignore[method-assign]
    log, _ = SessionLog.open(Path(root) / "sessions" / "s" / "log.bin", fsync="always",
                             name="s")
    compactor.compact_session(log, config, Model(), lambda _: None)
    stop("record")


if __name__ == "__main__":
    main(*sys.argv[1:3])
