"""What a turn that answered gives back: in its own module so a daemon client can build one
without importing the turn (and with it inference, tools and pykka)."""

from __future__ import annotations

import dataclasses

from actors.log.records import SlotUse, Usage

__all__ = ["TurnOutcome"]


@dataclasses.dataclass(frozen=True, slots=True)
class TurnOutcome:
    content: str
    usage: Usage
    iterations: int  # model responses that asked for tools
    tool_calls: int
    cut: bool  # the answer was cut: usage.finish_reason says how (types.CUT)
    restored: SlotUse | None = None  # the turn's restore of saved KV state, if any
    context: int = 0  # tokens the session's slot holds (its n_ctx); 0: not known
    compactions: int = 0  # compactions the turn made (actors/session/compactor.py)
