"""The slot keeper's spans: a KV save (an eviction) and a restore, inside the model request
that needed them, received by a real OTLP/HTTP receiver (tests/support/otlp.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.base import telemetry
from tests.inference.slots.slots_rig import Slots
from tests.support.otlp import Receiver, Span, receiving

pytest.importorskip("opentelemetry.sdk.trace")


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with receiving(monkeypatch) as rx:
        yield rx


def test_a_save_and_a_restore_are_spans_of_the_request_that_needed_them(
    tmp_path: Path, otlp: Receiver
) -> None:
    rig = Slots(tmp_path, slots=1)
    try:
        rig.turn("a")
        rig.turn("b")  # a's state saved before b gets the only slot
        rig.turn("a")  # b saved, a restored
    finally:
        rig.close()
    assert telemetry.flush()
    spans = otlp.wait(lambda s: len([x for x in s if x.name == "loopd.kv_save"]) >= 2
                      and any(_restored(x) for x in s))  # not any restore: b's comes first
    chats = {s.span_id: s for s in spans if s.name.startswith("chat ")}
    saves = [s for s in spans if s.name == "loopd.kv_save"]
    assert [s.attributes["gen_ai.conversation.id"] for s in saves][:2] == ["a", "b"]
    assert all(s.attributes["loopd.kv.saved"] and s.attributes["loopd.kv.saved_tokens"] > 0
               for s in saves[:2])
    assert chats[saves[0].parent_id].attributes["gen_ai.conversation.id"] == "b"  # evicted for b
    (restore,) = [s for s in spans if _restored(s)]
    assert restore.attributes["gen_ai.conversation.id"] == "a"
    assert restore.attributes["loopd.kv.restored_tokens"] > 0
    asked = chats[restore.parent_id].attributes
    assert asked["gen_ai.conversation.id"] == "a" and asked["loopd.slot.state"] == "restored"


def _restored(span: Span) -> bool:
    return bool(span.name == "loopd.kv_restore"
                and span.attributes.get("loopd.slot.state") == "restored")
