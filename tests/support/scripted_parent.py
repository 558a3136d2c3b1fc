"""A real inference handle whose one session's first response is scripted: ``agent`` calls.

The real-model test and bench of agents (tests/session/test_agents_embedded.py,
scripts/bench_agents.py) measure the children, not whether a small model chooses to start
them: the parent's first response is these calls, every other request is the real model's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from actors.base.cancel import CancelToken
from actors.base.events import Event
from actors.inference.types import ChatRequest, Completion
from actors.log.records import ToolCall

__all__ = ["ParentScripted"]


class ParentScripted:
    """``inner`` (an Inference), but the first request of ``parent`` made through it (make
    one a turn) answers agent calls of ``tasks`` (task, context)."""

    def __init__(self, inner: Any, parent: str, tasks: Sequence[tuple[str, str]]) -> None:
        self.inner, self.parent, self.tasks = inner, parent, list(tasks)
        self.scripted = False

    def complete(self, request: ChatRequest, sink: Callable[[Event], None],
                 cancel: CancelToken) -> Completion:
        if request.session == self.parent and not self.scripted:
            self.scripted = True
            calls = tuple(ToolCall(id=f"call-{i}", name="agent",
                                   arguments=json.dumps({"task": task, "context": context}))
                          for i, (task, context) in enumerate(self.tasks))
            return Completion(content=None, reasoning=None, tool_calls=calls, timings={},
                              usage={}, reasoning_tokens=0, thinking_capped=False,
                              finish_reason="tool_calls")
        completion: Completion = self.inner.complete(request, sink, cancel)
        return completion

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
