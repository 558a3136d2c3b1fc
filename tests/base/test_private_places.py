"""loopd's own places, which the tool hosts hide from the sandbox and the file tools."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from actors.base.config import load, parse
from actors.base.private_places import private_places


def test_every_place_the_config_names(tmp_path: Path) -> None:
    """Wherever the config puts them: the daemon's runtime directory and an ipc endpoint,
    the logs, the embedded data, the save directory, the rules file, the keys."""
    config = parse({
        "daemon": {"runtime_dir": str(tmp_path / "run"), "curve_secret": "~/k/d.key_secret",
                   "allow_keys": str(tmp_path / "allowed")},
        "log": {"dir": str(tmp_path / "logs")},
        "slots": {"save_dir": str(tmp_path / "slots")},
        "embedded": {"data_dir": str(tmp_path / "data")},
        "tools": {"rules_file": str(tmp_path / "rules.toml"),
                  "hosts": [{"name": "far", "kind": "remote", "endpoint": "tcp://h:1",
                             "server_key": "x.key", "client_key": str(tmp_path / "me.ks")}]},
    })
    places = set(private_places(config))
    assert {str(tmp_path / n) for n in ("run", "allowed", "logs", "slots", "data",
                                        "rules.toml", "me.ks")} <= places
    assert os.path.expanduser("~/k/d.key_secret") in places
    assert tempfile.gettempdir() in places  # every loopd's tool hosts' sockets
    ipc = parse({"daemon": {"endpoint": "ipc:///srv/loopd/d.sock"}})
    assert "/srv/loopd" in private_places(ipc)


def test_the_config_file_read_is_hidden(tmp_path: Path) -> None:
    """An inference.api_key may be in it: the tools must not read it, wherever it is."""
    path = tmp_path / "ws" / "my.toml"
    path.parent.mkdir()
    path.write_text('[inference]\napi_key = "sk-secret"\n')
    config = load(path)
    assert str(path) in private_places(config)
    assert str(path) in private_places(parse({}))  # this process read it
