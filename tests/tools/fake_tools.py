"""Tools for tests, loaded into real tool hosts with ``--provider tests.tools.fake_tools:provider``.

Each one makes one behaviour easy to trigger and to observe from outside the host: a
tool that waits for a file (so a test decides when it ends, with no sleeps), one that
hangs in pure Python ignoring every request to stop, one that raises, one that returns
something that is not an answer, and one that leaves a marker file (so a test can prove a
call did or did not run).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actors.tools.protocol.provider import ASK, PROGRESS
from actors.tools.protocol.spec import ToolSpec
from actors.tools.protocol.wire import Answer, Result

__all__ = ["FakeTools", "provider"]


def _obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


_SPECS = [
    ToolSpec("echo", "Answer with the text.", _obj(text={"type": "string"})),
    ToolSpec(
        "wait_for_file", "Wait until a file exists, then answer.", _obj(path={"type": "string"})
    ),
    ToolSpec("hang", "Sleep in Python, ignoring cancel.", _obj(seconds={"type": "number"})),
    ToolSpec("boom", "Raise an exception.", _obj(message={"type": "string"})),
    ToolSpec("not_an_answer", "Return something that is not an answer.", _obj()),
    ToolSpec("touch", "Create a marker file.", _obj(path={"type": "string"})),
    ToolSpec("pid", "This host's process id.", _obj()),
    ToolSpec("steps", "Report progress three times.", _obj()),
    ToolSpec("long_steps", "Take steps of a second each, reporting each.",
             _obj(steps={"type": "integer"})),
    ToolSpec("question", "Ask the person a question mid-call.", _obj(message={"type": "string"})),
]


class FakeTools:
    def specs(self) -> list[ToolSpec]:
        return list(_SPECS)

    def run(
        self, tool: str, arguments: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer:
        if tool == "echo":
            return Result(content=str(arguments["text"]))
        if tool == "wait_for_file":
            path = Path(arguments["path"])
            while not path.exists():
                time.sleep(0.01)
            return Result(content="file appeared")
        if tool == "hang":
            time.sleep(float(arguments["seconds"]))
            return Result(content="woke up")
        if tool == "boom":
            raise RuntimeError(str(arguments["message"]))
        if tool == "not_an_answer":
            return 42  # type: ignore[return-value]  # the bug this tool stands for
        if tool == "touch":
            Path(arguments["path"]).write_text("ran", encoding="utf-8")
            return Result(content="touched")
        if tool == "pid":
            return Result(content=str(os.getpid()))
        if tool == "steps":
            report = PROGRESS.get()
            for i in range(1, 4):
                if report is not None:
                    report(i, 3 if i > 1 else None, f"step {i}")
            return Result(content="3 steps taken")
        if tool == "long_steps":
            report, n = PROGRESS.get(), int(arguments["steps"])
            for i in range(1, n + 1):
                if cancel.wait(0.3):
                    return Result(content="stopped")
                if report is not None:
                    report(i, n, "")
            return Result(content=f"{n} long steps taken")
        if tool == "question":
            asker = ASK.get()
            if asker is None:
                return Result(content="nobody to ask")
            form = {"type": "object", "properties": {"name": {"type": "string", "default": "Ada"}}}
            action, content = asker("fake", str(arguments["message"]), form)
            return Result(content=f"{action} {json.dumps(content, sort_keys=True)}")
        raise AssertionError(tool)

    def close(self) -> None:
        pass


def provider() -> FakeTools:
    return FakeTools()
