"""Record one live exchange with a real llama-server into the .http format.

    python -m scripts.record URL REQUEST.json OUT.http [--path /v1/chat/completions] [--append]

POSTs the JSON body in REQUEST.json to URL+path and writes the request and the response
(status, content type, body byte for byte as received, SSE events included) to OUT.http,
after the exchanges already there with --append. The recording is what tests and the fake
llama-server replay, so nothing is cleaned up or reformatted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

from actors.base.errors import RecordingError
from tests.support import recording

__all__ = ["main", "record"]


def record(url: str, body: bytes, *, path: str = "/v1/chat/completions",
           timeout_s: float = 600.0) -> recording.Exchange:
    """One POST to ``url + path`` with ``body``; the exchange as sent and received."""
    headers = (("Content-Type", "application/json"),)
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    with httpx.Client(timeout=timeout) as client, client.stream(
        "POST", url.rstrip("/") + path, content=body, headers=dict(headers)
    ) as response:
        raw = b"".join(response.iter_raw())  # undecoded: byte for byte as received
        reason = response.reason_phrase
        kind = response.headers.get("content-type", "")
    return recording.Exchange(
        recording.Request("POST", path, headers, body),
        recording.Response(response.status_code, reason, (("Content-Type", kind),), raw),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", help="the llama-server, e.g. http://127.0.0.1:8080")
    parser.add_argument("request", type=Path, help="a file holding the JSON request body")
    parser.add_argument("out", type=Path, help="the .http file to write")
    parser.add_argument("--path", default="/v1/chat/completions")
    parser.add_argument("--append", action="store_true", help="add to the exchanges in OUT")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    args = parser.parse_args(argv)
    try:
        body = json.loads(args.request.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"record: {args.request}: cannot read a JSON body: {e}", file=sys.stderr)
        return 2
    one_line = json.dumps(body, ensure_ascii=False).encode()  # the format wants one line
    try:
        exchange = record(args.url, one_line, path=args.path, timeout_s=args.timeout)
    except httpx.HTTPError as e:
        print(f"record: {args.url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    try:
        recording.save(args.out, [exchange], append=args.append)
    except RecordingError as e:
        print(f"record: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: HTTP {exchange.response.status}, {len(exchange.response.body)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
