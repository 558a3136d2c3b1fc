"""The baseline's KV state: saved once, restored into the slot of every new session.

Every new session of a model and config starts with the same prompt prefix: the system
prompt and the tools, as the server's chat template renders them (the *baseline*, ~1,170
tokens on the embedded model). Its KV state is saved once, like a session's, in the same
save directory and under the same ``slots.disk_mb``, and restored into the slot of a new
session (or of any session whose own state cannot be restored), so its first request
processes only its message (docs/slots.md#a-new-session-starts-warm).

The key has two parts. The file's name hashes the rendered prefix and the server's slot
count (:func:`baseline_key`): the system prompt, the tools and the chat template, so a
config that changes any of them gets another file, and configs of another slot count keep
their own. Its metadata holds the rest: the model and the server build that saved it (the
fingerprint); a file of another model or build under the same name is *stale*, never
restored, and replaced by the next save. Baselines no config uses any more go: all
but the :data:`KEPT` most recently used when one is saved (:func:`unused_baselines`),
besides the least-recently-used bound the sessions' files share (``slots.disk_mb``).

The prefix is where two renderings of the baseline with different user messages part
(:func:`common_prefix`): it ends with the template's opening of the user turn, which every
first request shares. The pure parts are here; the keeper does the HTTP and file work
(:meth:`actors.inference.slots.keeper.SlotKeeper.warm_start`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from actors.inference.slots.files import SlotFile

__all__ = [
    "BASELINE_SESSION",
    "KEPT",
    "PROBES",
    "baseline_key",
    "baseline_messages",
    "common_prefix",
    "is_baseline",
    "unused_baselines",
]

PREFIX = "_baseline-"  # no session's key starts with "_" (a session name starts with [A-Za-z0-9])
BASELINE_SESSION = "(baseline)"  # the metadata's session field of a baseline's file
KEPT = 16  # baselines kept at most (least recently used beyond go): one per config in use

# Two user messages that part at their first character: where their renderings part is the
# end of the prefix every first request shares.
PROBES = ("a", "b")


def baseline_messages(system: Mapping[str, Any], user: str) -> list[Mapping[str, Any]]:
    """The messages whose rendering holds the baseline's prefix: its system prompt, then a
    user message ``user``."""
    return [system, {"role": "user", "content": user}]


def common_prefix(a: str, b: str) -> str:
    """The longest text both ``a`` and ``b`` start with."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]


def baseline_key(prefix: str, slots: int = 1) -> str:
    """The name (``KEY.bin``, ``KEY.json``) of the saved state of the rendered ``prefix`` on
    a server of ``slots`` slots (a state restores only on the same count: configs of one
    and of two slots keep a baseline each, side by side)."""
    text = f"slots={slots}\n{prefix}"
    return PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def is_baseline(key: str) -> bool:
    return key.startswith(PREFIX)


def unused_baselines(files: Iterable[tuple[str, SlotFile]], keep: int = KEPT) -> list[str]:
    """The baselines no config uses any more: all but the ``keep`` most recently used
    (every new session uses its baseline). Those of another model or build are not picked
    out: configs of two models may share a save directory, and a stale file under a
    baseline's name is replaced by its next save."""
    bases = sorted(((key, meta) for key, meta in files if is_baseline(key)),
                   key=lambda b: (-b[1].used, b[0]))
    return [key for key, _ in bases[keep:]]
