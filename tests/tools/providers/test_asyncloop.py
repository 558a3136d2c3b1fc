"""LoopThread: threads hand coroutines to one asyncio loop and each waits only for its own,
giving up on its cancel flag or its deadline (the coroutine is cancelled on the loop)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from actors.tools.providers.asyncloop import LoopThread, Stopped
from tests.support.watch import HANG_S


@pytest.fixture
def loop() -> LoopThread:
    return LoopThread("test-loop")


def test_a_result_comes_back_and_an_exception_is_raised_in_the_caller(loop: LoopThread) -> None:
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    async def fail() -> None:
        raise KeyError("nope")

    try:
        assert loop.wait(add(2, 3), HANG_S, threading.Event()) == 5
        with pytest.raises(KeyError):
            loop.wait(fail(), HANG_S, threading.Event())
    finally:
        loop.close()


def test_waiting_threads_block_only_themselves(loop: LoopThread) -> None:
    gate = asyncio.Event()  # set from the loop thread only
    results: list[object] = []

    async def held() -> str:
        await gate.wait()
        return "held"

    async def free() -> str:
        return "free"

    t = threading.Thread(target=lambda: results.append(
        loop.wait(held(), HANG_S, threading.Event())))
    try:
        t.start()
        assert loop.wait(free(), HANG_S, threading.Event()) == "free"  # not behind held()
        loop.loop.call_soon_threadsafe(gate.set)
        t.join(HANG_S)
        assert results == ["held"]
    finally:
        loop.loop.call_soon_threadsafe(gate.set)
        loop.close()


@pytest.mark.parametrize("how", [Stopped.CANCELLED, Stopped.TIMED_OUT])
def test_a_stopped_wait_cancels_the_coroutine_on_the_loop(loop: LoopThread, how: Stopped) -> None:
    started, cleaned = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()  # its own clean-up runs on the loop

    cancel = threading.Event()
    if how is Stopped.CANCELLED:
        cancel.set()
    try:
        # the timeout is the stimulus of TIMED_OUT (and far away for CANCELLED)
        timeout_s = 0.2 if how is Stopped.TIMED_OUT else HANG_S
        assert loop.wait(forever(), timeout_s, cancel) is how
        assert cleaned.wait(HANG_S) and started.is_set()
    finally:
        loop.close()


def test_close_runs_the_last_coroutine_and_ends_the_thread_and_a_waiter(
    loop: LoopThread,
) -> None:
    ran: list[str] = []
    outcome: list[object] = []
    waiting = threading.Event()

    async def endless() -> None:
        waiting.set()
        await asyncio.Event().wait()

    async def last() -> None:
        ran.append("last")
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    t = threading.Thread(target=lambda: outcome.append(
        loop.wait(endless(), HANG_S, threading.Event())))
    t.start()
    assert waiting.wait(HANG_S)
    loop.close(last)
    t.join(HANG_S)
    assert ran == ["last"] and outcome == [Stopped.CLOSED]
    assert loop.loop.is_closed()
    loop.close(last)  # again: nothing to do
    assert ran == ["last"]
