"""What a loopd process does before anything else: httpx's command-line tool left out; and,
once started, its start-up heap taken out of the garbage collector's view.

httpx imports its command-line tool (click, pygments, rich's progress, syntax and tables)
whenever those are installed, and rich is a dependency of loopd: about 0.09 s of CPU in
every loopd process that speaks HTTP. loopd never runs that tool; marked absent here,
before anything imports httpx, httpx leaves it out (its ``httpx.main`` then says to install
httpx[cli]). A process that imported httpx first keeps it as it was.

The packages loopd's processes start from import this first (``actors.cli``: every
command, the daemon, ``loopd acp``; ``actors.tools.host``: a tool host). ``import actors``
does not: a program that uses loopd as a library keeps its httpx whole.

:func:`settled`: a loopd process's start-up (modules, config, the world's actors) builds a
heap that lives as long as the process (~47,000 objects the collector tracks after loopd's
imports alone). The cyclic collector's full collections walk all of it (18-31 ms of CPU
each in the bench's loop process, every ~1,600 model calls of ``run_turn``: every call
leaves 46-48 objects in reference cycles, httpx's own).
``gc.freeze()`` once start-up is done moves those objects to a generation the collector
never visits: the collector's CPU per model call went from 33-42 us to 21-23 us (three
runs of 800 turns each way, its time read in ``gc.callbacks``), and no full collection
stalls the process's threads on the start-up heap. Garbage made after it is collected as
before (the daemon's soak stays flat, docs/bench.md). It is done once a process, and only
in a process that is a loopd program (:func:`program`: ``loopd``, ``python -m actors.cli``,
``python -m actors.tools.host``): a program that uses loopd as a library, or a test that
calls ``main`` in its own process, keeps its collector as it was.
"""

import gc
import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

_state = {"program": False, "frozen": False}


def program() -> None:
    """Mark this process as a loopd program (its entry point calls this): see :func:`settled`."""
    _state["program"] = True


def settled() -> None:
    """Start-up is done: freeze the heap it built (``gc.freeze``), once, in a loopd program."""
    if _state["program"] and not _state["frozen"]:
        _state["frozen"] = True
        gc.freeze()
