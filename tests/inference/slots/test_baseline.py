"""A new session starts warm: the baseline's KV state, saved once, restored into its slot.

Against fake llama-servers that save and restore real files: the first new session of a
baseline processes it first and saves it; every later new session (another slot, a new
command) restores it, or keeps it where its slot already starts with it, and its first
request processes only its message. Every way the saved baseline can fail (its file gone,
stale: another model or server build, refused by the server) is a CacheLoss with its cause
on the session's first request, and the answer is the same. Baselines share
``slots.disk_mb`` with the sessions' files; those no config uses any more go.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.inference.slots import baseline as base
from actors.inference.slots import files as slotfiles
from actors.inference.slots.keeper import BASE_HELD, BASE_LOST, BASE_RESTORED, REFUSED
from actors.inference.types import BaselineUse
from actors.log.records import Assistant, SlotState, SlotUse, Usage
from actors.session.limits import BASELINE_SLACK, cache_outcome
from tests.inference.slots.slots_rig import Slots

MESSAGE = "Hi?"
MESSAGE_TOKENS = len(f"<|user|>{MESSAGE}<|end|><|assistant|>") // 4 + 1  # the fake's tokens


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[Slots] = []

    def build(**kwargs: Any) -> Slots:
        made.append(Slots(tmp_path / str(len(made)), warm=True, **kwargs))
        return made[-1]

    yield build
    for rig in made:
        rig.close()


def first_usage(rig: Slots, name: str) -> Usage:
    return next(r for r in rig.records(name) if isinstance(r, Usage))


def answered(rig: Slots, name: str) -> bool:
    return any(isinstance(r, Assistant) and r.content == "ok." for r in rig.records(name))


def baselines(rig: Slots) -> list[str]:
    return sorted(f for f in rig.files() if f.startswith("_baseline-") and f.endswith(".bin"))


def saves_of_baselines(rig: Slots, server: int = 0) -> int:
    return sum(1 for c in rig.calls(server) if c[0] == "save" and c[2].startswith("_baseline"))


def warm(rig: Slots, name: str) -> Usage:
    """``name``'s first request was served warm: only its message processed."""
    usage = first_usage(rig, name)
    assert usage.timings["prompt_n"] <= MESSAGE_TOKENS, usage.timings
    assert rig.losses(name) == []
    assert answered(rig, name)
    return usage


# --- the key and the pure decisions -------------------------------------------------------


def test_the_key_hashes_the_rendered_prefix_and_the_prefix_is_where_renderings_part() -> None:
    key = base.baseline_key("<sys>terse</sys><user>")
    assert key == base.baseline_key("<sys>terse</sys><user>")
    assert key != base.baseline_key("<sys>verbose</sys><user>")  # another system prompt
    assert key != base.baseline_key("<sys>terse</sys><user>", slots=2)  # another slot count
    assert base.is_baseline(key) and not base.is_baseline(slotfiles.slot_key(Path("/l/a/log")))
    assert base.common_prefix("<s>x</s><u>a", "<s>x</s><u>b") == "<s>x</s><u>"


def test_unused_baselines_are_all_but_the_most_recently_used() -> None:
    def meta(used: float) -> slotfiles.SlotFile:
        return slotfiles.SlotFile(session=base.BASELINE_SESSION, file="f", tokens=1,
                                  fingerprint="model=m;n_ctx=8;build=b1", server="u", saved=0,
                                  used=used, bytes=1)

    files = [(f"_baseline-{i}", meta(float(i))) for i in range(6)]
    files += [("a-123", meta(0.0))]  # a session's file is never a baseline
    assert base.unused_baselines(files, keep=4) == ["_baseline-1", "_baseline-0"]


def test_a_first_request_expects_the_baseline_its_slot_held() -> None:
    use = SlotUse("u", 0, SlotState.RESTORED, 100, 1.0, BASE_RESTORED)
    assert cache_outcome(None, {"cache_n": 100 - BASELINE_SLACK}, use, BaselineUse(100)) is None
    loss = cache_outcome(None, {"cache_n": 3}, use, BaselineUse(100))
    assert loss is not None and (loss.expected, loss.got) == (100, 3)
    assert "did not keep" in loss.cause
    lost = cache_outcome(None, {"cache_n": 100}, use, BaselineUse(100, "gone"))
    assert lost is not None and (lost.expected, lost.got, lost.cause) == (100, 0, "gone")
    assert cache_outcome(None, {"cache_n": 0}, use, None) is None  # no baseline: nothing


# --- warm starts ------------------------------------------------------------------------------


def test_the_first_new_session_saves_the_baseline_and_the_next_ones_restore_it(
    make: Any,
) -> None:
    rig = make(slots=2)
    rig.turn("a")
    use = first_usage(rig, "a").slot
    assert use is not None and "processed first" in use.reason and "saved" in use.reason
    assert rig.losses("a") == [] and answered(rig, "a")
    assert len(baselines(rig)) == 1 and len(rig.fakes[0].prefills) == 1
    rig.turn("b")  # a holds slot 0: b gets slot 1, empty: the baseline is restored into it
    use = warm(rig, "b").slot
    assert use is not None and use.slot == 1 and use.state is SlotState.RESTORED
    assert use.reason == BASE_RESTORED and use.restored > 0
    assert len(rig.fakes[0].prefills) == 1  # processed once
    rig.restart()  # a new command on a fresh server (the daemon restarted)
    rig.turn("c")
    use = warm(rig, "c").slot
    assert use is not None and use.state is SlotState.RESTORED and use.reason == BASE_RESTORED
    assert rig.fakes[0].prefills == [] and saves_of_baselines(rig) == 0


def test_a_slot_that_starts_with_the_baseline_is_used_as_it_is(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a")
    rig.turn("b")  # a's state is saved, b takes its slot: it starts with the same baseline
    use = warm(rig, "b").slot
    assert use is not None and use.reason == BASE_HELD and use.state is SlotState.NONE
    assert not [c for c in rig.calls() if c[0] == "restore"]


def test_a_session_whose_own_state_is_lost_gets_the_baseline_and_says_why(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a", "a" * 200)
    rig.restart()
    for path in rig.save_dir.glob("a-*.bin"):
        path.unlink()
    rig.turn("a")
    (loss,) = rig.losses("a")
    assert loss.cause == f"{slotfiles.MISSING}; {BASE_RESTORED}"
    assert loss.got > 0  # the baseline's tokens were reused
    use = rig.last("a")
    assert use.state is SlotState.RESTORED


def test_off_a_new_session_processes_its_baseline(make: Any, tmp_path: Path) -> None:
    rig = Slots(tmp_path / "off", slots=2)
    try:
        rig.turn("a")
        rig.turn("b")
        assert first_usage(rig, "b").timings["prompt_n"] > MESSAGE_TOKENS * 3
        assert baselines(rig) == [] and rig.fakes[0].prefills == []
    finally:
        rig.close()


# --- faults: a CacheLoss with its cause, and the right answer ---------------------------------


def cold_with(rig: Slots, name: str) -> str:
    """``name``'s first request could not restore the baseline: its CacheLoss's cause."""
    rig.turn(name)
    assert answered(rig, name)
    (loss,) = rig.losses(name)
    assert loss.got == 0 and loss.expected > 0
    return loss.cause


def test_a_baseline_file_that_is_gone(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a")
    rig.restart()
    for name in baselines(rig):
        (rig.save_dir / name).unlink()
    assert cold_with(rig, "b") == BASE_LOST.format(why=slotfiles.MISSING)
    assert len(baselines(rig)) == 1  # processed and saved again
    rig.restart()
    rig.turn("c")
    warm(rig, "c")


@pytest.mark.parametrize("props", [{"build_info": "b2-other"},
                                   {"model_path": "/models/another.gguf"}])
def test_a_stale_baseline_from_another_server_build_or_model(
    make: Any, props: dict[str, Any],
) -> None:
    rig = make(slots=1)
    rig.turn("a")
    (before,) = baselines(rig)
    rig.restart(**props)
    assert cold_with(rig, "b") == BASE_LOST.format(why=slotfiles.STALE)
    assert not [c for c in rig.calls() if c[0] == "restore"]  # never sent
    assert baselines(rig) == [before]  # the same rendered prefix: replaced in place
    rig.restart()
    rig.turn("c")
    warm(rig, "c")


def test_another_config_gets_its_own_baseline(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a")
    rig.restart()
    rig.log("b", system="You are verbose.")  # another system prompt: another key
    rig.turn("b")
    use = first_usage(rig, "b").slot
    assert use is not None and "processed first" in use.reason
    assert rig.losses("b") == [] and answered(rig, "b")
    assert len(baselines(rig)) == 2


def test_another_slot_count_keeps_a_baseline_of_its_own(make: Any) -> None:
    """A state restores only on a server of the same slot count (one KV stream a slot):
    configs of one and of two slots sharing a directory each keep theirs, no loss."""
    rig = make(slots=1)
    rig.turn("a")
    rig.restart(total_slots=2)
    rig.turn("b")
    use = first_usage(rig, "b").slot
    assert use is not None and "processed first" in use.reason
    assert rig.losses("b") == [] and len(baselines(rig)) == 2
    rig.restart(total_slots=1)
    rig.turn("c")
    warm(rig, "c")


def test_a_baseline_the_server_refuses(make: Any) -> None:
    rig = make(slots=1)
    rig.turn("a")
    rig.restart()
    rig.fakes[0].fail_slots("restore", 400, "invalid slot save file")
    cause = cold_with(rig, "b")
    assert cause == BASE_LOST.format(why=REFUSED.format(message="invalid slot save file"))


def test_a_server_that_cannot_render_or_process_the_baseline_runs_cold(make: Any) -> None:
    rig = make(slots=2)
    rig.fakes[0].fail_slots("apply-template", 500)
    rig.turn("a")
    assert answered(rig, "a") and rig.losses("a") == []
    assert "could not be rendered" in first_usage(rig, "a").slot.reason  # type: ignore[union-attr]
    rig.fakes[0].fail_slots("completion", 500)
    rig.turn("b")
    assert answered(rig, "b") and rig.losses("b") == []
    assert "could not be processed" in first_usage(rig, "b").slot.reason  # type: ignore[union-attr]


def test_a_server_without_apply_template_says_so_once_and_is_not_asked_again(
    make: Any,
) -> None:
    rig = make(slots=2)
    rig.fakes[0].fail_slots("apply-template", 404, "File Not Found")
    rig.turn("a")
    rig.turn("b")
    assert answered(rig, "b") and rig.losses("b") == []
    assert rig.fakes[0].renders == 1
    assert [s for s in rig.said if "could not be rendered" in s] != []


# --- space: the baselines share slots.disk_mb with the sessions' files -----------------------


def test_disk_mb_bounds_baselines_and_sessions_together(make: Any) -> None:
    rig = make(slots=1, after_turn=True)
    rig.turn("a", "a" * 1500)  # the baseline, then a's state, saved
    rig.stop_command()  # its saves done

    def size(name: str) -> int:
        return (rig.save_dir / name).stat().st_size

    (kept,) = baselines(rig)
    (a_file,) = [f for f in rig.files() if f.startswith("a-") and f.endswith(".bin")]
    rig.settings = dataclasses.replace(rig.settings, disk_bytes=size(kept) + size(a_file))
    rig.inference = rig._start()  # a new command: both fit, just
    rig.turn("b")  # restores the baseline (used now), then saves b: one must go
    warm(rig, "b")
    rig.restart()  # b's save done
    files = [f for f in rig.files() if f.endswith(".bin")]
    assert not [f for f in files if f.startswith("a-")]  # a's state went first
    assert baselines(rig) == [kept] and [f for f in files if f.startswith("b-")]


def test_saving_a_baseline_keeps_only_the_most_recently_used_ones(
    make: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(base, "KEPT", 2)
    rig = make(slots=1)
    for name in ("a", "b", "c"):  # three configs, one after the other
        rig.log(name, system=f"You are {name}.")
        rig.turn(name)
    kept = baselines(rig)
    assert len(kept) == 2
    rig.restart()
    rig.log("d", system="You are a.")  # a's config, no longer used recently: its went
    rig.turn("d")
    assert "processed first" in first_usage(rig, "d").slot.reason  # type: ignore[union-attr]
    rig.log("e", system="You are c.")  # c's is still there
    rig.turn("e")
    warm(rig, "e")
