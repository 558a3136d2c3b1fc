"""A command's stop, bounded: past ``daemon.stop_grace_s`` it kills what it started and exits.

A clean stop (``loopd stop``, SIGTERM, SIGINT, Ctrl-C, the end of ``loopd run`` or of
``loopd acp``'s input) cancels the turns in flight, closes the sessions and stops the World:
the slot keeper saves the changed KV states, the tool hosts and the embedded server stop.
Each step has its own limit, but they add up, and a model server that takes a save and never
answers holds the keeper for ``inference.read_timeout_s`` per slot. :class:`StopDeadline` is
armed when the stop begins (the daemon: its loop ends; every command: its World starts to
stop, :func:`actors.session.world.start_world`); if the process is still there ``grace_s``
later (a step stuck, or a thread that keeps the interpreter from exiting), it writes every
thread's stack to stderr (the daemon's log), kills every process this one started (with its
process tree and, for a session leader such as a tool host, its session), and exits with
code 1. The logs need nothing more: every record is written whole or cut on the next open (a
torn tail), and a KV state not saved is only a cold start.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
from collections.abc import Callable

import psutil

from actors.base.processes.trees import kill_session, kill_tree

__all__ = ["EXIT_CODE", "StopDeadline"]

log = logging.getLogger("loopd.stop")

EXIT_CODE = 1  # the exit code of a process whose stop outlasted the grace


class StopDeadline:
    """Armed once (from any thread); fires ``grace_s`` later unless the process has ended
    or the stop was :meth:`done` first.

    ``cleanup``: best-effort last steps before the exit (the daemon's socket and pid file);
    ``who``: the process, as the log names it."""

    def __init__(
        self, grace_s: float, cleanup: Callable[[], None] = lambda: None, *,
        who: str = "the daemon",
    ) -> None:  # fmt: skip
        self.grace_s = grace_s
        self.who = who
        self._cleanup = cleanup
        self._armed = threading.Event()
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self._armed.is_set():
            return
        self._armed.set()
        self._timer = threading.Timer(self.grace_s, self._expire)
        self._timer.name = "stop-deadline"
        self._timer.daemon = True  # it fires while the interpreter waits for other threads
        self._timer.start()

    def done(self) -> None:
        """The stop ended in time: the process goes on (a test's, or a command after it)."""
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        log.error(
            "%s did not stop within daemon.stop_grace_s = %g s: killing what it "
            "started and exiting (its threads' stacks follow)", self.who, self.grace_s,
        )  # fmt: skip
        with contextlib.suppress(Exception):
            for handler in logging.getLogger().handlers:
                handler.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        with contextlib.suppress(Exception):
            kill_started()
        with contextlib.suppress(Exception):
            self._cleanup()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(EXIT_CODE)


def kill_started() -> None:
    """SIGKILL every process this one started: each child's tree, and the session of a
    child that leads its own (a tool host's commands, even orphaned)."""
    me = os.getpid()
    for child in psutil.Process(me).children():
        with contextlib.suppress(psutil.Error, OSError):
            leads = os.getsid(child.pid) == child.pid
            kill_tree(child.pid, wait_s=0.5)
            if leads:
                kill_session(child.pid, wait_s=0.5)
