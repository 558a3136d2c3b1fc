"""Remote hosts: keys from `loopd keys`, and a CURVE host that only answers clients it knows."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from actors.base.errors import KeyFileError
from actors.tools.port import CurveClient, PortSettings, start_port
from actors.tools.protocol import wire
from actors.wire.curve import load_public, load_secret, main, write_keypair
from tests.support.curve_host import Remote, curve_host, curve_options, touch
from tests.tools.hostkit import ask, raw_dealer, recv


def test_keys_writes_a_pair_with_the_secret_file_private(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["host", "--dir", str(tmp_path)]) == 0
    public_file, secret_file = tmp_path / "host.key", tmp_path / "host.key_secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    public, secret = load_secret(secret_file)
    assert load_public(str(public_file)) == public
    assert load_public(public.decode()) == public
    assert len(secret) == 40
    assert public.decode() in capsys.readouterr().out
    assert main(["host", "--dir", str(tmp_path)]) == 2  # never overwrites by accident
    assert "already exists; pick another name or pass --force" in capsys.readouterr().err
    assert load_secret(secret_file) == (public, secret)


def test_a_secret_file_others_can_read_is_refused(tmp_path: Path) -> None:
    _, secret_file = write_keypair(tmp_path, "loose")
    secret_file.chmod(0o644)
    with pytest.raises(KeyFileError, match=r"can be read by others \(mode 644\); run: chmod 600"):
        load_secret(secret_file)


@pytest.mark.parametrize("text", ["not a key", "~" * 40, "/no/such/file.key"])
def test_a_bad_public_key_is_refused_with_what_was_expected(text: str) -> None:
    with pytest.raises(KeyFileError, match="40-character Z85"):
        load_public(text)


def test_the_public_file_is_not_taken_as_a_secret(tmp_path: Path) -> None:
    public_file, _ = write_keypair(tmp_path, "pub")
    public_file.chmod(0o600)
    with pytest.raises(KeyFileError, match="holds no secret key"):
        load_secret(public_file)


@pytest.fixture
def remote() -> Iterator[Remote]:
    with curve_host() as host:
        yield host


def test_a_known_client_is_served_through_the_port(remote: Remote) -> None:
    public, secret = load_secret(remote.keys / "friend.key_secret")
    curve = CurveClient(server_key=remote.server_key, public=public, secret=secret)
    port = start_port(
        PortSettings("far", remote.endpoint, 5.0, 0.5, curve=curve), context=zmq.Context.instance()
    )
    try:
        assert port.wait_ready(30)
        answer = port.call(
            session="s", call=1, tool="touch", arguments={"path": str(remote.dir / "friend-ran")}
        )
    finally:
        port.stop()
    assert answer == wire.Result(answer.id, "touched")
    assert (remote.dir / "friend-ran").read_text() == "ran"


def test_an_unknown_client_gets_no_answer_and_runs_nothing(remote: Remote) -> None:
    with raw_dealer(remote.endpoint, **curve_options(remote, "stranger")) as stranger:
        stranger.send(wire.encode(touch(remote, "stranger-ran")))
        assert recv(stranger, timeout=1.0) is None
    with raw_dealer(remote.endpoint) as plain:  # no CURVE at all
        plain.send(wire.encode(touch(remote, "plain-ran")))
        assert recv(plain, timeout=0.5) is None
    with raw_dealer(remote.endpoint, **curve_options(remote, "friend")) as friend:
        assert ask(friend, touch(remote, "friend-ran"), timeout=30) == wire.Result(1, "touched")
    # the host is up and served a known client after the strangers: they ran nothing
    assert (remote.dir / "friend-ran").exists()
    assert not (remote.dir / "stranger-ran").exists()
    assert not (remote.dir / "plain-ran").exists()
    assert "refused a client with unknown key" in (remote.dir / "host.log").read_text()


def test_a_client_key_added_to_the_directory_is_let_in_without_a_restart(remote: Remote) -> None:
    with raw_dealer(remote.endpoint, **curve_options(remote, "stranger")) as stranger:
        stranger.send(wire.encode(wire.Ping()))
        assert recv(stranger, timeout=1.0) is None
    shutil.copy(remote.keys / "stranger.key", remote.allowed)  # read again at the next knock
    with raw_dealer(remote.endpoint, **curve_options(remote, "stranger")) as stranger:
        assert ask(stranger, touch(remote, "now-known"), timeout=30) == wire.Result(1, "touched")
