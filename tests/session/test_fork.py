"""Fork and rewind: what the logs hold, what is refused, and the KV state a fork starts from.

The logs are real files; the KV state tests run real turns against the fake llama-server,
which keeps a per-slot prompt cache and saves and restores real files
(tests/inference/slots/slots_rig.py), so ``cache_n`` says what a restore reused.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.base.config import Config, parse
from actors.base.errors import SessionError, SessionLocked, UsageError
from actors.inference.slots.files import slot_key
from actors.inference.slots.keeper import FORKED
from actors.log.file import SessionLog, read_records
from actors.log.records import (
    Assistant,
    Baseline,
    Compaction,
    CompactionBy,
    Forked,
    Record,
    Rewind,
    SlotState,
    Usage,
    User,
)
from actors.session.actor import open_session
from actors.session.fork import fork_session, rewind_target
from actors.session.messages import messages, view
from tests.inference.slots.slots_rig import Slots
from tests.strategies import conversations, epoch_records
from tests.support.watch import HANG_S

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
BASE = Baseline(system="s", tools=(), model="m", created=T0, time=T0)


def config_at(tmp: Path) -> Config:
    return parse({"log": {"dir": str(tmp / "sessions")}, "slots": {"save_dir": str(tmp / "save")},
                  "embedded": {"data_dir": str(tmp / "embedded")}})


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return config_at(tmp_path)


def turn(n: int) -> list[Record]:
    return [User(content=f"q{n}", time=T0), Assistant(content=f"a{n}", reasoning=None, time=T0)]


def write(config: Config, name: str, records: list[Record]) -> Path:
    path = config.log_dir / name / "log.bin"
    log, _ = SessionLog.open(path, baseline=BASE, name=name)
    with log:
        if records:
            log.append(*records)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the logs -----------------------------------------------------------------------------


def test_a_fork_copies_the_sources_bytes_and_adds_its_note(config: Config) -> None:
    src = write(config, "src", [*turn(1), *turn(2), *turn(3)])
    before = digest(src)
    report = fork_session(config, "src", "new")
    new = config.log_dir / "new" / "log.bin"
    assert digest(src) == before  # the source is not touched
    assert new.read_bytes().startswith(src.read_bytes())
    records = read_records(new)
    assert records[:-1] == read_records(src)
    assert isinstance(records[-1], Forked) and (records[-1].from_, records[-1].at) == ("src", 3)
    assert report.records == 7 and report.forked == records[-1] and report.state is None
    assert messages(BASE, records) == messages(BASE, read_records(src))


def test_a_fork_at_a_turn_copies_the_records_up_to_its_end(config: Config) -> None:
    src = write(config, "src", [*turn(1), *turn(2), *turn(3)])
    fork_session(config, "src", "at1", at=1)
    fork_session(config, "src", "at0", at=0)
    records = read_records(config.log_dir / "at1" / "log.bin")
    assert records[:-1] == read_records(src)[:3] and records[-1].at == 1  # type: ignore[union-attr]
    assert read_records(config.log_dir / "at0" / "log.bin")[:-1] == (read_records(src)[0],)
    # the forks go on like any session, and their first prompt starts like the source's
    with SessionLog.open(config.log_dir / "at1" / "log.bin")[0] as log:
        log.append(User(content="other"))
        assert messages(BASE, log.records)[:3] == messages(BASE, read_records(src))[:3]


def test_a_fork_keeps_the_compactions_and_their_indexes(config: Config) -> None:
    compaction = Compaction(summary="one", kept=3, tokens_before=9, by=CompactionBy.AUTO)
    write(config, "src", [*turn(1), *turn(2), compaction, *turn(3)])
    fork_session(config, "src", "new")
    src, new = (read_records(config.log_dir / n / "log.bin") for n in ("src", "new"))
    assert compaction in new
    assert messages(BASE, new) == messages(BASE, src)
    assert view(new).summary == "one"


@pytest.mark.parametrize(("at", "said"), [
    (4, "has turns 1 to 3"), (-1, "has turns 1 to 3"),
])
def test_a_fork_at_a_turn_it_does_not_have_is_refused(config: Config, at: int, said: str) -> None:
    write(config, "src", [*turn(1), *turn(2), *turn(3)])
    with pytest.raises(UsageError, match=said):
        fork_session(config, "src", "new", at=at)
    assert not (config.log_dir / "new").exists()


def test_a_fork_at_a_rewound_turn_is_refused_and_a_later_one_works(config: Config) -> None:
    # turns 1, 2, 3; back to 1; turn 4: turn 3 was rewound before turn 4 was asked
    write(config, "src", [*turn(1), *turn(2), *turn(3), Rewind(to_turn=1), *turn(4)])
    with pytest.raises(UsageError, match=r"turn 3 of session src was rewound.*: 1 \(or 0\)"):
        fork_session(config, "src", "new", at=3)
    fork_session(config, "src", "new", at=2)  # turn 2, rewound later, is back in the fork
    records = read_records(config.log_dir / "new" / "log.bin")
    assert view(records).turns == (1, 2)


def test_bad_forks_are_refused_and_change_nothing(config: Config) -> None:
    src = write(config, "src", turn(1))
    write(config, "taken", [])
    before = digest(src), digest(config.log_dir / "taken" / "log.bin")
    with pytest.raises(UsageError, match="session taken exists"):
        fork_session(config, "src", "taken")
    with pytest.raises(UsageError, match="a fork needs a new name"):
        fork_session(config, "src", "src")
    with pytest.raises(UsageError, match="is not allowed"):
        fork_session(config, "src", "../x")
    with pytest.raises(UsageError, match="is not allowed"):
        fork_session(config, "-x", "y")
    with pytest.raises(SessionError, match="session nope does not exist"):
        fork_session(config, "nope", "new")
    assert (digest(src), digest(config.log_dir / "taken" / "log.bin")) == before
    assert sorted(p.name for p in config.log_dir.iterdir()) == [".forks.lock", "src", "taken"]


def test_a_fork_of_a_session_in_use_copies_only_its_whole_records(config: Config) -> None:
    path = write(config, "src", turn(1))
    with SessionLog.open(path)[0] as log:  # open (and locked) elsewhere, mid-append
        log.append(User(content="q2"))
        whole = path.read_bytes()
        with open(path, "ab") as f:
            f.write(b"\x40\x00\x00\x00\x12\x34")  # the start of a record being written
        report = fork_session(config, "src", "new")
        assert report.records == 4 and report.forked.at == 2
        assert (config.log_dir / "new" / "log.bin").read_bytes().startswith(whole)
        assert read_records(config.log_dir / "new" / "log.bin")[:-1] == log.records


def test_a_fork_keeps_the_sources_workspace(config: Config, tmp_path: Path) -> None:
    write(config, "src", turn(1))
    (config.log_dir / "src" / "workspace").write_text(f"{tmp_path}\n")
    fork_session(config, "src", "new")
    assert (config.log_dir / "new" / "workspace").read_text() == f"{tmp_path}\n"


def test_what_a_killed_fork_left_is_swept_by_the_next(config: Config) -> None:
    write(config, "src", turn(1))
    left = config.log_dir / ".fork-new-0badc0de"
    left.mkdir()
    (left / "log.bin").write_bytes(b"loopdlog")
    fork_session(config, "src", "new")
    assert not left.exists()
    assert [p.name for p in config.log_dir.iterdir() if p.name.startswith(".fork-")] == []


# --- rewind -------------------------------------------------------------------------------


def test_rewind_takes_back_the_last_turns_shown() -> None:
    records: list[Record] = [BASE, *turn(1), *turn(2), *turn(3)]
    one = rewind_target("s", records, 1)
    assert (one.rewind.to_turn, one.taken, one.left) == (2, (3,), (1, 2))
    after = [*records, one.rewind, *turn(4)]
    assert view(after).turns == (1, 2, 4)
    two = rewind_target("s", after, 2)  # turn 4, then turn 2 (turn 3 is gone already)
    assert (two.rewind.to_turn, two.taken, two.left) == (1, (2, 4), (1,))
    assert view([*after, two.rewind]).turns == (1,)
    everything = rewind_target("s", after, 3)
    assert everything.rewind.to_turn == 0 and view([*after, everything.rewind]).turns == ()


@pytest.mark.parametrize(("turns", "said"), [
    (0, "1 turn or more, not 0"), (4, "has only 3 turns to take back, not 4"),
])
def test_a_rewind_of_turns_it_has_not_is_refused(turns: int, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        rewind_target("s", [BASE, *turn(1), *turn(2), *turn(3)], turns)
    with pytest.raises(UsageError, match="has no turns to take back"):
        rewind_target("s", [BASE], 1)


def test_the_session_actor_rewinds_and_the_log_only_grows(config: Config) -> None:
    path = write(config, "s", [*turn(1), *turn(2)])
    before = path.read_bytes()
    proxy = open_session(config, "s")
    try:
        report = proxy.rewind(1).get(timeout=HANG_S)
        assert report.taken == (2,)
        with pytest.raises(UsageError, match="has only 1 turn to take back, not 2"):
            proxy.rewind(2).get(timeout=HANG_S)
        with pytest.raises(SessionLocked):
            open_session(config, "s")  # one writer: a rewind goes through the session's owner
    finally:
        proxy.actor_ref.stop(timeout=HANG_S)
    after = path.read_bytes()
    assert after.startswith(before) and len(after) > len(before)
    assert read_records(path)[-1] == report.rewind


# --- the KV state a fork starts from ----------------------------------------------------------


@pytest.fixture
def slots(tmp_path: Path) -> Iterator[Slots]:
    rig = Slots(tmp_path)
    try:
        yield rig
    finally:
        rig.close()


def last_request(rig: Slots) -> dict[str, object]:
    return rig.fakes[0].requests[-1]


def grown(rig: Slots, name: str, turns: int) -> None:
    for n in range(turns):
        rig.turn(name, f"Question {n} about something long enough to be worth keeping? " * 4)


def test_a_forks_first_request_is_served_from_its_sources_state(
    slots: Slots, tmp_path: Path
) -> None:
    grown(slots, "src", 3)
    config = config_at(tmp_path)
    report = fork_session(config, "src", "new", save=slots.inference.save_state)
    assert report.state is not None and report.state.origin == "src"
    key, new_key = (slot_key(config.log_dir / n / "log.bin") for n in ("src", "new"))
    assert os.path.samefile(slots.save_dir / f"{key}.bin", slots.save_dir / f"{new_key}.bin")
    meta = json.loads((slots.save_dir / f"{new_key}.json").read_text())
    assert (meta["session"], meta["origin"], meta["file"]) == ("new", "src", f"{new_key}.bin")

    slots.restart()  # a new command on a fresh server: the state can only come from the file
    outcome = slots.turn("new", "And now something else?")
    use = slots.last("new")
    assert use.state is SlotState.RESTORED and FORKED.format(origin="src") in use.reason
    assert outcome.restored == use
    assert slots.losses("new") == []
    usage = [r for r in slots.records("new") if isinstance(r, Usage)][-1]
    source = [r for r in slots.records("src") if isinstance(r, Usage)][-1]
    # only the new message is processed: the fork's prompt extends what the source sent
    assert usage.timings["cache_n"] >= source.timings["cache_n"] + source.timings["prompt_n"]
    assert usage.timings["prompt_n"] <= len("<|user|>And now something else?<|end|>") // 4 + 4


def test_a_fork_at_an_earlier_turn_keeps_the_common_prefix(
    slots: Slots, tmp_path: Path
) -> None:
    grown(slots, "src", 3)
    fork_session(config_at(tmp_path), "src", "early", at=1, save=slots.inference.save_state)
    slots.restart()
    slots.turn("early", "Something else?")
    assert slots.last("early").state is SlotState.RESTORED and slots.losses("early") == []
    first = next(r for r in slots.records("src") if isinstance(r, Usage))
    usage = [r for r in slots.records("early") if isinstance(r, Usage)][-1]
    assert usage.timings["cache_n"] >= first.timings["cache_n"] + first.timings["prompt_n"]
    # the source goes on where it was, from its own file: the fork's save did not touch it
    slots.restart()
    slots.turn("src", "And the source?")
    assert slots.last("src").state is SlotState.RESTORED and slots.losses("src") == []


def test_a_fork_copies_the_state_of_a_session_whose_last_turn_was_not_saved(
    slots: Slots, tmp_path: Path
) -> None:
    grown(slots, "src", 2)
    assert slots.calls() == []  # nothing saved yet: the state is only in the slot
    report = fork_session(config_at(tmp_path), "src", "new", save=slots.inference.save_state)
    assert [c[0] for c in slots.calls()] == ["save"]
    assert report.state is not None and report.state.tokens > 0


@pytest.mark.parametrize("fault", ["missing", "stale", "refused", "corrupt"])
def test_a_fork_whose_source_state_cannot_serve_it_reprocesses_and_says_why(
    slots: Slots, tmp_path: Path, fault: str
) -> None:
    grown(slots, "src", 2)
    config = config_at(tmp_path)
    slots.inference.save_state("src")
    key = slot_key(config.log_dir / "src" / "log.bin")
    if fault == "missing":
        (slots.save_dir / f"{key}.bin").unlink()
    elif fault == "stale":
        meta_path = slots.save_dir / f"{key}.json"
        meta = json.loads(meta_path.read_text())
        meta_path.write_text(json.dumps({**meta, "fingerprint": "model=other"}))
    elif fault == "corrupt":
        with open(slots.save_dir / f"{key}.bin", "ab") as f:
            f.write(b"more")
    fork_session(config, "src", "new")
    slots.restart()  # fresh slots: nothing but the file could serve the fork
    if fault == "refused":
        slots.fakes[0].fail_slots("restore", 400, "Unable to restore slot")
    outcome = slots.turn("new", "Another question?")
    assert outcome.content == "ok."
    want = {"missing": "the saved state's file is gone", "stale": "from another model",
            "corrupt": "is corrupt", "refused": "the server refused the saved state"}[fault]
    (loss,) = slots.losses("new")
    assert want in loss.cause and FORKED.format(origin="src") in loss.cause
    assert loss.got < loss.expected
    # the answer is right all the same: the whole conversation was sent and processed
    records = slots.records("new")
    answered = max(i for i, r in enumerate(records) if isinstance(r, Assistant))
    assert last_request(slots)["messages"] == messages(records[0], records[:answered])
    usage = records[answered + 1]
    assert isinstance(usage, Usage) and usage.timings["cache_n"] < loss.expected


@pytest.mark.parametrize("restart", [False, True], ids=["in-the-slot", "from-the-file"])
def test_a_rewind_is_warm_too(slots: Slots, restart: bool) -> None:
    grown(slots, "s", 3)
    log = slots.log("s")
    log.append(rewind_target("s", log.records, 1).rewind)
    if restart:
        slots.restart()
    slots.turn("s", "Instead, this?")
    assert slots.losses("s") == []
    usages = [r for r in slots.records("s") if isinstance(r, Usage)]
    kept = usages[1]  # the last request of turn 2, the turn the rewind goes back to
    assert usages[-1].timings["cache_n"] >= kept.timings["cache_n"] + kept.timings["prompt_n"]
    assert usages[-1].timings["prompt_n"] <= len("<|user|>Instead, this?<|end|>") // 4 + 4


# --- the extension property through forks and rewinds ---------------------------------------


def fork_points(records: tuple[Record, ...]) -> list[int | None]:
    """The turns a fork of ``records`` may be taken at: each turn the log showed when the
    next one was asked (turn N is the N-th User record), its start (0) and its end (None)."""
    starts = [i for i, r in enumerate(records) if isinstance(r, User)]
    ends = [*starts[1:], len(records)]
    return [None, 0, *(n for n in range(1, len(starts) + 1)
                       if n in view(records[: ends[n - 1]]).turns)]


@settings(max_examples=100, deadline=None)
@given(conversations(compacting=True, rewinding=True), st.data())
def test_forks_and_rewinds_of_generated_conversations_send_what_was_sent_before(
    conv: tuple[Baseline, list[Record]], data: st.DataObject
) -> None:
    """A generated conversation (Compaction, Rewind and Forked records among the rest) in a
    real log, forked at a drawn turn it may be forked at: SRC's bytes are unchanged; NEW's
    rendering is what SRC rendered when it asked the turn after the fork (so its first
    request extends a request SRC sent); NEW goes on, each record extending its rendering;
    a rewind of NEW only grows its log and renders what NEW rendered when the turn after
    the one it goes back to was asked. The seed is in pytest's header."""
    baseline, recs = conv
    with tempfile.TemporaryDirectory() as tmp:
        config = config_at(Path(tmp))
        path = config.log_dir / "src" / "log.bin"
        with SessionLog.open(path, baseline=baseline, name="src")[0] as log:
            if recs:
                log.append(*recs)
        before, records = path.read_bytes(), read_records(path)
        at = data.draw(st.sampled_from(fork_points(records)), label="at")
        fork_session(config, "src", "new", at)
        assert path.read_bytes() == before
        new_path = config.log_dir / "new" / "log.bin"
        new = read_records(new_path)
        starts = [i for i, r in enumerate(records) if isinstance(r, User)]
        cut = len(records) if at is None or at == len(starts) else starts[at]
        assert new[:-1] == records[:cut] and isinstance(new[-1], Forked)
        first = messages(baseline, new)
        assert first == messages(baseline, records[:cut])
        ask = User(content=data.draw(st.text(max_size=20), label="ask"))
        sent = messages(baseline, [*records[:cut], ask])  # what SRC sent asking turn at+1
        assert messages(baseline, [*new, ask]) == sent

        more = data.draw(st.lists(epoch_records | st.builds(User, content=st.text(max_size=9)),
                                  max_size=8), label="more")
        with SessionLog.open(new_path)[0] as log:
            previous = first
            for record in more:
                log.append(record)
                current = messages(baseline, log.records)
                assert current[: len(previous)] == previous, f"{record} rewrote the rendering"
                previous = current
            shown = view(log.records).turns
            if not shown:
                return
            grown = new_path.read_bytes()
            turns = data.draw(st.integers(1, len(shown)), label="turns")
            report = rewind_target("new", log.records, turns)
            log.append(report.rewind)
            after = new_path.read_bytes()
            assert after.startswith(grown) and len(after) > len(grown)
            asked = [i for i, r in enumerate(log.records) if isinstance(r, User)]
            back = messages(baseline, log.records[: asked[report.rewind.to_turn]])
            assert messages(baseline, log.records) == back
            assert view(log.records).turns == report.left
