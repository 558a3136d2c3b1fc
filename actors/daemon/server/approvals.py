"""Approval for a turn run for a client: the question goes to the client, the turn waits.
(The client's own allow rules for the turn, ``loopd run --approve``, are
:class:`actors.service.local.TurnRules`.)

:class:`RemoteApprover` is an :class:`actors.approval.gate.Approver`. It is called in the session
actor's thread when a call needs the person's approval: it sends the client an ``approval``
message and waits for the ``approve`` of that call, until the request's deadline or the
turn's cancel token (a ``cancel``, the client gone, the daemon stopping), whichever comes
first. No answer is None: the gate makes it a denial that says so, or Cancelled.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from actors.base.cancel import CancelToken
from actors.base.events import ApprovalRequested, Decision
from actors.daemon import protocol as p

__all__ = ["RemoteApprover"]

_POLL_S = 0.05  # how often the wait looks at the cancel token


class RemoteApprover:
    """Asks turn ``rid``'s client; :meth:`answer` (from the daemon's loop) delivers replies."""

    def __init__(self, rid: int, post: Callable[[p.Message], None]) -> None:
        self.rid, self._post = rid, post
        self._answers: queue.SimpleQueue[p.Approve] = queue.SimpleQueue()

    def answer(self, msg: p.Approve) -> None:
        self._answers.put(msg)

    def __call__(
        self, request: ApprovalRequested, cancel: CancelToken, deadline: float
    ) -> Decision | None:
        self._post(p.Approval(
            self.rid, request.call, request.tool, request.arguments, request.prompt,
            request.rule, request.timeout_s, request.child,
        ))  # fmt: skip
        while not cancel.cancelled:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                msg = self._answers.get(timeout=min(left, _POLL_S))
            except queue.Empty:
                continue
            if msg.call == request.call:  # else a late answer to an earlier question
                return Decision(msg.choice, msg.reason, msg.by or "person")
        return None
