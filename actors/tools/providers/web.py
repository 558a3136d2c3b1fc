"""``fetch_url``: a web page or file over http or https, as text for the model.

Its own module so the web's rules (what may be fetched, how long a download may run) live
in one place; :class:`~actors.tools.providers.standard.StandardTools` calls :func:`fetch_url`.
"""

from __future__ import annotations

import threading

from actors.tools.protocol.wire import Answer, Failed, Result

__all__ = ["fetch_url"]


def fetch_url(url: str, *, timeout_s: float, max_output: int, cancel: threading.Event) -> Answer:
    """GET ``url`` and answer its status, content type and text (cut at ``max_output`` bytes)."""
    import httpx  # slow to import: only hosts that fetch pay for it

    if not url.startswith(("http://", "https://")):
        return Failed(message=f"fetch_url: {url!r} is not an http:// or https:// URL")
    try:
        with (
            httpx.Client(follow_redirects=True, max_redirects=5, timeout=timeout_s) as client,
            client.stream("GET", url, headers={"user-agent": "loopd-fetch_url"}) as r,
        ):
            data = bytearray()
            dropped = 0
            for chunk in r.iter_bytes():
                keep = max(0, max_output - len(data))
                data += chunk[:keep]
                dropped += len(chunk) - len(chunk[:keep])
            text = bytes(data).decode(r.encoding or "utf-8", "replace")
            kind = r.headers.get("content-type", "")
            head = f"HTTP {r.status_code} {r.reason_phrase}\ncontent-type: {kind}"
            note = f"\n[cut: {dropped} more bytes not shown]" if dropped else ""
            return Result(content=f"{head}\n\n{text}{note}", untrusted=True)
    except httpx.HTTPError as e:
        return Failed(message=f"fetch_url could not fetch {url}: {type(e).__name__}: {e}")
