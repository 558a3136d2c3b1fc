"""A client key deleted from the host's allow directory is refused from its next connection.

Found by the attack review: the host re-read its ``--allow-keys`` directory only
when an unknown key knocked, so a removed key was still let in until something else made
it look. Now the directory is looked at (names, sizes, times) at every handshake and read
again when it changed. A connection already open stays open: ZAP checks a handshake.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from actors.tools.protocol import wire
from tests.support.curve_host import Remote, curve_host, curve_options, touch
from tests.tools.hostkit import ask, raw_dealer, recv


@pytest.fixture
def remote() -> Iterator[Remote]:
    with curve_host() as host:
        yield host


def test_a_removed_client_key_is_refused_from_its_next_connection(remote: Remote) -> None:
    with raw_dealer(remote.endpoint, **curve_options(remote, "friend")) as friend:
        assert ask(friend, touch(remote, "before"), timeout=30) == wire.Result(1, "touched")
    (remote.allowed / "friend.key").unlink()
    with raw_dealer(remote.endpoint, **curve_options(remote, "friend")) as friend:
        friend.send(wire.encode(touch(remote, "after")))
        assert recv(friend, timeout=1.0) is None
    assert not (remote.dir / "after").exists()
    assert "refused a client with unknown key" in (remote.dir / "host.log").read_text()


def test_a_key_file_rewritten_with_another_key_lets_in_only_the_new_one(remote: Remote) -> None:
    with raw_dealer(remote.endpoint, **curve_options(remote, "friend")) as friend:
        assert ask(friend, touch(remote, "friend-1"), timeout=30) == wire.Result(1, "touched")
    # the same file name, now holding the stranger's public key
    (remote.allowed / "friend.key").write_bytes((remote.keys / "stranger.key").read_bytes())
    with raw_dealer(remote.endpoint, **curve_options(remote, "friend")) as friend:
        friend.send(wire.encode(touch(remote, "friend-2")))
        assert recv(friend, timeout=1.0) is None
    with raw_dealer(remote.endpoint, **curve_options(remote, "stranger")) as stranger:
        assert ask(stranger, touch(remote, "stranger"), timeout=30) == wire.Result(1, "touched")
    assert not (remote.dir / "friend-2").exists()
