"""actors/tools/search.py: find_tool's ranking, on its own (pure: specs and words in, text out)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.tools.protocol.spec import ToolSpec
from actors.tools.search import find, finds_any

OBJECT = {"type": "object", "properties": {"path": {"type": "string"}}}


def spec(name: str, description: str, **policy: bool) -> ToolSpec:
    return ToolSpec(name=name, description=description, parameters=OBJECT, **policy)


TOOLS = [
    spec("read_file", "Read a text file of the workspace."),
    spec("list_dir", "List the entries of a directory."),
    spec("write_file", "Write a text file in the workspace.", needs_approval=True),
    spec("fetch_url", "Fetch a web page over http.", untrusted=True),
    spec("run_command", "Run a shell command in the workspace.", needs_approval=True),
    spec("getCurrentTime", "The current time in a time zone."),
]


def names(answer: str) -> list[str]:
    """The tool names an answer lists, in order."""
    return [line[2:].split(":", 1)[0] for line in answer.splitlines() if line.startswith("- ")]


def test_no_host_connected_says_so() -> None:
    assert find([], "read a file") == (
        "No tools are available right now: no tool host is connected."
    )


def test_a_name_word_outranks_a_description_word() -> None:
    tools = [spec("open_thing", "Opens a file."), spec("file_reader", "Reads it.")]
    answer = find(tools, "file")
    assert names(answer) == ["file_reader", "open_thing"]
    assert answer.startswith("Tools matching 'file', best first:")


def test_the_exact_name_comes_first() -> None:
    assert names(find(TOOLS, "list dir"))[0] == "list_dir"
    assert names(find(TOOLS, "run_command"))[0] == "run_command"


def test_related_endings_match_and_stop_words_do_not() -> None:
    # "files" is related to "file", "directories" to "directory"; "the", "a", "tool" count for
    # nothing, so a query of only those lists everything instead
    assert "read_file" in names(find(TOOLS, "files"))
    assert names(find(TOOLS, "directories"))[0] == "list_dir"
    assert find(TOOLS, "the a tool please").startswith("All 6 tools (ask with a few words")


def test_camel_case_names_are_split_into_words() -> None:
    assert names(find(TOOLS, "current time"))[0] == "getCurrentTime"


def test_weak_tails_are_dropped() -> None:
    """Only tools scoring at least a quarter of the best are shown."""
    answer = names(find(TOOLS, "fetch web page"))
    assert answer == ["fetch_url"]


def test_the_limit_holds() -> None:
    many = [spec(f"tool_{i}", "Does a thing with files.") for i in range(30)]
    assert len(names(find(many, "files", limit=5))) == 5
    assert len(names(find(many, "files", limit=12))) == 12


def test_no_match_names_the_tools_and_says_what_to_do() -> None:
    answer = find(TOOLS, "xylophone")
    assert answer.startswith("No tool matches 'xylophone'. The tools are: read_file, list_dir,")
    assert "call_tool with one of these names" in answer


def test_an_empty_query_lists_at_least_twenty() -> None:
    many = [spec(f"t{i}", "d") for i in range(25)]
    answer = find(many, "")
    assert answer.startswith("20 tools (ask with a few words to narrow it down):")
    assert len(names(answer)) == 20
    assert find(many[:3], "").startswith("All 3 tools")


def test_each_match_shows_its_schema_and_policy() -> None:
    answer = find(TOOLS, "write file")
    lines = answer.splitlines()
    at = lines.index("- write_file: Write a text file in the workspace. (needs approval)")
    assert json.loads(lines[at + 1].removeprefix("  arguments: ")) == OBJECT
    assert lines[-1] == 'Run one with call_tool(name="...", arguments={...}).'
    fetch = find(TOOLS, "fetch")
    assert "- fetch_url: Fetch a web page over http. (its results come from outside" in fetch


def test_ties_keep_the_hosts_order() -> None:
    twins = [spec("alpha_one", "Same words."), spec("alpha_two", "Same words.")]
    assert names(find(twins, "same words")) == ["alpha_one", "alpha_two"]
    assert names(find(list(reversed(twins)), "same words")) == ["alpha_two", "alpha_one"]


@given(st.text(max_size=200))
def test_any_query_gets_an_answer_naming_only_real_tools(query: str) -> None:
    answer = find(TOOLS, query)
    assert set(names(answer)) <= {t.name for t in TOOLS}
    assert answer.strip()


@pytest.mark.parametrize("query", ["READ FILE", "Read-File", "read_file!"])
def test_case_and_punctuation_do_not_matter(query: str) -> None:
    assert names(find(TOOLS, query))[0] == "read_file"


def test_a_question_finds_a_tool_only_by_a_word_that_says_something() -> None:
    from actors.tools.protocol.standard_specs import STANDARD_SPECS

    specs = list(STANDARD_SPECS.values())
    # "are" is in read_file's description ("Long files are cut"): the embedded model looked
    # a tool up for these and answered with find_tool's "No tool matches ..."
    for question in ("How many days are in a week?", "How many months are in a year?",
                     "Who are you?", "How are you?"):
        assert not finds_any(specs, question), question
    assert finds_any(specs, "Which files are in the folder?")
    assert finds_any(specs, "Run the command ls.")
