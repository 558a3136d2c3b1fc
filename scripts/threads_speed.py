"""Tokens per second of the embedded llama-server per ``embedded.threads``, alone and beside
a busy neighbour (a second llama-server generating without pause): what chose the default.
A measurement run by hand (minutes of real-model work), not a ``make bench`` part.

    python -m scripts.threads_speed [--threads 0 1 2 0/poll0] [--rounds 3] [--tokens 48]

A variant is a thread count (``-t``; 0: llama-server's own default, every core), with
``/poll0`` its worker threads sleep between graphs instead of polling (``--poll 0``).
Each round starts one server per variant in turn (the same model, one slot), sends a
fixed prompt with greedy sampling and a fixed number of generated tokens, and records
llama-server's own timings (prompt and generation tokens per second). Rounds interleave the
counts so that a change of the machine's load touches each count alike. The neighbour is
another llama-server of the same model on every core (``-t`` unset), kept generating by a
thread of this script for the "beside" half.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from actors.base.config import data_home
from actors.base.processes.tether import tethered
from actors.inference.embedded.model import DEFAULT_MODEL, MODELS, ensure_model
from actors.inference.embedded.server import free_port, server_binary

PROMPT = (
    "<|im_start|>user\nWrite a short story about a lighthouse keeper who finds a message "
    "in a bottle. Use plain words.<|im_end|>\n<|im_start|>assistant\n"
)


@contextlib.contextmanager
def _server(binary: Path, model: Path, variant: str) -> Iterator[str]:
    port = free_port()
    cmd = [str(binary), "-m", str(model), "-c", "2048", "-np", "1", "--host", "127.0.0.1",
           "--port", str(port), "--no-webui", "--temp", "0"]
    threads, _, poll = variant.partition("/")
    if int(threads) > 0:
        cmd += ["-t", threads]
    if poll:
        cmd += ["--poll", poll.removeprefix("poll")]
    proc = subprocess.Popen(tethered(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(trust_env=False, timeout=5) as c:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {proc.returncode}")
                with contextlib.suppress(httpx.TransportError):
                    if c.get(url + "/health").status_code == 200:
                        break
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _generate(url: str, tokens: int) -> tuple[float, float]:
    body = {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "seed": 7,
            "cache_prompt": False, "ignore_eos": True}
    r = httpx.post(url + "/completion", json=body, timeout=600, trust_env=False)
    r.raise_for_status()
    t = r.json()["timings"]
    return float(t["prompt_per_second"]), float(t["predicted_per_second"])


@contextlib.contextmanager
def _neighbour(binary: Path, model: Path) -> Iterator[None]:
    stop = threading.Event()
    with _server(binary, model, "0") as url:
        def busy() -> None:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    _generate(url, 64)

        worker = threading.Thread(target=busy, daemon=True)
        worker.start()
        try:
            yield
        finally:
            stop.set()
            worker.join(120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", nargs="+", default=["0", "1", "2", "0/poll0"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--where", nargs="+", default=["alone", "beside"])
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS),
                    help="the model measured (embedded.model); the neighbour runs the 0.5B")
    args = ap.parse_args()
    binary = server_binary()
    model = ensure_model(data_home(), model=MODELS[args.model])
    neighbour = ensure_model(data_home(), model=MODELS["0.5b"])
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for where in args.where:
            ctx = _neighbour(binary, neighbour) if where == "beside" else contextlib.nullcontext()
            with ctx:
                for n in args.threads:
                    with _server(binary, model, n) as url:
                        _generate(url, 4)  # warm-up
                        got = _generate(url, args.tokens)
                    results.setdefault((where, n), []).append(got)
                    load = os.getloadavg()[0]
                    print(f"round {r} {where:6} threads={n:7}: prompt {got[0]:.1f} t/s, "
                          f"generation {got[1]:.1f} t/s (load {load:.1f})", flush=True)
    print("\nmedians (prompt t/s, generation t/s):")
    for (where, n), got in sorted(results.items()):
        print(f"  {where:6} threads={n:7}: {statistics.median(g[0] for g in got):7.1f} "
              f"{statistics.median(g[1] for g in got):7.1f}  ({len(got)} rounds)")


if __name__ == "__main__":
    main()
