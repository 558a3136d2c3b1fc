"""actors/base/cancel.py's wait_out: the one Ctrl-C wait of the person's command (in-process
turns and turns through the daemon)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from actors.base.cancel import wait_out
from actors.base.errors import Cancelled


class Term(KeyboardInterrupt):
    """Stands for the CLI's SIGTERM (a subclass of KeyboardInterrupt)."""


def steps(*outcomes: object) -> Callable[[], object]:
    """A step that raises or returns each of ``outcomes`` in turn."""
    it: Iterator[object] = iter(outcomes)

    def step() -> object:
        value = next(it)
        if isinstance(value, BaseException):
            raise value
        return value

    return step


def test_it_waits_through_nones_for_the_result() -> None:
    cancels: list[int] = []
    assert wait_out(steps(None, None, "done"), lambda: cancels.append(1)) == "done"
    assert cancels == []


def test_ctrl_c_cancels_and_waits_on_for_the_result() -> None:
    cancels: list[int] = []
    step = steps(None, KeyboardInterrupt(), None, KeyboardInterrupt(), "wound down")
    assert wait_out(step, lambda: cancels.append(1)) == "wound down"
    assert cancels == [1, 1]


def test_ctrl_c_then_the_turns_cancelled_error_is_raised() -> None:
    cancels: list[int] = []
    with pytest.raises(Cancelled):
        wait_out(steps(KeyboardInterrupt(), Cancelled()), lambda: cancels.append(1))
    assert cancels == [1]


def test_sigterm_cancels_and_is_raised_once_the_turn_has_ended() -> None:
    cancels: list[int] = []
    with pytest.raises(Term):
        wait_out(steps(Term(), None, "answered anyway"), lambda: cancels.append(1))
    assert cancels == [1]


def test_sigterm_wins_over_the_error_its_cancel_brought() -> None:
    with pytest.raises(Term):
        wait_out(steps(Term(), Cancelled()), lambda: None)
