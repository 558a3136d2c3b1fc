"""An MCP server's authorization and elicitation: headers and bearer tokens from the
environment or a file (never on a command line or in a log), OAuth tokens kept private, and
``tools.elicitation`` answering a server's questions when nobody can be asked.

The OAuth flows themselves run against the official conformance suite's authorization
servers (tests/mcp_conformance).
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytest.importorskip("mcp", reason="needs the MCP SDK (the test extra installs it)")

from mcp.shared.auth import OAuthToken

from actors.base.config import Config, HostConfig
from actors.base.errors import ConfigError, McpError
from actors.base.private_places import private_places
from actors.tools.protocol import wire
from actors.tools.providers.mcp import McpProvider
from actors.tools.providers.mcp_auth import TokenFile
from actors.tools.providers.mcp_settings import McpAuth, resolve
from actors.tools.toolbox import Toolbox, token_file
from tests.support.watch import HANG_S
from tests.tools.hostkit import short_dir
from tests.tools.mcp_support import TEST_SERVER, http_test_server

TOKEN = "s3cret-token-7f1c"  # what must never show outside the request
CALL_S = 60.0


@pytest.fixture
def guarded_server() -> Iterator[str]:
    """The test server over HTTP, refusing requests without the token and X-Team: blue."""
    with http_test_server("--token", TOKEN) as url:
        yield url


def test_a_bearer_token_and_headers_from_the_environment_and_a_file_reach_the_server(
    guarded_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_MCP_TOKEN", TOKEN)
    with short_dir() as d:
        (d / "team").write_text("blue\n")
        host = HostConfig(name="guarded", kind="mcp", url=guarded_server,
                          bearer="env:TEST_MCP_TOKEN", headers=(f"X-Team: file:{d / 'team'}",))
        config = Config().replace("tools", workspace=str(d), standard=False, hosts=(host,),
                                  start_timeout_s=HANG_S, allow=("echo",))
        with Toolbox.start(config) as box:
            assert box.problems == {}
            entry = box.registry.entry("echo")
            assert entry is not None
            answer = entry[1].call(session="s", call=1, tool="echo", arguments={"text": "in"})
            assert answer == wire.Result(answer.id, "in")
            pid = box.status()["guarded"].pid
            assert pid is not None
            argv = " ".join(psutil.Process(pid).cmdline())
            log = (box.run_dir / "guarded.log").read_text(errors="replace")
            assert "TEST_MCP_TOKEN" not in argv and TOKEN not in argv  # the env holds it
            assert TOKEN not in log


def test_without_its_token_the_server_refuses_and_the_entry_is_named(guarded_server: str) -> None:
    with pytest.raises(McpError, match=r"answered HTTP 401 Unauthorized.*bearer = "):
        McpProvider(url=guarded_server, connect_timeout_s=CALL_S,
                    auth=McpAuth(headers=("X-Team: blue",)))


@pytest.mark.parametrize(
    ("mode", "said"),
    [("defaults", "hello Ada"), ("decline", "nobody to greet (decline)"),
     ("ask", "nobody to greet (decline)")],  # a tool host has nobody to ask
)
def test_tools_elicitation_answers_a_servers_question(mode: str, said: str) -> None:
    with McpProvider([sys.executable, str(TEST_SERVER)], elicitation=mode,  # type: ignore[arg-type]
                     connect_timeout_s=CALL_S) as provider:
        answer = provider.run("greet", {}, CALL_S, threading.Event())
    assert isinstance(answer, wire.Result) and answer.content == said


def test_references_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(McpError, match="names the environment variable NO_SUCH_VAR_X, which is"):
        resolve("env:NO_SUCH_VAR_X", "bearer")
    with pytest.raises(McpError, match=r"names the file .*nope, which cannot be read"):
        resolve(f"file:{tmp_path / 'nope'}", "bearer")
    assert resolve("plain", "bearer") == "plain"
    with pytest.raises(McpError, match='must be written "Name: value"'):
        McpAuth(headers=("no colon here",)).header_values("x")
    auth = McpAuth(headers=("X-A: 1",), bearer="tok", oauth="authorization_code", scopes=("a",))
    assert McpAuth.from_json(auth.to_json()) == auth


def test_authorization_keys_are_refused_where_they_cannot_apply() -> None:
    host = HostConfig(name="t", kind="mcp", command=("x",), bearer="env:T")
    with pytest.raises(ConfigError, match="headers, bearer and oauth are for an mcp host with a"):
        Config().replace("tools", hosts=(host,))


def test_oauth_tokens_are_kept_0600_in_a_private_place(tmp_path: Path) -> None:
    config = Config().replace("embedded", data_dir=str(tmp_path / "data"))
    path = token_file(config, "tracker")
    assert any(path.is_relative_to(p) for p in private_places(config))  # hidden from the sandbox
    store = TokenFile(str(path))
    asyncio.run(store.set_tokens(OAuthToken(access_token="abc", refresh_token="r")))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = asyncio.run(TokenFile(str(path)).get_tokens())
    assert again is not None and again.access_token == "abc"
    assert os.listdir(path.parent) == ["tracker.json"]  # no temporary file left


def test_an_authorization_url_is_a_status_line_and_an_event_of_its_own() -> None:
    from actors.session.world import _authorization_needed

    said: list[str] = []
    _authorization_needed(said.append)("tracker", "https://as.example/authorize?x=1")
    assert said == ["tool host tracker: its MCP server needs your authorization: open "
                    "https://as.example/authorize?x=1"]
    assert said[0].event == {  # type: ignore[attr-defined]  # what --json prints
        "event": "authorization_needed", "host": "tracker",
        "url": "https://as.example/authorize?x=1",
    }
