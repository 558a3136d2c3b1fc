"""The slot keeper against fake llama-servers that save and restore real files.

Leases and affinity, eviction with save then restore, more sessions than slots at once, a
new command that continues a session, a server without a save path, two servers with one
killed, and every way a saved state can fail: each is a logged CacheLoss with its cause, and
the request re-processes (never an error, never a wrong answer).
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.base.cancel import CancelToken
from actors.base.errors import Cancelled, LoopdError
from actors.base.events import Queued
from actors.inference.slots import files as slotfiles
from actors.inference.slots import keeper as keeper_module
from actors.inference.slots.keeper import (
    NO_SAVE_PATH,
    SERVER_CHANGED,
    Pick,
    _Slot,
    pick_server,
    pick_slot,
)
from actors.inference.types import InferError, InferErrorKind
from actors.log.records import SlotState
from tests.inference.slots.slots_rig import Slots, restored
from tests.support.fake_llama import Conn, Reply, answer
from tests.support.inference_rig import request
from tests.support.watch import HANG_S, wait_until


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[Slots] = []

    def build(**kwargs: Any) -> Slots:
        made.append(Slots(tmp_path / str(len(made)), **kwargs))
        return made[-1]

    yield build
    for rig in made:
        rig.close()


def in_background(rig: Slots, name: str) -> threading.Thread:
    """``name``'s turn in a thread; how it ends (answer or error) does not matter here."""

    def run() -> None:
        with contextlib.suppress(LoopdError):
            rig.turn(name)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# --- the pure decisions ---------------------------------------------------------------------


def test_pick_slot_prefers_its_own_then_a_free_one_then_the_least_recently_used() -> None:
    slots = [_Slot(0, holder="a", used=5), _Slot(1, holder="b", used=2), _Slot(2, used=9)]
    assert pick_slot("a", slots) == Pick(0, "kept")
    assert pick_slot("c", slots) == Pick(2, "free")
    slots[2].holder = "d"
    assert pick_slot("c", slots) == Pick(1, "evict", "b")  # b was used longest ago
    slots[1].leased = True
    assert pick_slot("c", slots) == Pick(0, "evict", "a")
    slots[0].saving = True  # a save in flight: that slot waits, like its own session does
    assert pick_slot("a", slots) is None
    slots[2].leased = True
    assert pick_slot("c", slots) is None


def test_pick_server_keeps_the_home_server_and_spreads_new_sessions() -> None:
    servers = [(True, 0, 1), (True, 2, 2), (False, 4, 4)]
    assert pick_server(0, servers) == 0  # busier, but it is the session's server
    assert pick_server(None, servers) == 1  # most free slots among the alive ones
    assert pick_server(2, servers) == 1  # its server is dead: it moves


# --- leases and affinity ----------------------------------------------------------------------


def test_sessions_keep_their_own_slot_between_turns(make: Any) -> None:
    rig = make(slots=2)
    for _ in range(3):
        rig.turn("a")
        rig.turn("b")
    a, b = rig.uses("a"), rig.uses("b")
    assert {u.slot for u in a} != {u.slot for u in b}
    assert len({u.slot for u in a}) == len({u.slot for u in b}) == 1
    assert [u.state for u in a[1:]] == [SlotState.KEPT] * 2
    assert [c[0] for c in rig.calls()] == []  # affinity: nothing saved, nothing
    assert rig.losses("a") == rig.losses("b") == []  # restored, no cache lost


def test_eviction_saves_the_idle_session_then_restores_it_when_it_comes_back(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a")
    rig.turn("b")  # a's state is saved before b gets the only slot
    assert [(c[0], c[2].split("-")[0]) for c in rig.calls()] == [("save", "a")]
    chats_before_save = len(rig.fakes[0].requests)
    assert chats_before_save == 2
    rig.turn("a")  # b saved, a restored
    assert [(c[0], c[2].split("-")[0]) for c in rig.calls()] == [
        ("save", "a"), ("save", "b"), ("restore", "a")]
    use = rig.last("a")
    assert restored(use) and use.reason == ""
    assert rig.losses("a") == []  # the restore took: nothing was processed twice
    usage = [r for r in rig.records("a") if type(r).__name__ == "Usage"][-1]
    assert usage.timings["cache_n"] >= use.restored - 2


def test_a_removed_session_is_forgotten_and_its_state_not_saved_again(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a")
    keeper = rig.inference.keeper
    assert keeper.entries() == 1
    keeper.forget("a")  # removed (LocalService.remove): its files are gone
    assert keeper.entries() == 0
    rig.turn("a")  # a new session of that name: the old one's state is not "kept" for it
    assert rig.last("a").state is not SlotState.KEPT
    rig.turn("b")
    keeper.forget("b")
    rig.turn("c")  # the only slot changes hands: nothing of b's is saved back
    assert ("save", "b") not in [(c[0], c[2].split("-")[0]) for c in rig.calls()]


def test_the_sessions_remembered_are_bounded_and_a_forgotten_one_is_restored(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keeper_module, "_ENTRIES", 4)
    rig = make(slots=1)
    for n in range(10):
        rig.turn(f"s{n}")
        assert rig.inference.keeper.entries() <= 4
    rig.turn("s0")  # long forgotten: its saved state comes back all the same
    assert restored(rig.last("s0")) and rig.losses("s0") == []


def test_more_sessions_than_slots_at_once_never_share_a_slot_nor_deadlock(make: Any) -> None:
    lock = threading.Lock()
    active: collections.Counter[int] = collections.Counter()
    peak: collections.Counter[int] = collections.Counter()

    def script(body: dict[str, Any]) -> Reply:
        slot, inner = int(body["id_slot"]), answer("ok.")

        def serve(conn: Conn) -> None:
            with lock:
                active[slot] += 1
                peak[slot] = max(peak[slot], active[slot])
            try:
                time.sleep(0.01)
                inner.serve(conn)
            finally:
                with lock:
                    active[slot] -= 1

        return Reply("tracked", serve)

    rig = make(slots=2, script=script, parallel=6)
    names = [f"s{i}" for i in range(6)]
    for name in names:
        rig.log(name)
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            for n in range(3):
                rig.turn(name, f"turn {n} of {name}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert not any(t.is_alive() for t in threads), "a turn never ended (deadlock)"
    assert errors == []
    assert set(peak) == {0, 1} and max(peak.values()) == 1  # one request per slot at a time
    for name in names:
        assert len(rig.uses(name)) == 3
        assert rig.losses(name) == []  # saved before eviction, restored after: nothing re-read


def test_a_request_waiting_for_a_slot_says_so_and_can_be_cancelled(make: Any) -> None:
    rig = make(slots=1)
    fake = rig.fakes[0]
    rig.turn("a")
    fake.slot_gate.clear()  # b's lease now waits on the save of a's state
    events: list[Any] = []
    blocked = in_background(rig, "b")
    wait_until(lambda: len(rig.calls()) == 1)  # b holds the slot, saving a's state
    cancel = CancelToken()
    outcome: list[BaseException] = []

    def third() -> None:
        try:
            rig.inference.complete(request(session="c"), events.append, cancel)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=third)
    t.start()
    wait_until(lambda: any(isinstance(e, Queued) for e in events))
    assert Queued(ahead=1, waiting_for="a free slot", sessions="b") in events  # on whom
    cancel.cancel()
    t.join(HANG_S)
    assert outcome and isinstance(outcome[0], InferError)
    assert outcome[0].kind is InferErrorKind.CANCELLED
    fake.slot_gate.set()
    blocked.join(HANG_S)
    assert not blocked.is_alive()


def test_a_request_waiting_for_a_slot_ends_at_its_deadline(make: Any) -> None:
    rig = make(slots=1)
    # the deadline is c's stimulus, and must also let a's turn end on a loaded machine
    rig.config = rig.config.replace("inference", timeout_s=3.0)
    rig.inference.stop()
    rig.inference = rig._start()
    rig.turn("a")
    rig.fakes[0].slot_gate.clear()  # the eviction save of a hangs, holding the only slot
    holder = in_background(rig, "b")
    wait_until(lambda: len(rig.calls()) == 1)
    with pytest.raises(InferError, match=r"timeout_s = 3 s \(all slots"):
        rig.inference.complete(request(session="c"), lambda _e: None, CancelToken())
    rig.fakes[0].slot_gate.set()
    holder.join(HANG_S)


# --- saving ---------------------------------------------------------------------------------


def test_save_after_turn_comes_after_the_answer_and_the_next_lease_waits_for_it(
    make: Any,
) -> None:
    rig = make(slots=1, after_turn=True)
    fake = rig.fakes[0]
    fake.slot_gate.clear()  # the save after the turn cannot finish yet
    outcome = rig.turn("a")  # ... and the answer is back all the same
    assert outcome.content == "ok."
    events: list[Any] = []
    second = threading.Thread(target=lambda: rig.turn("a", "again", events))
    second.start()
    wait_until(lambda: [c[0] for c in rig.calls()][:1] == ["save"])
    assert len(fake.requests) == 1  # its slot is saving: the next request waits for it
    fake.slot_gate.set()
    second.join(HANG_S)
    assert [c[0] for c in rig.calls()][:1] == ["save"]
    assert rig.last("a").state is SlotState.KEPT and rig.losses("a") == []
    assert not [e for e in events if isinstance(e, Queued)]  # never queued behind itself


def test_a_tool_turn_is_not_saved_between_its_requests_nor_queued_behind_itself(
    make: Any,
) -> None:
    """A small model writes its call as text: to the server (and the keeper) that request is
    an answer without tool calls. The save waits for the turn's end; no Queued in between."""
    rig = make(slots=1, after_turn=True)
    events: list[Any] = []
    first = rig.inference.complete(request(session="a"), events.append, CancelToken())
    assert not first.tool_calls  # e.g. '{"name": "read_file", ...}' as its content
    assert rig.calls() == []  # no save after it: the turn is not over
    rig.inference.complete(request(session="a"), events.append, CancelToken())
    assert not [e for e in events if isinstance(e, Queued)]
    assert rig.calls() == []
    rig.inference.turn_ended("a")
    wait_until(lambda: [c[0] for c in rig.calls()] == ["save"])


def test_a_new_command_restores_what_the_last_one_saved_when_it_ended(make: Any) -> None:
    rig = make(slots=2)  # save_after_turn off: only the end of the command saves
    rig.turn("a", "x" * 400)
    assert rig.calls() == []
    rig.restart()  # the keeper saves at the end; fresh servers hold nothing
    assert any(name.startswith("a-") and name.endswith(".bin") for name in rig.files())
    rig.turn("a", "and more")
    use = rig.last("a")
    assert restored(use)
    assert rig.losses("a") == []
    usage = [r for r in rig.records("a") if type(r).__name__ == "Usage"][-1]
    assert usage.timings["prompt_n"] < 20  # only the new message was processed


def test_disk_mb_keeps_the_most_recently_used_files(make: Any) -> None:
    rig = make(slots=1, disk_bytes=3000)
    for name in ("a", "b", "c"):
        rig.turn(name, name * 1500)  # each file is ~1.5 KB: two do not fit
    files = [f for f in rig.files() if f.endswith(".bin")]
    assert [f.split("-")[0] for f in files] == ["b"]  # a's went first; c is still in the slot
    rig.turn("a")  # a's file is gone: it re-processes and the log says why
    (loss,) = rig.losses("a")
    assert loss.cause == slotfiles.NO_STATE


# --- never wrong, only slower: every failure is a CacheLoss with its cause -----------------


def evicted_and_back(rig: Slots, between: Any = None) -> str:
    """a's turn, b's turn (a saved), ``between()``, a again: a's CacheLoss cause."""
    rig.turn("a", "a" * 200)
    rig.turn("b")
    if between is not None:
        between()
    rig.turn("a")
    losses = rig.losses("a")
    assert len(losses) == 1, losses
    assert losses[0].got < losses[0].expected
    return losses[0].cause


def a_file(rig: Slots) -> Path:
    (path,) = [p for p in rig.save_dir.glob("a-*.bin")]
    return path


def test_a_missing_file(make: Any) -> None:
    rig = make(slots=1)
    assert evicted_and_back(rig, lambda: a_file(rig).unlink()) == slotfiles.MISSING


def test_a_corrupt_file(make: Any) -> None:
    rig = make(slots=1)

    def corrupt() -> None:
        path = a_file(rig)
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF  # same size, one byte changed
        path.write_bytes(bytes(data))

    assert evicted_and_back(rig, corrupt) == slotfiles.CORRUPT
    assert ("restore", 0) not in [(c[0], c[1]) for c in rig.calls()]  # not sent


def test_a_stale_file_from_another_build(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a", "a" * 200)
    rig.restart(build_info="b2-other")  # a new server build: its files are not restored
    rig.turn("a")
    (loss,) = rig.losses("a")
    assert loss.cause == slotfiles.STALE
    assert not [c for c in rig.calls() if c[0] == "restore"]


def test_a_larger_context_restores_the_saved_state(make: Any) -> None:
    """The context size is no part of whether a state fits another server: llama-server
    restores it into any context that holds it (a larger one, or a smaller one it fits)."""
    rig = make(slots=1)
    rig.turn("a", "a" * 200)
    rig.restart(n_ctx=16384)  # embedded.ctx_size raised
    rig.turn("a", "and more")
    assert restored(rig.last("a")) and rig.losses("a") == []
    rig.restart(n_ctx=1024)  # smaller, and the state still fits
    rig.turn("a", "again")
    assert restored(rig.last("a")) and rig.losses("a") == []


def test_a_state_larger_than_the_context_is_not_sent(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a", "a" * 2000)  # about 500 tokens of the fake's
    rig.restart(n_ctx=64)
    done = rig.inference.complete(request(session="a"), lambda _e: None, CancelToken())
    assert done.slot is not None and done.slot.state is SlotState.NONE
    assert "does not fit the server's context (64 tokens a slot)" in done.slot.reason
    assert not [c for c in rig.calls() if c[0] == "restore"]  # not sent


def test_a_file_the_server_refuses(make: Any) -> None:
    rig = make(slots=1, reachable=False)  # loopd cannot check it: the server does

    def garble() -> None:
        a_file(rig).write_bytes(b"not a slot file")

    cause = evicted_and_back(rig, garble)
    assert cause.startswith("the server refused the saved state: Unable to restore slot")


def test_a_server_error_on_save(make: Any) -> None:
    rig = make(slots=1)
    rig.fakes[0].fail_slots("save", 500, "disk full")
    cause = evicted_and_back(rig)
    assert cause == f"the last save failed: disk full; {slotfiles.NO_STATE}"


def test_a_server_error_on_restore(make: Any) -> None:
    rig = make(slots=1)
    cause = evicted_and_back(rig, lambda: rig.fakes[0].fail_slots("restore", 500, "oops"))
    assert cause == "the restore failed: oops"


def test_a_restore_that_did_not_take(make: Any) -> None:
    rig = make(slots=1)
    cause = evicted_and_back(rig, lambda: rig.fakes[0].fail_slots("restore", 0))
    assert cause.startswith("the restore of ") and cause.endswith(" tokens did not take")


def test_a_server_without_a_save_path_works_without_persistence(make: Any) -> None:
    rig = make(slots=1, save=False)
    assert sum("has no --slot-save-path" in s for s in rig.said) == 1  # said once, at start
    cause = evicted_and_back(rig)
    assert cause == NO_SAVE_PATH
    assert [c[0] for c in rig.fakes[0].slot_calls] == ["loopd-probe"]  # nothing else tried
    assert rig.turn("a", "still fine").content == "ok."


def test_two_servers_one_killed_its_sessions_move_with_a_logged_loss(make: Any) -> None:
    rig = make(slots=1, servers=2, reachable=False)
    rig.turn("a", "a" * 200)
    rig.turn("b")
    home = rig.last("a").server
    assert rig.last("b").server != home  # spread over both servers
    dead = next(f for f in rig.fakes if f.url == home)
    dead.close()
    assert rig.turn("a", "still there?").content == "ok."
    assert rig.last("a").server != home
    (loss,) = rig.losses("a")
    assert loss.cause.startswith(SERVER_CHANGED.format(url=home))
    assert any("does not answer" in s for s in rig.said)
    rig.turn("b", "and b")  # b's own server is fine: b stays
    assert rig.losses("b") == []


def test_cancel_during_a_turn_leaves_the_slot_to_the_others(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a")
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(Cancelled):
        rig.turn("b", "never", cancel=cancel)
    assert rig.turn("c").content == "ok."  # the slot was given back


# --- nothing a save meets ends the saver -------------------------------------------


def test_bad_metadata_or_a_failing_save_never_ends_the_saver(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metadata file with "used": "yesterday" beside the session's made the bound after a
    save raise TypeError in the saver thread, which died: the next save was never done, and
    the turn after it waited for its slot for ever (this test's hang guard). And whatever
    else a save raises is logged, not the saver's end."""
    rig = make(slots=1, after_turn=True)
    bad = {"session": "x", "file": "x-1.bin", "tokens": 1, "fingerprint": "f", "server": "u",
           "saved": 1.0, "used": "yesterday", "bytes": 10, "crc32": 1}
    (rig.save_dir / "x-1.json").write_text(json.dumps(bad))
    for n in range(3):  # each turn's lease waits for the previous turn's save
        assert rig.turn("a", f"turn {n}").content == "ok."
    wait_until(lambda: [c[0] for c in rig.calls()].count("save") == 3, what="three saves")
    real = slotfiles.SlotStore.bound

    def broken(self: slotfiles.SlotStore, limit: int) -> list[str]:
        monkeypatch.setattr(slotfiles.SlotStore, "bound", real)  # once
        raise RuntimeError("a bug in the bound")

    monkeypatch.setattr(slotfiles.SlotStore, "bound", broken)
    for n in range(3, 5):
        assert rig.turn("a", f"turn {n}").content == "ok."
    wait_until(lambda: [c[0] for c in rig.calls()].count("save") == 5, what="five saves")
