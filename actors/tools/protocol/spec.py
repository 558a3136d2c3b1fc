"""What a tool host offers: a tool's name, description, argument schema and policy."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = ["ResultClass", "ToolSpec"]


class ResultClass(enum.StrEnum):
    """How far a tool result may travel: kept in the log, shown to the person or not."""

    PUBLIC = "public"
    INTERNAL = "internal"
    SECRET = "secret"


@dataclasses.dataclass(frozen=True, slots=True)
class ToolSpec:
    KIND: ClassVar[str] = "tool"  # its name in a wire message's errors ("tool 0: ...")

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments object
    result_class: ResultClass = ResultClass.PUBLIC
    needs_approval: bool = False
    untrusted: bool = False  # results come from outside (web, MCP open-world tools)
