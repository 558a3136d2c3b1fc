"""The entry of the session's last listing that "the third one" names."""

from __future__ import annotations

import json

from actors.log.records import Assistant, Record, ToolCall, ToolResult, User
from actors.session.smallmodel.last_listing import listed_entry
from actors.tools.protocol.spec import ResultClass


def _listing(call_id: str, name: str, arguments: dict[str, object], content: str) -> list[Record]:
    call = ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))
    return [Assistant(content=None, reasoning=None, tool_calls=(call,)),
            ToolResult(call=1, tool_call_id=call_id, content=content, class_=ResultClass.PUBLIC,
                       untrusted=False, truncated=False)]


def test_the_place_in_the_last_listing_names_its_entry_with_the_folder() -> None:
    top = _listing("a", "list_dir", {}, "access.log  280\napp.log  370\ncron.log  136\nold/")
    records = [User(content="Which files?"), *top]
    assert listed_entry(records, 3) == "cron.log"
    assert listed_entry(records, -1) == "old/"
    assert listed_entry(records, 5) is None and listed_entry(records, -5) is None
    inner = {"name": "list_dir", "arguments": {"path": "./letters"}}
    later = _listing("b", "call_tool", inner, "2024-01-15-landlord.txt  176\nbank.txt  190")
    assert listed_entry([*records, *later], 2) == "letters/bank.txt"  # the last
    read = _listing("c", "read_file", {"path": "a.txt"}, "x  1\ny  2")  # not a listing
    assert listed_entry([*records, *read], 2) == "app.log"


def test_no_listing_no_entry() -> None:
    assert listed_entry([User(content="hi")], 1) is None
