"""actors/wire/peer_guard.py: routing ids nobody can guess, and the descriptor limit raised.

Each check runs in a fresh interpreter: C ``rand()`` and the descriptor limit belong to the
process, and the point is what a fresh daemon or tool host would do.
"""

from __future__ import annotations

import resource
import subprocess
import sys

from actors.wire.peer_guard import new_routing_id, short
from tests.daemon.daemonkit import ROOT, env

# The first id a fresh process's ROUTER gives a peer that brings none.
_FIRST_ID = """
import sys, zmq
from actors.wire.peer_guard import seed_router_ids
if sys.argv[1] == "seeded":
    seed_router_ids()
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)
port = router.bind_to_random_port("tcp://127.0.0.1")
dealer = ctx.socket(zmq.DEALER)
dealer.connect(f"tcp://127.0.0.1:{port}")
dealer.send(b"hello")
assert router.poll(10000)
print(router.recv_multipart()[0].hex())
ctx.destroy(linger=0)
"""


def _first_id(mode: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_ID, mode], cwd=ROOT, env=env(), capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.strip()


def test_unseeded_libzmq_names_the_first_peer_the_same_in_every_process() -> None:
    """The evidence: libzmq never seeds rand(), so its counted ids are known in advance."""
    assert _first_id("plain") == _first_id("plain") == "006b8b4567"


def test_after_seeding_nobody_can_tell_the_first_id() -> None:
    ids = {_first_id("seeded") for _ in range(3)}
    assert "006b8b4567" not in ids
    assert len(ids) == 3
    assert all(len(i) == 10 and i.startswith("00") for i in ids)  # still libzmq's own form


def test_our_ids_are_random_and_never_of_the_counted_form() -> None:
    ids = [new_routing_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 16 and i[0] != 0 for i in ids)


def test_logs_show_a_prefix_too_short_to_claim() -> None:
    peer = new_routing_id()
    assert short(peer) == peer[:4].hex()


_LIMIT = """
import resource
from actors.wire.peer_guard import raise_fd_limit
print(raise_fd_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))

    out = subprocess.run(
        [sys.executable, "-c", _LIMIT], cwd=ROOT, env=env(), capture_output=True, text=True,
        check=True, timeout=60, preexec_fn=lower,
    )  # fmt: skip
    said, soft, now_hard = (int(x) for x in out.stdout.split())
    assert soft == now_hard == hard or hard == resource.RLIM_INFINITY
    assert said == soft
