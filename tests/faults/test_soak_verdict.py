"""``make soak``'s verdict (scripts/soak.py) on made-up samples of an hour: a descriptor
count that follows the work in flight is not growth, a rise is."""

from __future__ import annotations

from scripts import soak
from scripts.soak import MIB, Sample


def _hour(rss: list[float], fds: list[int]) -> list[Sample]:
    step = soak.SECONDS / (len(rss) - 1)
    return [Sample(i * step, int(r * MIB), f, 30, 100 * MIB, i * 1000, 0)
            for i, (r, f) in enumerate(zip(rss, fds, strict=True))]


def test_the_verdict_tells_noise_from_growth() -> None:
    flat_rss = [60.0] * 61
    noisy = [77 + (i * 7) % 9 for i in range(61)]  # 77 to 85, in no order
    noisy[55] = 89  # one sample while many requests were in flight
    assert soak.verdict(_hour(flat_rss, noisy)) == []
    rising = [80 + i // 3 for i in range(61)]
    assert [g.split()[0] for g in soak.verdict(_hour(flat_rss, rising))] == ["fds"]
    leaking = [60.0 + i * 0.5 for i in range(61)]
    assert [g.split()[0] for g in soak.verdict(_hour(leaking, noisy))] == ["daemon"]
