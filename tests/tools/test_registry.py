"""Registry and dispatch, over real ports to scripted hosts on inproc://."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from actors.tools.port import PortSettings, ToolPort, start_port
from actors.tools.protocol.spec import ToolSpec
from actors.tools.registry import META_TOOLS, Local, Registry, Remote, baseline_tools, dispatch
from tests.support.watch import HANG_S
from tests.tools.fake_host import FakeHost

_n = itertools.count()


def _spec(name: str, description: str, **props: Any) -> ToolSpec:
    schema = {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }
    return ToolSpec(name, description, schema)


FILES = (
    _spec("read_file", "Read a text file in the workspace.", path={"type": "string"}),
    _spec("list_dir", "List the entries of a directory.", path={"type": "string"}),
    _spec(
        "write_file", "Write text to a file.", path={"type": "string"}, content={"type": "string"}
    ),
)
WEB = (
    _spec("fetch_url", "Fetch a web page over http.", url={"type": "string"}),
    _spec("read_file", "A second read_file, offered qualified by host.", path={"type": "string"}),
)


Hosts = tuple[Registry, ToolPort, ToolPort]


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    """Two hosts (files, net) and the registry of their ports."""
    ctx: zmq.Context[Any] = zmq.Context()
    ports: list[ToolPort] = []
    try:
        with contextlib.ExitStack() as stack:
            for name, tools in (("files", FILES), ("net", WEB)):
                endpoint = f"inproc://registry-{next(_n)}"
                stack.enter_context(FakeHost(ctx, endpoint, tools=tools))
                ports.append(start_port(PortSettings(name, endpoint, 5.0, 0.5), context=ctx))
            for port in ports:
                assert port.wait_ready(HANG_S)
            yield Registry(ports), ports[0], ports[1]
    finally:
        for port in ports:
            port.stop()
        ctx.destroy(linger=0)


def test_the_first_host_keeps_a_name_a_later_one_offers_it_qualified(hosts: Hosts) -> None:
    registry, files, web = hosts
    assert [s.name for s in registry.specs()] == [
        "read_file",
        "list_dir",
        "write_file",
        "fetch_url",
        "net__read_file",
    ]
    assert registry.entry("read_file") == (registry.spec("read_file"), files)
    assert registry.entry("fetch_url") == (registry.spec("fetch_url"), web)
    assert registry.entry("net__read_file") == (registry.spec("net__read_file"), web)
    assert registry.host_name("net__read_file") == "read_file"
    assert [r.notice() for r in registry.renamed()] == [
        "tool read_file of host net is offered as net__read_file: host files also has a tool "
        "named read_file and keeps that name"
    ]
    assert registry.entry("nope") is None
    called = dispatch(registry, "net__read_file", '{"path": "a.txt"}')
    assert isinstance(called, Remote) and (called.port, called.tool) == (web, "read_file")


def test_find_ranks_by_name_and_description_and_shows_schemas(hosts: Hosts) -> None:
    registry, _, _ = hosts
    text = registry.find("read a file")
    assert text.splitlines()[1].startswith("- read_file: Read a text file in the workspace.")
    assert '"path": {"type": "string"}' in text
    assert "fetch_url" not in text
    assert registry.find("download web page").splitlines()[1].startswith("- fetch_url:")
    assert registry.find("directory listing").splitlines()[1].startswith("- list_dir:")


def test_find_with_no_match_lists_the_tools_and_an_empty_query_lists_all(hosts: Hosts) -> None:
    registry, _, _ = hosts
    assert (
        "No tool matches 'quantum chemistry'. The tools are: read_file, list_dir"
        in registry.find("quantum chemistry")
    )
    listing = registry.find("")
    assert listing.startswith("All 5 tools")
    assert all(f"- {n}:" in listing for n in ("read_file", "list_dir", "write_file", "fetch_url"))


def test_find_with_no_hosts_says_so() -> None:
    assert "no tool host is connected" in Registry([]).find("read")


def test_find_tool_dispatches_locally(hosts: Hosts) -> None:
    registry, _, _ = hosts
    result = dispatch(registry, "find_tool", '{"query": "fetch a web page"}')
    assert isinstance(result, Local)
    assert "- fetch_url:" in result.text


@pytest.mark.parametrize(
    "arguments",
    [
        '{"name": "read_file", "arguments": {"path": "a.txt"}}',
        '{"name": "read_file", "arguments": "{\\"path\\": \\"a.txt\\"}"}',  # a JSON string
        '{"name": "read_file", "path": "a.txt"}',  # arguments next to the name
    ],
)
def test_call_tool_goes_to_the_port_of_the_host_offering_it(hosts: Hosts, arguments: str) -> None:
    registry, files, _ = hosts
    expected = Remote(files, "read_file", {"path": "a.txt"})
    assert dispatch(registry, "call_tool", arguments) == expected


def test_a_known_tool_called_by_its_own_name_goes_to_its_port(hosts: Hosts) -> None:
    registry, _, web = hosts
    assert dispatch(registry, "fetch_url", '{"url": "http://x"}') == Remote(
        web, "fetch_url", {"url": "http://x"}
    )


def _rf(arguments: str) -> str:
    return '{"name": "read_file", "arguments": %s}' % arguments  # noqa: UP031


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("call_tool", '{"name": "reed_file", "arguments": {}}',
         "There is no tool named 'reed_file'. Similar tools: read_file, write_file, "
         "net__read_file."),
        ("frobnicate", "{}", "There is no tool named 'frobnicate'. Use find_tool"),
        ("call_tool", _rf('{"path": 3}'), "at path: 3 is not of type 'string'"),
        ("call_tool", _rf("{}"), "'path' is a required property"),
        ("call_tool", _rf('{"path": "a", "x": 1}'), "Additional properties are not allowed"),
        ("call_tool", _rf('"{path: a}"'), "The arguments of read_file are not valid JSON"),
        ("call_tool", _rf("[1]"), "must be an object with read_file's arguments, not an array"),
        ("call_tool", '{"arguments": {}}', 'call_tool needs "name"'),
        ("call_tool", "{not json", "The arguments of call_tool are not valid JSON"),
        ("call_tool", '["read_file"]', "must be a JSON object (name: value pairs in braces)"),
        ("find_tool", '{"query": 3}', 'find_tool needs "query"'),
        ("call_tool", '{"name": "call_tool", "arguments": {}}', "call_tool cannot call itself"),
    ],
)  # fmt: skip
def test_bad_calls_come_back_as_text_the_model_can_act_on(
    hosts: Hosts, name: str, arguments: str, says: str
) -> None:
    registry, _, _ = hosts
    result = dispatch(registry, name, arguments)
    assert isinstance(result, Local)
    assert says in result.text


def test_a_schema_violation_shows_the_schema(hosts: Hosts) -> None:
    registry, _, _ = hosts
    result = dispatch(registry, "call_tool", '{"name": "read_file", "arguments": {"path": 3}}')
    assert isinstance(result, Local)
    assert json.dumps(FILES[0].parameters, sort_keys=True) in result.text


def test_empty_arguments_count_as_an_empty_object(hosts: Hosts) -> None:
    registry, _, _ = hosts
    result = dispatch(registry, "find_tool", "")
    assert isinstance(result, Local)
    assert result.text.startswith("All 5 tools")


def test_the_baseline_is_the_meta_tools_plus_the_pinned_ones_that_exist(hosts: Hosts) -> None:
    registry, _, _ = hosts
    tools = baseline_tools(registry, ["fetch_url", "not_there", "fetch_url"])
    assert list(tools[:2]) == list(META_TOOLS)
    assert [t["function"]["name"] for t in tools] == ["find_tool", "call_tool", "fetch_url"]
    assert tools[2]["function"]["parameters"] == WEB[0].parameters
    assert baseline_tools(FILES, []) == META_TOOLS
    json.dumps(tools)  # plain JSON data, as the log and the server need
