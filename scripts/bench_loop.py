"""Loop overhead per model call: loopd's turn, a bare httpx stream, the OpenAI Agents SDK.

The fake llama-server runs the agent script (:mod:`tests.support.scripted_llama`) in its
own process (a server thread here would share this process's GIL: docs/bench.md). One turn is
two model calls: the model calls ``find_tool`` (answered locally, no tool host), then answers
(~200 characters in 4-character deltas, ~15 KB of SSE). Per round, in turn, so all see the
same machine state:

- floor: a bare ``httpx`` streaming POST of the same two request bodies loopd sends, reading
  every line (no parsing, no log, no actors): what no correct client can go under;
- decoding floor: the same, read with httpx-sse and every chunk decoded with orjson: the
  least a correct streaming client does (loopd's goal is measured against this one);
- loopd ``run_turn`` on a fresh session log, fsync "never" (the loop's own cost) and
  "always" (the default: one ``fdatasync`` per record, 5 records per turn);
- loopd ``SessionActor.turn``, fsync "always": the path ``loopd run`` takes;
- the OpenAI Agents SDK: ``Runner.run_streamed`` with a chat-completions model pointed at
  the same server and the same tool (tracing off), every stream event consumed.

Each is timed per turn and divided by its two model calls; p50s are reported, with ratios
to both floors (goal: loopd's ``run_turn`` at most 1.15x the decoding floor) and loopd
against the SDK (goal: under 0.3x). The CPU time of this process (every thread: the actors'
too) per model call is reported beside, as a ratio to the decoding floor's: on a machine
loaded by other programs the wall times carry their turns on the CPU, the CPU times do not.
So are the context switches of its threads per model call: where the CPU goes that no
Python profile shows (a hand-off between two threads costs several, tens of microseconds
each on the virtual machines measured here; docs/bench.md). And the CPU of ``run_turn`` and
``Inference.complete`` split by thread: the calling thread's (the session's side: the turn's
own work, its side of the actor ask) and the rest (the inference actor's: the stream), so
that every part of the turn's cost has its share in the same run.

After its start-up (the warm-up turn) the bench freezes its heap (``gc.freeze``), as a loopd
process does once started (:mod:`actors.base.startup`): every variant then pays the
collector for what it leaves, not for walking the bench's own start-up heap.

The main run pins this process to the first CPU and the server to the last (`_pinned`), as
a real llama-server has hardware of its own: every variant then pays its own CPU time and
nothing else. A second, shorter run without pinning is reported too; there the ratios swing
from run to run (the scheduler sometimes puts client and server on one core), and a stream
read by another thread than the one that waits for it costs up to 0.5 ms more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import importlib.util
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from httpx_sse import EventSource

from actors.base.cancel import CancelToken
from actors.base.config import Config, parse
from actors.base.events import Event
from actors.inference.actor import Inference
from actors.inference.llama import LlamaClient, encode_body
from actors.inference.types import ChatRequest
from actors.log.file import SessionLog
from actors.log.records import Baseline, Record, now
from actors.session.actor import open_session
from actors.session.messages import messages
from actors.session.turn import Runtime, run_turn
from actors.tools.registry import META_TOOLS, Registry
from tests.support.scripted_llama import serve_in_process

__all__ = ["MESSAGE", "run"]

MESSAGE = 'bench :: find_tool {"query": "read a file"}'
ANSWER_CHARS = 200
ROUNDS = 150
WARMUP = 15
SMOKE = {"ROUNDS": 2, "WARMUP": 1}  # `bench --smoke`


def _sink(_event: Event) -> None:
    pass


class _Logs:
    """Fresh session logs in a scratch directory (made outside the timed part)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="loopd-bench-loop-"))
        self.n = 0

    def config(self, url: str, fsync: str) -> Config:
        return parse({"inference": {"url": url, "retries": 0},
                      "log": {"dir": str(self.root / fsync), "fsync": fsync}})  # fmt: skip

    def open(self, fsync: str) -> SessionLog:
        self.n += 1
        path = self.root / fsync / f"s{self.n}" / "log.bin"
        log, _ = SessionLog.open(path, fsync=fsync, baseline=_baseline(), name=f"s{self.n}")
        return log

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _baseline() -> Baseline:
    return Baseline(system="You are terse.", tools=META_TOOLS, model="fake", created=now())


def _requests(records: tuple[Record, ...], config: Config) -> list[ChatRequest]:
    """The two requests of a turn, as run_turn makes them."""
    baseline = records[0]
    assert isinstance(baseline, Baseline)
    return [
        ChatRequest(
            session="bench", messages=tuple(messages(baseline, records[:end])),
            tools=baseline.tools, thinking=True, max_tokens=config.loop.max_tokens,
            thinking_budget=config.loop.thinking_cap,
        )
        for end in (2, 5)  # [baseline, user] and [..., assistant, usage, tool_result]
    ]  # fmt: skip


def _actor_turn(session: Any, runtime: Runtime) -> None:
    session.turn(runtime, MESSAGE, _sink).get(timeout=60)


def _timed(fn: Callable[[], object]) -> tuple[float, float, int, float]:
    """Wall time, CPU time of this whole process (every thread; the server is another), the
    context switches of its threads (voluntary and not): on the machines measured here a
    switch costs tens of microseconds of CPU, a thread hand-off several of them; and the CPU
    time of the calling thread alone (the session's: the rest is the inference actor's)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    mine = time.thread_time()
    start = time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    mine = time.thread_time() - mine
    now = resource.getrusage(resource.RUSAGE_SELF)
    switches = now.ru_nvcsw + now.ru_nivcsw - used.ru_nvcsw - used.ru_nivcsw
    return wall, now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime, switches, mine


@contextlib.contextmanager
def _sdk(url: str) -> Iterator[Callable[[], object]]:
    """One SDK run of the same turn, as a blocking call on a persistent event loop."""
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def find_tool(query: str) -> str:
        """Find tools for a task: their names, descriptions and arguments."""
        return "No tools are available right now: no tool host is connected."

    loop = asyncio.new_event_loop()
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    model = OpenAIChatCompletionsModel(model="loopd", openai_client=client)
    agent = Agent(name="bench", instructions="You are terse.", tools=[find_tool], model=model)

    async def once() -> None:
        result = Runner.run_streamed(agent, MESSAGE)
        async for _event in result.stream_events():
            pass
        assert str(result.final_output).startswith("done bench.")

    try:
        yield lambda: loop.run_until_complete(once())
    finally:
        loop.run_until_complete(client.close())
        loop.close()


def _has_sdk() -> bool:
    """The OpenAI Agents SDK is the bench extra's (``make bench`` installs it)."""
    return importlib.util.find_spec("agents") is not None


def _sse_kb(url: str, bodies: list[bytes]) -> float:
    with httpx.Client(timeout=30) as c:
        total = 0
        for body in bodies:
            r = c.post(url + "/v1/chat/completions", content=body,
                       headers={"Content-Type": "application/json"})  # fmt: skip
            total += len(r.content)
    return total / len(bodies) / 1024


@contextlib.contextmanager
def _pinned() -> Iterator[set[int] | None]:
    """This process on the first CPU, the server (yielded set) on the last; restored after.

    On 2 shared cores the scheduler otherwise decides, run by run, whether the server and
    the client share a core, and the floor itself moves by 50% (0.94 vs 1.4 ms). Pinned,
    every variant sees the same placement, and p25 and p50 agree.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        yield None
        return
    os.sched_setaffinity(0, {cpus[0]})
    try:
        yield {cpus[-1]}
    finally:
        os.sched_setaffinity(0, set(cpus))


def run() -> list[dict[str, Any]]:
    logs = _Logs()
    try:
        with (
            _pinned() as server_cpus,
            serve_in_process(answer_chars=ANSWER_CHARS, cpus=server_cpus) as url,
        ):
            pinned = _measure(url, logs, rounds=ROUNDS, sdk=_has_sdk())
        with serve_in_process(answer_chars=ANSWER_CHARS) as url:
            loose = _measure(url, logs, rounds=ROUNDS // 2, sdk=False)
    finally:
        logs.close()
    return _rows(pinned, loose, pinned=server_cpus is not None)


def _measure(url: str, logs: _Logs, *, rounds: int, sdk: bool) -> dict[str, float]:
    """p50 per model call, ms, of each variant; interleaved round by round."""
    never, always = logs.config(url, "never"), logs.config(url, "always")
    inference = Inference.start(never.inference)
    registry = Registry([])
    runtimes = {
        fsync: Runtime(config=c, inference=inference, registry=registry)
        for fsync, c in (("never", never), ("always", always))
    }
    bare = httpx.Client(timeout=30)
    llama = LlamaClient(never.inference)
    try:
        warm = logs.open("never")
        run_turn(warm, runtimes["never"], MESSAGE, _sink)
        requests = _requests(warm.records, never)
        bodies = [encode_body(r) for r in requests]
        warm.close()
        size = _sse_kb(url, bodies)
        # Start-up is done: freeze its heap, as a loopd process does (startup.settled); what
        # the collector then walks is what the calls leave, for every variant alike.
        gc.freeze()

        def floor() -> None:
            for body in bodies:
                with bare.stream("POST", url + "/v1/chat/completions", content=body,
                                 headers={"Content-Type": "application/json"}) as r:  # fmt: skip
                    for _line in r.iter_lines():
                        pass

        def decoding_floor() -> None:
            for body in bodies:
                with bare.stream("POST", url + "/v1/chat/completions", content=body,
                                 headers={"Content-Type": "application/json"}) as r:  # fmt: skip
                    for sse in EventSource(r).iter_sse():
                        if sse.data and sse.data != "[DONE]":
                            orjson.loads(sse.data)

        def client() -> None:
            for request in requests:
                llama.chat(request, _sink, CancelToken())

        def inference_only() -> None:
            for request in requests:
                inference.complete(request, _sink, CancelToken())

        with _sdk(url) if sdk else contextlib.nullcontext(None) as sdk_turn:
            times: dict[str, list[float]] = {}
            for i in range(WARMUP + rounds):
                logs_now = {f: logs.open(f) for f in ("never", "always")}
                session = open_session(always, f"a{i}", _baseline())
                try:
                    sample = {
                        "floor": _timed(floor),
                        "decoding": _timed(decoding_floor),
                        "client": _timed(client),
                        "inference": _timed(inference_only),
                        "never": _timed(functools.partial(
                            run_turn, logs_now["never"], runtimes["never"], MESSAGE, _sink)),
                        "always": _timed(functools.partial(
                            run_turn, logs_now["always"], runtimes["always"], MESSAGE, _sink)),
                        "actor": _timed(functools.partial(
                            _actor_turn, session, runtimes["always"])),
                    }  # fmt: skip
                    if sdk_turn is not None:
                        sample["sdk"] = _timed(sdk_turn)
                finally:
                    for log in logs_now.values():
                        log.close()
                    session.actor_ref.stop(timeout=10)
                if i >= WARMUP:
                    for k, (wall, cpu, switches, mine) in sample.items():
                        times.setdefault(k, []).append(wall / 2)  # two model calls per turn
                        times.setdefault(f"cpu {k}", []).append(cpu / 2)
                        times.setdefault(f"switches {k}", []).append(switches / 2)
                        times.setdefault(f"caller {k}", []).append(mine / 2)
    finally:
        bare.close()
        llama.close()
        inference.stop()
    p50 = {k: statistics.median(v) * (1 if k.startswith("switches") else 1000)
           for k, v in times.items()}
    p50["size_kb"] = size
    return p50


def _rows(p50: dict[str, float], loose: dict[str, float], *, pinned: bool) -> list[dict[str, Any]]:
    floor_ms, decoding_ms = p50["floor"], p50["decoding"]
    where = "bench on CPU 0, server on the last CPU" if pinned else "not pinned (1 CPU)"
    note = f"find_tool call + {ANSWER_CHARS}-char answer, ~{p50['size_kb']:.0f} KB SSE per call"
    return [
        {"name": "bare httpx stream, per model call p50", "value": floor_ms, "unit": "ms",
         "note": f"floor (lines only); {note}; {where}"},
        {"name": "httpx + httpx-sse + orjson of every chunk, per model call p50",
         "value": decoding_ms, "unit": "ms", "ratio": decoding_ms / floor_ms,
         "note": "decoding floor: the least a correct streaming client does"},
        {"name": "  of which LlamaClient.chat alone (no actor, no turn)", "value": p50["client"],
         "unit": "ms", "ratio": p50["client"] / floor_ms, "note": "SSE + JSON parsing, watchdog"},
        {"name": "  of which Inference.complete (actor, no turn)", "value": p50["inference"],
         "unit": "ms", "ratio": p50["inference"] / floor_ms,
         "note": "+ the ask to an inference actor"},
        {"name": "loopd run_turn (fsync never), per model call p50", "value": p50["never"],
         "unit": "ms", "ratio": p50["never"] / floor_ms, "note": "ratio to the lines floor"},
        {"name": "loopd run_turn (fsync never) vs the decoding floor",
         "value": p50["never"] / decoding_ms, "unit": "x", "note": "goal <= 1.15x"},
        {"name": "loopd run_turn (fsync always), per model call p50", "value": p50["always"],
         "unit": "ms", "ratio": p50["always"] / floor_ms, "note": "default: fdatasync per record"},
        {"name": "loopd SessionActor.turn (fsync always), per model call p50",
         "value": p50["actor"], "unit": "ms", "ratio": p50["actor"] / floor_ms,
         "note": "the path `loopd run` takes"},
        {"name": "loopd overhead over the floor (fsync never)",
         "value": (p50["never"] - floor_ms) * 1000, "unit": "us/call"},
        *_sdk_rows(p50, floor_ms),
        *_cpu_rows(p50),
        {"name": "unpinned: bare httpx stream, per model call p50", "value": loose["floor"],
         "unit": "ms", "note": "the scheduler places server and client as it likes"},
        {"name": "unpinned: decoding floor", "value": loose["decoding"], "unit": "ms",
         "ratio": loose["decoding"] / loose["floor"]},
        {"name": "unpinned: LlamaClient.chat alone", "value": loose["client"], "unit": "ms",
         "ratio": loose["client"] / loose["floor"]},
        {"name": "unpinned: loopd run_turn (fsync never)", "value": loose["never"], "unit": "ms",
         "ratio": loose["never"] / loose["floor"], "note": "swings run to run, see the docstring"},
    ]  # fmt: skip


def _cpu_rows(p50: dict[str, float]) -> list[dict[str, Any]]:
    """CPU time per model call, this process's every thread: what a loaded machine's wall
    times hide (another program's turn on the CPU counts in wall time, not here)."""
    decoding = p50["cpu decoding"]
    rows = [{"name": "CPU: decoding floor, per model call p50", "value": decoding * 1000,
             "unit": "us", "note": "getrusage of this process (the server is another)"}]
    for key, name in (("client", "LlamaClient.chat alone"), ("inference", "Inference.complete"),
                      ("never", "loopd run_turn (fsync never)")):
        cpu = p50[f"cpu {key}"]
        rows.append({"name": f"CPU: {name}, per model call p50", "value": cpu * 1000,
                     "unit": "us", "ratio": cpu / decoding,
                     "note": "ratio to the decoding floor's CPU"})
    for key, name in (("decoding", "decoding floor"), ("client", "LlamaClient.chat alone"),
                      ("inference", "Inference.complete"),
                      ("never", "loopd run_turn (fsync never)")):
        rows.append({"name": f"context switches: {name}, per model call p50",
                     "value": p50[f"switches {key}"], "unit": "",
                     "note": "every thread of this process, voluntary and not (getrusage)"})
    # Where run_turn's CPU goes, thread by thread: the caller's thread is the session's (the
    # turn's own work, and its side of the actor ask), the rest the inference actor's (the
    # stream, the checks, the runaway watch, the turn's event filters). Each a share of the
    # decoding floor's CPU, as the ratios above.
    for key, name in (("inference", "Inference.complete"), ("never", "loopd run_turn")):
        caller = p50[f"caller {key}"]
        rows.append({"name": f"CPU: {name}, the calling thread, per model call p50",
                     "value": caller * 1000, "unit": "us", "ratio": caller / decoding,
                     "note": "time.thread_time of the caller: the session's side"})
        others = p50[f"cpu {key}"] - caller
        rows.append({"name": f"CPU: {name}, the other threads, per model call p50",
                     "value": others * 1000, "unit": "us", "ratio": others / decoding,
                     "note": "the inference actor's: the stream read and checked"})
    return rows


def _sdk_rows(p50: dict[str, float], floor_ms: float) -> list[dict[str, Any]]:
    if "sdk" not in p50:
        return [{"name": "OpenAI Agents SDK", "value": None, "unit": "",
                 "note": "skipped: needs the bench extra (pip install -e '.[bench]')"}]
    return [
        {"name": "OpenAI Agents SDK run_streamed, per model call p50", "value": p50["sdk"],
         "unit": "ms", "ratio": p50["sdk"] / floor_ms, "note": "chat-completions model"},
        {"name": "loopd run_turn (fsync never) vs the SDK", "value": p50["never"] / p50["sdk"],
         "unit": "x", "note": "goal < 0.3x"},
        {"name": "loopd (fsync always) vs the SDK", "value": p50["always"] / p50["sdk"],
         "unit": "x"},
    ]  # fmt: skip


if __name__ == "__main__":
    for row in run():
        print(row)
