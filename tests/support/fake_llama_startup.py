"""A stand-in for llama-server's start-up, for the embedded server's lifecycle tests.

Run as a program with llama-server's command line. It records each invocation (argv, pid)
as a JSON line in ``$FAKE_LLAMA_DIR/runs.jsonl`` and behaves as ``$FAKE_LLAMA_MODE`` says:

- ``ok``: listens on ``--port``; ``/health`` answers 503 (loading) a few times, then 200.
- ``child``: like ``ok``, and starts a child process (its pid in the record) that lives on.
- ``stubborn``: like ``ok``, but ignores SIGTERM.
- ``loading``: ``/health`` answers 503 forever.
- ``exit``: prints an error and exits with status 3 before listening.
- ``crash``: dies of SIGILL unless ``--no-repack`` is given, then like ``ok``.
- ``bind``: the first run prints llama-server's bind error and exits 1; later runs are ``ok``.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str]) -> int:
    mode = os.environ.get("FAKE_LLAMA_MODE", "ok")
    out = Path(os.environ["FAKE_LLAMA_DIR"])
    record: dict[str, object] = {"argv": argv, "pid": os.getpid()}
    runs = out / "runs.jsonl"
    earlier = len(runs.read_text().splitlines()) if runs.exists() else 0
    if mode == "child":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        record["child"] = child.pid
    with runs.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print("fake llama-server: initializing ...", flush=True)
    if mode == "exit":
        print("error: failed to load model 'broken.gguf'", flush=True)
        return 3
    if mode == "crash" and "--no-repack" not in argv:
        signal.signal(signal.SIGILL, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGILL)
    if mode == "bind" and earlier == 0:
        print("E srv  start: couldn't bind HTTP server socket, hostname: 127.0.0.1", flush=True)
        return 1
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    port = int(argv[argv.index("--port") + 1])
    loading = {"n": 10**9 if mode == "loading" else 3}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/health":
                self.send_error(404)
                return
            loading["n"] -= 1
            ready = loading["n"] < 0
            body = (
                b'{"status":"ok"}'
                if ready
                else b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
            )
            self.send_response(200 if ready else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            print("request", format % args, flush=True)

    with http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        print(f"listening on http://127.0.0.1:{port}", flush=True)
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
