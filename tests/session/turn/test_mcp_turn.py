"""A turn whose tools come from a real MCP server (mcp-server-time, from PyPI).

The model (scripted) finds the server's tools with find_tool and runs one with call_tool;
the MCP server's answer reaches the log as the ToolResult, marked trusted or not as the tool's
annotations say, and the next request carries it to the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from actors.log.records import ToolResult
from actors.tools.registry import Registry
from tests.support.fake_llama import answer
from tests.support.turn_rig import Rig

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'loopd[mcp]'")
pytest.importorskip("mcp_server_time", reason="needs mcp-server-time (the test extra)")

from tests.tools.mcp_support import TIME_SERVER, mcp_port


def test_find_tool_and_call_tool_reach_an_mcp_server_and_its_answer_the_log(
    rig: Callable[..., Rig],
) -> None:
    find = ("find_tool", json.dumps({"query": "current time in a timezone"}))
    call = ("call_tool", json.dumps(
        {"name": "get_current_time", "arguments": {"timezone": "Europe/Paris"}}))
    with mcp_port(command=TIME_SERVER, name="time") as port:
        spec = next(s for s in port.specs() if s.name == "get_current_time")
        r = rig([answer(tool_calls=[find]), answer(tool_calls=[call]),
                 answer("It is morning in Paris.")], Registry([port]))
        outcome = r.turn("What time is it in Paris?")
    assert outcome.content == "It is morning in Paris."
    found, ran = [x for x in r.records if isinstance(x, ToolResult)]
    assert "get_current_time" in found.content  # find_tool listed the MCP server's tool
    assert "Europe/Paris" in ran.content and "datetime" in ran.content  # the server's answer
    assert ran.untrusted == spec.untrusted  # as the server's annotations say (closed world)
    assert r.fake.requests[-1]["messages"][-1]["content"] == ran.content
