"""The session service's contract: every operation and its errors, the same from both
implementations (conftest.py runs each test in this process and through a daemon).

A new operation is added here once, and runs on both."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from actors.base.cancel import CancelToken
from actors.base.errors import (
    Cancelled,
    LimitError,
    SessionError,
    SessionInUse,
    UsageError,
)
from actors.base.events import NO_APPROVER, Event
from actors.log.records import Baseline, Compaction, Rewind, ToolResult, User
from actors.service.types import (
    CompactReport,
    Forked,
    McpServer,
    Opened,
    Rewound,
    SessionState,
)
from tests.support.service_places import FULL, HANG, Place
from tests.support.watch import HANG_S, wait_until


def _turn(place: Place, name: str, text: str, events: list[Event] | None = None,
          cancel: CancelToken | None = None) -> Any:
    sink = events.append if events is not None else (lambda _e: None)
    return place.service.turn(name, text, sink, NO_APPROVER, cancel)


# --- open, close ------------------------------------------------------------------------------


def test_open_makes_a_session_then_opens_it(place: Place) -> None:
    name = place.name("open")
    made = place.service.open(name)
    assert made == Opened(name, True, 1, 0, 8192)  # its Baseline; the fake's n_ctx
    assert place.service.open(name) == Opened(name, False, 1, 0, 8192)
    assert name in place.service.list()


def test_open_without_create_of_a_missing_session_is_refused(place: Place) -> None:
    with pytest.raises(SessionError, match="does not exist"):
        place.service.open(place.name("missing"), create=False)


@pytest.mark.parametrize("bad", ["../up", ".hidden", "a b", ""])
def test_a_bad_name_is_refused_as_bad_usage(place: Place, bad: str) -> None:
    with pytest.raises(UsageError, match="is not allowed"):
        place.service.open(bad)


def test_a_session_is_attached_to_one_client_until_closed(place: Place) -> None:
    name = place.name("attached")
    place.service.open(name)
    other = place.other()
    with pytest.raises(SessionInUse, match=f"session {name} is in use"):
        other.open(name)
    with pytest.raises(SessionInUse):
        other.turn(name, "t1", lambda _e: None, NO_APPROVER)
    place.service.close(name)
    assert other.open(name).created is False
    other.close(name)


PROBE = Path(__file__).parents[1] / "acp" / "mcp_probe.py"  # a real MCP server (the mcp SDK's)


def _results(place: Place, name: str) -> list[str]:
    return [r.content for r in place.service.records(name) if isinstance(r, ToolResult)]


def test_a_sessions_own_mcp_servers_are_its_tools_alone(place: Place) -> None:
    """``open``'s servers run as the session's own tool hosts (in the daemon, through it):
    its turns call their tools, another session's do not; one that cannot start is a note;
    opening again with the same servers keeps them, with none stops them."""
    name, plain = place.name("mcp"), place.name("plain")
    probe = McpServer("probe", (sys.executable, str(PROBE)), env=("LOOPD_PROBE=given",))
    opened = place.service.open(name, True, (probe, McpServer("gone", ("/no/such/server",))))
    assert (opened.servers, opened.tools) == (("probe",), ("echo", "env_var", "note"))
    (note,) = opened.notes
    assert note.startswith("MCP server gone: its command '/no/such/server' was not found")
    assert _turn(place, name, 't1 :: env_var {"name": "LOOPD_PROBE"}').content == "done t1."
    assert _results(place, name) == ["given"]
    _turn(place, plain, 'u1 :: echo {"text": "x"}')
    assert _results(place, plain)[0].startswith("There is no tool named 'echo'")
    assert place.service.open(name, False, (probe,)).tools == ("echo", "env_var", "note")
    assert place.service.open(name, False) == Opened(name, False, opened.records, 0, 8192)
    _turn(place, name, 't2 :: echo {"text": "x"}')  # stopped: its tools are gone
    assert _results(place, name)[1].startswith("There is no tool named 'echo'")
    place.service.close(name)


# --- turn, records -----------------------------------------------------------------------------


def test_a_turn_answers_and_its_records_are_read_back(place: Place) -> None:
    name = place.name("turn")
    events: list[Event] = []
    outcome = _turn(place, name, "t1 :: read_file {\"path\": \"notes.txt\"}", events)
    assert outcome.content == "done t1." and outcome.tool_calls == 1
    assert events, "the turn's events reach the sink"
    records = place.service.records(name)
    assert isinstance(records[0], Baseline)
    assert [r.content for r in records if isinstance(r, User)] == [
        "t1 :: read_file {\"path\": \"notes.txt\"}"]


def test_records_of_a_missing_session_are_refused(place: Place) -> None:
    with pytest.raises(SessionError, match="does not exist"):
        place.service.records(place.name("nothing"))


def test_a_turn_past_the_context_ends_in_a_limit(place: Place) -> None:
    name = place.name("full")
    with pytest.raises(LimitError):
        _turn(place, name, FULL)


def test_a_cancelled_turn_ends_cancelled_and_the_session_goes_on(place: Place) -> None:
    name = place.name("cancel")
    cancel = CancelToken()
    ended: list[BaseException] = []

    def run() -> None:
        try:
            _turn(place, name, HANG, cancel=cancel)
        except BaseException as e:  # the test's thread reads it
            ended.append(e)

    asked = len(place.fake.requests)
    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: any(HANG in str(r) for r in place.fake.requests[asked:]),
               what="the model server to be asked")
    cancel.cancel()
    thread.join(HANG_S)
    assert not thread.is_alive() and len(ended) == 1 and isinstance(ended[0], Cancelled)
    assert _turn(place, name, "t2").content == "done t2."


# --- rewind, fork, compact -------------------------------------------------------------------


def test_rewind_takes_back_turns_and_refuses_what_it_cannot(place: Place) -> None:
    name = place.name("rewind")
    _turn(place, name, "t1")
    _turn(place, name, "t2")
    rewound = place.service.rewind(name, 1)
    assert rewound == Rewound(name, 1, (2,), (1,))
    assert isinstance(place.service.records(name)[-1], Rewind)
    with pytest.raises(UsageError):
        place.service.rewind(name, 5)
    with pytest.raises(SessionError, match="does not exist"):
        place.service.rewind(place.name("nothing"), 1)


def test_rewind_of_a_session_another_client_has_is_refused(place: Place) -> None:
    name = place.name("rewind-in-use")
    other = place.other()
    other.turn(name, "t1", lambda _e: None, NO_APPROVER)
    with pytest.raises(SessionInUse):
        place.service.rewind(name, 1)
    other.close(name)


def test_fork_copies_a_session_and_refuses_what_it_cannot(place: Place) -> None:
    source, name = place.name("fork-src"), place.name("fork")
    _turn(place, source, "t1")
    forked = place.service.fork(source, name)
    assert forked == Forked(name, source, 1, forked.records, forked.state_tokens)
    assert forked.records >= 3
    assert [r.content for r in place.service.records(name) if isinstance(r, User)] == ["t1"]
    with pytest.raises(UsageError):
        place.service.fork(source, name)  # taken
    with pytest.raises(SessionError, match="does not exist"):
        place.service.fork(place.name("nothing"), place.name("fork-none"))
    with pytest.raises(UsageError, match="is not allowed"):
        place.service.fork(source, "../bad")


def test_compact_shortens_and_refuses_a_conversation_with_nothing_to_drop(place: Place) -> None:
    name = place.name("compact")
    place.service.open(name)
    with pytest.raises(UsageError, match="nothing to compact"):
        place.service.compact(name, lambda _e: None)
    with pytest.raises(SessionError, match="does not exist"):
        place.service.compact(place.name("nothing"), lambda _e: None)
    for tag in ("t1", "t2", "t3", "t4"):
        _turn(place, name, tag)
    done = place.service.compact(name, lambda _e: None)
    assert isinstance(done, CompactReport) and done.session == name
    assert done.turns_kept == 3 and done.tokens_before > 0  # (a tiny talk grows: the frame)
    assert isinstance(place.service.records(name)[-1], Compaction)


# --- status ----------------------------------------------------------------------------------


def test_status_says_what_a_session_is_now(place: Place) -> None:
    name = place.name("status")
    _turn(place, name, "t1")
    _turn(place, name, "t2")
    state = place.service.status(name)
    assert state == SessionState(name, len(place.service.records(name)), 2, True, False,
                                 str(place.service.workspace))
    place.service.close(name)
    assert place.service.status(name).attached is False
    with pytest.raises(SessionError, match="does not exist"):
        place.service.status(place.name("nothing"))
    with pytest.raises(UsageError, match="is not allowed"):
        place.service.status("../bad")


# --- list, remove ------------------------------------------------------------------------------


def test_remove_deletes_and_refuses_what_it_cannot(place: Place) -> None:
    name = place.name("remove")
    _turn(place, name, "t1")
    other = place.other()
    with pytest.raises(SessionInUse):
        other.remove(name)
    place.service.remove(name)  # attached to this client: closed first
    assert name not in place.service.list()
    with pytest.raises(SessionError, match="does not exist"):
        place.service.remove(name)
