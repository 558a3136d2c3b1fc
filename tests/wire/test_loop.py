"""actors/wire/loop.py on its own: wake-ups from other threads, timers, heartbeats, shutdown.

Real ZeroMQ sockets (inproc://) and real threads; waits are events with generous hang
guards, never timing assertions.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from actors.wire.loop import Heartbeat, Loop, SignalWake

_names = itertools.count()
GUARD_S = 30.0  # hang guard: a test that waits this long has failed


class Running:
    """A loop running in a thread of its own (as the daemon's client and the tool port run it)."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="loop-under-test", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run()
        except BaseException as e:  # the test fails on it below
            self.error = e

    def stop(self) -> None:
        self.loop.stop()
        self.thread.join(GUARD_S)
        assert not self.thread.is_alive(), "the loop did not stop"
        assert self.error is None, self.error


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def loop() -> Iterator[Loop]:
    made = Loop()
    yield made
    made.close()


def in_loop(loop: Loop, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in the loop's thread (timers and sockets are its own); its result."""
    done = threading.Event()
    box: list[Any] = []
    loop.post(lambda: (box.append(fn()), done.set()))
    assert done.wait(GUARD_S), "the loop did not run posted work"
    return box[0]


def pair(ctx: zmq.Context[Any]) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
    """A ROUTER (the test's end) and a DEALER connected to it (the loop's end)."""
    endpoint = f"inproc://loop-{next(_names)}"
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    return router, dealer


# --- wake-ups from other threads ---------------------------------------------------------------


def test_work_posted_from_many_threads_all_runs_in_the_loops_thread_in_each_posters_order(
    loop: Loop,
) -> None:
    running = Running(loop)
    seen: list[tuple[int, int, str]] = []  # only the loop's thread appends
    per_thread, threads = 2000, 8

    def poster(t: int) -> None:
        for n in range(per_thread):
            loop.post(lambda n=n: seen.append((t, n, threading.current_thread().name)))

    workers = [threading.Thread(target=poster, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    in_loop(loop, lambda: None)  # everything posted before this has run
    running.stop()
    assert len(seen) == per_thread * threads  # no post lost, none run twice
    assert {name for _, _, name in seen} == {"loop-under-test"}
    for t in range(threads):
        assert [n for tt, n, _ in seen if tt == t] == list(range(per_thread))


def test_a_post_wakes_a_loop_sleeping_without_any_timer(loop: Loop) -> None:
    running = Running(loop)
    for _ in range(50):  # each time the loop is asleep in poll with no timeout at all
        woke = threading.Event()
        time.sleep(0.001)
        loop.post(woke.set)
        assert woke.wait(GUARD_S)
    running.stop()


def test_work_posted_before_stop_runs_before_run_returns(loop: Loop) -> None:
    ran: list[int] = []
    gate = threading.Event()
    running = Running(loop)
    loop.post(gate.wait, GUARD_S)  # hold the loop while more is posted and the stop comes
    for n in range(100):
        loop.post(ran.append, n)
    loop.stop()
    gate.set()
    running.stop()
    assert ran == list(range(100))


def test_stop_before_run_returns_at_once_after_running_what_was_posted(loop: Loop) -> None:
    ran: list[str] = []
    loop.post(ran.append, "posted")
    loop.stop()
    loop.run()
    assert ran == ["posted"]
    assert loop.stopping


def test_a_signal_handler_stops_a_loop_in_the_main_thread(loop: Loop) -> None:
    previous = signal.signal(signal.SIGUSR1, lambda *_: loop.stop())
    try:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        loop.every(GUARD_S, pytest.fail, "the signal did not stop the loop")
        loop.run()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_signal_another_thread_takes_wakes_a_loop_with_a_signal_wake(loop: Loop) -> None:
    """A signal the kernel gives a thread other than the main one trips Python's flag and
    nothing else: the main thread, asleep in poll with no timer due, never ran the handler
    (the daemon served on after a SIGTERM). Through its SignalWake, the loop wakes."""
    ran: list[str] = []

    def handler(*_: object) -> None:
        ran.append("handler")
        loop.stop()

    def hang_guard() -> None:
        ran.append("guard")
        loop.stop()

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with SignalWake(loop):
            # The timer's own thread takes the signal, once the loop is (likely) asleep.
            threading.Timer(0.05, lambda: signal.pthread_kill(threading.get_ident(),
                                                              signal.SIGUSR1)).start()
            guard = threading.Timer(GUARD_S, hang_guard)  # from another thread
            guard.start()
            loop.run()
            guard.cancel()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert ran[:1] == ["handler"], "the loop ended by its hang guard, not the signal"


def test_posting_after_close_is_harmless(loop: Loop) -> None:
    loop.stop()
    loop.run()
    loop.close()
    fd = os.open(os.devnull, os.O_RDONLY)  # may take the waker's old number
    try:
        loop.post(print, "nobody runs this")  # must not write into whatever file has it now
        loop.stop()
    finally:
        os.close(fd)


# --- sockets ---------------------------------------------------------------------------------


def test_every_message_reaches_the_handler_in_order_even_past_one_batch(
    loop: Loop, ctx: zmq.Context[Any]
) -> None:
    router, dealer = pair(ctx)
    got: list[bytes] = []
    all_in = threading.Event()
    count = 600  # several batches (under the queues' 1000): timers get turns in between

    def handler(frames: list[bytes]) -> None:
        got.extend(frames)
        if len(got) == count:
            all_in.set()

    ticks: list[int] = []  # how many messages were in at each tick of a timer
    loop.add(dealer, handler)
    loop.every(0.001, lambda: ticks.append(len(got)))
    dealer.send(b"hello")
    peer, _ = router.recv_multipart()
    for n in range(count):
        router.send_multipart([peer, str(n).encode()])
    running = Running(loop)
    assert all_in.wait(GUARD_S)
    running.stop()
    dealer.close(linger=0)
    router.close(linger=0)
    assert got == [str(n).encode() for n in range(count)]
    assert any(0 < n < count for n in ticks)  # a flood does not hold the timers up


def test_a_multipart_message_comes_as_its_frames(loop: Loop, ctx: zmq.Context[Any]) -> None:
    router, dealer = pair(ctx)
    got: list[list[bytes]] = []
    loop.add(router, lambda frames: (got.append(frames), loop.stop()))
    dealer.send_multipart([b"one", b"two"])
    Running(loop).thread.join(GUARD_S)
    assert got == [[got[0][0], b"one", b"two"]]
    dealer.close(linger=0)
    router.close(linger=0)


def test_a_handler_that_removes_its_socket_gets_no_more_of_its_messages(
    loop: Loop, ctx: zmq.Context[Any]
) -> None:
    router, dealer = pair(ctx)
    got: list[bytes] = []

    def handler(frames: list[bytes]) -> None:
        got.extend(frames)
        loop.remove(dealer)

    loop.add(dealer, handler)
    dealer.send(b"hello")
    peer, _ = router.recv_multipart()
    for n in range(10):
        router.send_multipart([peer, b"%d" % n])
    running = Running(loop)
    in_loop(loop, lambda: None)
    time.sleep(0.05)  # give a wrong loop the chance to read more
    in_loop(loop, lambda: None)
    running.stop()
    assert got == [b"0"]
    dealer.close(linger=0)
    router.close(linger=0)


# --- timers ----------------------------------------------------------------------------------


def test_timers_fire_in_the_order_of_their_times_and_cancelled_ones_do_not(loop: Loop) -> None:
    fired: list[str] = []
    done = threading.Event()
    loop.call_later(0.03, fired.append, "third")
    loop.call_later(0.01, fired.append, "first")
    loop.cancel(loop.call_later(0.015, fired.append, "cancelled"))
    loop.call_later(0.02, fired.append, "second")
    loop.call_later(0.04, done.set)
    running = Running(loop)
    assert done.wait(GUARD_S)
    running.stop()
    assert fired == ["first", "second", "third"]


def test_a_timer_is_not_run_early(loop: Loop) -> None:
    when: list[float] = []
    start = time.monotonic()
    loop.call_at(start + 0.05, lambda: (when.append(time.monotonic()), loop.stop()))
    loop.run()
    assert when[0] >= start + 0.05


def test_a_repeating_timer_repeats_until_cancelled(loop: Loop) -> None:
    ticks: list[float] = []
    enough = threading.Event()

    def tick() -> None:
        ticks.append(time.monotonic())
        if len(ticks) == 5:
            loop.cancel(timer)
            enough.set()

    timer = loop.every(0.01, tick)
    running = Running(loop)
    assert enough.wait(GUARD_S)
    in_loop(loop, lambda: None)
    running.stop()
    assert len(ticks) == 5
    assert all(b - a >= 0.01 for a, b in itertools.pairwise(ticks))


def test_a_repeating_timer_needs_a_positive_interval(loop: Loop) -> None:
    with pytest.raises(ValueError, match="positive"):
        loop.every(0, print)


def test_many_cancelled_timers_do_not_pile_up(loop: Loop) -> None:
    """A host sets a timer per call and cancels most: the heap must not grow without end."""
    for _ in range(10_000):
        loop.cancel(loop.call_later(3600, print))
    assert len(loop._timers) < 200  # rebuilt without the cancelled ones
    fired = threading.Event()
    loop.call_later(0.01, fired.set)
    running = Running(loop)
    assert fired.wait(GUARD_S)
    running.stop()


# --- heartbeats --------------------------------------------------------------------------------


class Peer:
    """The far end of a heartbeat: a ROUTER thread that answers each ping (until told not to)."""

    def __init__(self, router: zmq.Socket[Any], *, enough: int = 0) -> None:
        self.router = router
        self.answering = True
        self.pings = 0
        self.enough = enough
        self.pinged_enough = threading.Event()  # set at the ``enough``-th ping
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if not self.router.poll(20):
                continue
            peer, _ = self.router.recv_multipart()
            self.pings += 1
            if self.pings == self.enough:
                self.pinged_enough.set()
            if self.answering:
                self.router.send_multipart([peer, b"pong"])

    def close(self) -> None:
        self.done.set()
        self.thread.join(GUARD_S)
        self.router.close(linger=0)


# A peer or a loop starved longer than a heartbeat's window (interval x misses) on a loaded
# machine is silent, rightly: the tests that need a peer kept alive give it a window far longer
# than any starvation seen here (0.6 s), and run past that window, so that a beat that did not
# count what it heard is still reported within the test.
INTERVAL_S, KEPT_MISSES = 0.05, 40  # a 2 s window
PAST_THE_WINDOW = KEPT_MISSES + 10  # beats


def test_a_peer_that_answers_is_pinged_every_interval_and_never_silent(
    loop: Loop, ctx: zmq.Context[Any]
) -> None:
    router, dealer = pair(ctx)
    peer = Peer(router, enough=PAST_THE_WINDOW)
    silent: list[float] = []
    over = threading.Event()  # the peer was pinged past the window, or it was taken for silent

    def on_silent(seconds: float) -> None:
        silent.append(seconds)
        over.set()

    peer_done = threading.Thread(target=lambda: (peer.pinged_enough.wait(GUARD_S), over.set()))
    peer_done.start()
    beat = Heartbeat(
        loop, INTERVAL_S, on_silent, ping=lambda: dealer.send(b"ping"), misses=KEPT_MISSES
    )
    loop.add(dealer, lambda _frames: beat.heard())
    running = Running(loop)
    assert over.wait(GUARD_S)
    in_loop(loop, beat.cancel)
    running.stop()
    peer.close()
    peer.pinged_enough.set()  # the waiting thread ends even if the beat stopped pinging early
    peer_done.join(GUARD_S)
    dealer.close(linger=0)
    assert silent == []
    assert peer.pings >= PAST_THE_WINDOW


def test_a_peer_that_goes_silent_is_reported_once_after_the_missed_beats(
    loop: Loop, ctx: zmq.Context[Any]
) -> None:
    router, dealer = pair(ctx)
    peer = Peer(router)
    silent: list[float] = []
    reported = threading.Event()

    def on_silent(seconds: float) -> None:
        silent.append(seconds)
        reported.set()

    beat = Heartbeat(loop, 0.05, on_silent, ping=lambda: dealer.send(b"ping"), misses=3)
    loop.add(dealer, lambda _frames: beat.heard())
    running = Running(loop)
    deadline = time.monotonic() + GUARD_S
    while peer.pings < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    peer.answering = False  # it goes silent
    assert reported.wait(GUARD_S)
    pings_then = peer.pings
    time.sleep(0.2)  # four more intervals: nothing more is reported, nor pinged
    in_loop(loop, lambda: None)
    running.stop()
    peer.close()
    dealer.close(linger=0)
    assert len(silent) == 1
    assert silent[0] >= 3 * 0.05
    assert peer.pings == pings_then


def test_a_watch_without_pings_reports_a_silent_peer_and_hearing_from_it_keeps_it(
    loop: Loop,
) -> None:
    """The daemon's side: it pings nobody, it only notices clients that stop pinging it."""
    silent: list[str] = []
    beats: dict[str, Heartbeat] = {}

    def watch(name: str, misses: int) -> None:
        beats[name] = Heartbeat(loop, INTERVAL_S, lambda _s: silent.append(name), misses=misses)

    running = Running(loop)
    in_loop(loop, lambda: (watch("quiet", 3), watch("talking", KEPT_MISSES)))
    started = beats["talking"].last_rx
    # "talking" is heard until it has lived past its window and "quiet" was reported
    while in_loop(loop, lambda: "quiet" not in silent) or (
        time.monotonic() - started < PAST_THE_WINDOW * INTERVAL_S
    ):
        loop.post(beats["talking"].heard)
        time.sleep(0.005)
        assert time.monotonic() - started < GUARD_S
    in_loop(loop, beats["talking"].cancel)
    running.stop()
    assert silent == ["quiet"]


def test_a_heartbeat_needs_a_positive_interval(loop: Loop) -> None:
    with pytest.raises(ValueError, match="positive"):
        Heartbeat(loop, float("nan"), print)


# --- linger: waiting on the posts for a quick answer -------------------------------------------


def test_a_post_during_a_linger_runs_at_once(loop: Loop, ctx: zmq.Context[Any]) -> None:
    router, dealer = pair(ctx)
    answered = threading.Event()
    loop.linger = lambda: 3600.0  # far past in_loop's guard: only the post can end it

    def on_request(frames: list[bytes]) -> None:
        threading.Thread(target=loop.post, args=(answered.set,)).start()

    loop.add(router, on_request)
    running = Running(loop)
    dealer.send(b"request")
    assert answered.wait(GUARD_S)
    in_loop(loop, lambda: None)  # fails on its guard unless the post ended the linger
    running.stop()
    dealer.close(linger=0)
    router.close(linger=0)
