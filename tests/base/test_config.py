"""Config: defaults, partial files, and every bad value refused with its key."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from actors.base import config as cfg
from actors.base.config import Config, HostConfig, load, parse
from actors.base.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TOP = {f.name: type(getattr(Config(), f.name)) for f in dataclasses.fields(Config)}


def _is_table(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


# every section, sub-tables such as [tools.shell] included, by its dotted name
SECTIONS: dict[str, type] = {
    **TOP,
    **{
        f"{name}.{key}": kind
        for name, cls in TOP.items()
        for key, kind in typing.get_type_hints(cls).items()
        if _is_table(kind)
    },
}


def keys() -> list[tuple[str, str, Any, cfg.Allowed]]:
    """(section, key, type, what it allows) of every scalar key of every section."""
    out = []
    for section, cls in SECTIONS.items():
        kinds = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not _is_table(kinds[f.name]):  # a sub-table: its keys are listed as its own
                out.append((section, f.name, kinds[f.name], cfg.allowed(f)))
    return out


def nest(section: str, table: dict[str, Any]) -> dict[str, Any]:
    """``{"tools": {"shell": table}}`` for section "tools.shell"."""
    for name in reversed(section.split(".")):
        table = {name: table}
    return table


def documented(data: dict[str, Any], section: str) -> dict[str, Any]:
    for name in section.split("."):
        data = data.get(name, {})
    return data


def bad_values(kind: Any, rule: cfg.Allowed) -> list[Any]:
    if rule.auto is not None and kind in (int, float):
        return ["bogus", True, rule.high * 2]  # a word not "auto", not a number, too large
    if rule.auto is not None:
        return ["bogus", 1, True]  # a word the file does not know, or not a word at all
    if typing.get_origin(kind) is Literal:
        return ["bogus", 1]
    table: dict[Any, list[Any]] = {
        str: [1, ["x"], True],
        int: ["1", 1.5, True],
        float: ["1", True],
        bool: ["yes", 1],
        tuple[str, ...]: ["x", [1], {"a": "b"}],
        tuple[HostConfig, ...]: ["x", [5]],
    }
    return table[kind]


def as_written(kind: Any, rule: cfg.Allowed, value: Any) -> Any:
    """A key's default as a file writes it."""
    if rule.auto is not None:
        return "auto"
    return list(value) if isinstance(value, tuple) else value


def test_defaults_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPD_CONFIG", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    config = load()
    assert config == Config()
    assert config.log.fsync == "always"
    assert config.loop.tool_iterations == 16
    assert config.log_dir == Path("~/.local/share/loopd/sessions").expanduser()
    assert config.embedded.data_path == Path("~/.local/share/loopd").expanduser()


def test_the_data_places_follow_xdg_data_home_unless_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    config = Config()
    assert config.log_dir == tmp_path / "loopd" / "sessions"
    assert config.embedded.data_path == tmp_path / "loopd"
    chosen = config.replace("log", dir="~/logs").replace("embedded", data_dir="~/data")
    assert chosen.log_dir == Path("~/logs").expanduser()
    assert chosen.embedded.data_path == Path("~/data").expanduser()


def test_the_documented_file_holds_every_key_with_its_default() -> None:
    path = ROOT / "config" / "loopd.toml"
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert load(path) == Config()
    missing = [
        f"{section}.{key}"
        for section, key, _, _ in keys()
        if key != "hosts" and key not in documented(data, section)
    ]
    assert missing == [], f"keys not documented in config/loopd.toml: {missing}"


def test_partial_file_changes_only_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "loopd.toml"
    path.write_text('[loop]\ntool_iterations = 3\n[log]\nfsync = "never"\n', encoding="utf-8")
    config = load(path)
    assert config.loop == dataclasses.replace(Config().loop, tool_iterations=3)
    assert config.log.fsync == "never"
    assert config.inference == Config().inference
    assert config.tools == Config().tools


def test_loopd_config_env_and_explicit_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / "env.toml"
    env_file.write_text("[slots]\ndisk_mb = 2\n", encoding="utf-8")
    arg_file = tmp_path / "arg.toml"
    arg_file.write_text("[slots]\ndisk_mb = 5\n", encoding="utf-8")
    monkeypatch.setenv("LOOPD_CONFIG", str(env_file))
    assert load().slots.disk_mb == 2
    assert load(arg_file).slots.disk_mb == 5  # an explicit path wins over the environment
    monkeypatch.setenv("LOOPD_CONFIG", "")
    assert load() == Config()


def test_missing_and_invalid_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope\.toml does not exist"):
        load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[loop\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.toml is not valid TOML"):
        load(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("[loop]\nmax_tokens = 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"wrong\.toml: loop\.max_tokens = 0: must be at least 1"):
        load(wrong)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [(s, k, v) for s, k, kind, rule in keys() for v in bad_values(kind, rule)],
)
def test_every_bad_value_is_refused_with_its_key(section: str, key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse(nest(section, {key: value}))
    assert f"{section}.{key}" in str(info.value)


def test_literal_errors_list_what_is_allowed() -> None:
    expected = r"log\.fsync = 'sometimes': allowed values are always, turn, never"
    with pytest.raises(ConfigError, match=expected):
        parse({"log": {"fsync": "sometimes"}})


MINIMUM = {f"{s}.{k}": (kind, rule.low) for s, k, kind, rule in keys() if rule.low is not None}


def test_the_minimums_are_the_ones_the_code_was_written_for() -> None:
    assert len(MINIMUM) == 57  # a limit lost in a change shows here
    assert MINIMUM["tools.approval_timeout_s"] == (float, 0)  # 0: wait as long as it takes
    assert MINIMUM["embedded.ctx_size"] == (int, 512)
    assert MINIMUM["telemetry.export_timeout_s"] == (float, 0.01)


@pytest.mark.parametrize("key", sorted(MINIMUM))
def test_values_below_the_minimum_are_refused(key: str) -> None:
    section, name = key.rsplit(".", 1)
    kind, low = MINIMUM[key]
    assert low is not None
    too_small = low - 1 if kind is int else low / 2 if low > 0 else low - 0.5
    with pytest.raises(ConfigError, match=rf"^{key} = .*: must be at least"):
        parse(nest(section, {name: too_small}))
    at_minimum: Any = parse(nest(section, {name: int(low) if kind is int else low}))
    for part in section.split("."):
        at_minimum = getattr(at_minimum, part)
    assert getattr(at_minimum, name) == low


def test_port_above_65535_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"embedded\.port = 70000: must be a port number"):
        parse({"embedded": {"port": 70000}})


def test_unknown_sections_and_keys_are_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown section\(s\) lop; known: inference"):
        parse({"lop": {}})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in \[loop\]: tool_iteration; known"):
        parse({"loop": {"tool_iteration": 3}})
    with pytest.raises(ConfigError, match=r"\[loop\] must be a table"):
        parse({"loop": 3})


def test_ints_are_accepted_for_float_keys() -> None:
    config = parse({"tools": {"timeout_s": 5}})
    assert config.tools.timeout_s == 5.0
    assert isinstance(config.tools.timeout_s, float)


def test_hosts() -> None:
    config = parse(
        {
            "tools": {
                "hosts": [
                    {"name": "files2", "tools": ["read_file"]},
                    {"name": "t", "kind": "mcp", "command": "python -m 'my server'"},
                    {"name": "r", "kind": "remote", "endpoint": "tcp://h:1", "server_key": "k"},
                ]
            }
        }
    )
    assert config.tools.hosts[0] == HostConfig(name="files2", tools=("read_file",))
    assert config.tools.hosts[1].command == ("python", "-m", "my server")
    cases: list[tuple[list[dict[str, Any]], str]] = [
        ([{"name": "a", "tools": ["x"]}, {"name": "a", "tools": ["y"]}], "unique, repeated: a"),
        (
            [{"name": "r", "kind": "remote", "endpoint": "tcp://h:1"}],
            "needs endpoint and server_key",
        ),
        ([{"name": "m", "kind": "mcp"}], "needs command or url"),
        ([{"name": "l"}], r"needs tools = \[\.\.\.\]"),
        ([{"tools": ["x"]}], r"\[tools.hosts\[0\]\] needs name"),
        ([{"name": "k", "kind": "ssh", "tools": ["x"]}], r"tools.hosts\[0\].kind = 'ssh'"),
    ]
    for hosts, message in cases:
        with pytest.raises(ConfigError, match=message):
            parse({"tools": {"hosts": hosts}})


def test_replace_is_checked() -> None:
    config = Config().replace("log", dir="/tmp/x")
    assert config.log.dir == "/tmp/x"
    assert config.log_dir == Path("/tmp/x")
    with pytest.raises(ConfigError, match=r"log\.fsync"):
        Config().replace("log", fsync="maybe")


def test_every_key_has_a_check() -> None:
    """A key added with a new type must get a check (else parse raises AssertionError):
    every key's default, written as a file writes it, is read back as the default."""
    for section, key, kind, rule in keys():
        default = getattr(_section(Config(), section), key)
        read = parse(nest(section, {key: as_written(kind, rule, default)}))
        assert getattr(_section(read, section), key) == default, f"{section}.{key}"


def _section(config: Config, dotted: str) -> Any:
    for name in dotted.split("."):
        config = getattr(config, name)
    return config


def test_slots_main_is_refused_with_what_replaced_it() -> None:
    match = r"slots\.main was removed: the slot keeper.*embedded\.slots"
    with pytest.raises(ConfigError, match=match):
        parse({"slots": {"main": 0}})


def test_url_and_servers_together_are_refused() -> None:
    servers = ["http://127.0.0.1:8080", "http://127.0.0.1:8081"]
    assert parse({"inference": {"servers": servers}}).inference.servers == tuple(servers)
    with pytest.raises(ConfigError, match=r"inference\.url and inference\.servers are both set"):
        parse({"inference": {"url": "http://127.0.0.1:8080", "servers": servers}})


def test_the_shell_table() -> None:
    config = parse({"tools": {"shell": {"sandbox": "none", "network": True, "env": ["PATH"]}}})
    assert config.tools.shell == cfg.ShellConfig(sandbox="none", network=True, env=("PATH",))
    assert Config().tools.shell.sandbox == "bwrap"
    assert Config().tools.shell.network is False
    with pytest.raises(ConfigError, match=r"tools\.shell\.sandbox = 'docker': allowed values"):
        parse({"tools": {"shell": {"sandbox": "docker"}}})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in \[tools\.shell\]: nope"):
        parse({"tools": {"shell": {"nope": 1}}})
    with pytest.raises(ConfigError, match=r"\[tools\.shell\] must be a table"):
        parse({"tools": {"shell": 3}})
    shell = cfg.ShellConfig(network=True)
    assert Config().replace("tools", shell=shell).tools.shell is shell


def test_the_rules_file_lives_in_the_config_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "conf"))
    assert Config().rules_path == tmp_path / "conf" / "loopd" / "rules.toml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert Config().rules_path == Path.home() / ".config" / "loopd" / "rules.toml"
    named = parse({"tools": {"rules_file": "~/mine.toml"}})
    assert named.rules_path == Path.home() / "mine.toml"


# --- "auto": resolved once, at load, for the model server the config names ---------------------

def both(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two files' tables in one (b's sections merged into a's)."""
    return {**a, **{k: {**a.get(k, {}), **v} for k, v in b.items()}}


AUTO_KEYS = [(s, k, rule) for s, k, _, rule in keys() if rule.auto is not None]


def test_the_auto_keys() -> None:
    assert [f"{s}.{k}" for s, k, _ in AUTO_KEYS] == [
        "inference.bare_json_tool_calls", "inference.constrained_calls",
        "slots.save_after_turn", "agents.max_parallel", "session.tool_results",
        "session.compaction",
        "session.compact_at",
    ]


@pytest.mark.parametrize(("section", "key", "rule"), AUTO_KEYS)
def test_auto_means_one_thing_on_the_embedded_model_and_another_on_a_named_server(
    section: str, key: str, rule: cfg.Allowed
) -> None:
    assert rule.auto is not None
    on_embedded, on_named = rule.auto
    # agents.max_parallel: "auto" is 0 on both (the servers' slots, counted when a turn runs)
    assert on_embedded != on_named or key == "max_parallel"
    # the default (no file) is the embedded model's: a config built in code has it too
    assert getattr(_section(Config(), section), key) == on_embedded
    assert getattr(_section(parse({}), section), key) == on_embedded
    named = {"inference": {"url": "http://127.0.0.1:9"}}
    several = {"inference": {"servers": ["http://127.0.0.1:9", "http://127.0.0.1:10"]}}
    for data in (named, several):
        assert getattr(_section(parse(data), section), key) == on_named
        written = parse(both(data, nest(section, {key: "auto"})))
        assert getattr(_section(written, section), key) == on_named
    # a value the file names is kept whichever server runs (constrained_calls off: on, it
    # implies bare_json_tool_calls, tested below)
    free = {"inference": {"constrained_calls": "off"}}
    for word, value in (rule.words or tuple((w, w) for w in typing.get_args(
            typing.get_type_hints(SECTIONS[section])[key]))):
        for data in (free, both(free, named)):
            chosen = parse(both(data, nest(section, {key: word})))
            assert getattr(_section(chosen, section), key) == value


def test_an_auto_key_lists_its_words() -> None:
    with pytest.raises(ConfigError, match=r"inference\.constrained_calls = 'maybe': allowed "
                                          r"values are auto, on, off"):
        parse({"inference": {"constrained_calls": "maybe"}})
    with pytest.raises(ConfigError, match=r"session\.tool_results = True: allowed values are "
                                          r"auto, tool, user"):
        parse({"session": {"tool_results": True}})


def test_constrained_calls_imply_bare_json() -> None:
    on = {"constrained_calls": "on", "bare_json_tool_calls": "off"}
    assert parse({"inference": on}).inference.bare_json_tool_calls is True
    assert parse({"inference": {"url": "http://h", **on}}).inference.bare_json_tool_calls
    assert cfg.InferenceConfig(constrained_calls=True, bare_json_tool_calls=False) \
        .bare_json_tool_calls is True
    off = {"url": "http://h", "constrained_calls": "off", "bare_json_tool_calls": "on"}
    assert parse({"inference": off}).inference.bare_json_tool_calls is True


def test_a_commands_overrides_decide_auto_like_the_file(tmp_path: Path) -> None:
    path = tmp_path / "loopd.toml"
    path.write_text('[inference]\nservers = ["http://127.0.0.1:9"]\n[log]\ndir = "/x"\n',
                    encoding="utf-8")
    named = load(path)
    assert not named.embedded_model and not named.inference.constrained_calls
    embedded = load(path, {"inference": {"servers": []}})
    assert embedded.embedded_model and embedded.inference.constrained_calls
    assert embedded.log.dir == "/x"  # the file's other keys stay
    other = load(path, {"inference": {"url": "http://127.0.0.1:8", "servers": []}})
    assert other.inference.url == "http://127.0.0.1:8" and other.inference.servers == ()
    assert other.session.tool_results == "tool"
    with pytest.raises(ConfigError, match=r"loopd\.toml: inference\.url and inference\."
                                          r"servers are both set"):
        load(path, {"inference": {"url": "http://127.0.0.1:8"}})
    with pytest.raises(ConfigError, match=r"inference\.parallel = 0: must be at least 1"):
        load(None, {"inference": {"parallel": 0}})


def test_replace_resolves_auto_for_its_server_and_cannot_switch_the_server() -> None:
    named = parse({"inference": {"url": "http://127.0.0.1:9"}})
    assert named.replace("session", tool_results="auto").session.tool_results == "tool"
    assert Config().replace("session", tool_results="tool").replace(
        "session", tool_results="auto").session.tool_results == "user"
    with pytest.raises(ConfigError, match=r"cannot switch between the embedded model and a "
                                          r"named server.*load\(overrides="):
        Config().replace("inference", url="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="cannot switch"):
        named.replace("inference", url="")
    assert named.replace("inference", url="http://127.0.0.1:8").inference.constrained_calls \
        is False  # another named server: nothing to resolve again


def test_compaction_defaults_to_elide_on_the_embedded_model_and_summary_on_a_named_server(
) -> None:
    assert parse({}).session.compaction == "elide"
    named = parse({"inference": {"url": "http://127.0.0.1:1"}})
    assert named.session.compaction == "summary"
    assert parse({"session": {"compaction": "summary"}}).session.compaction == "summary"
    session = parse({}).session
    assert (session.compact_at, session.compact_keep, session.summary_tokens) == (0.4, 0.25, 512)
    with pytest.raises(ConfigError, match=r"session\.compact_at = 1\.5"):
        parse({"session": {"compact_at": 1.5}})


def test_compact_at_is_earlier_on_the_embedded_model_and_a_number_is_kept_on_either() -> None:
    named = {"inference": {"url": "http://127.0.0.1:1"}}
    assert parse({}).session.compact_at == 0.4
    assert parse(named).session.compact_at == 0.8
    assert parse(both(named, {"session": {"compact_at": "auto"}})).session.compact_at == 0.8
    for data in ({}, named):
        assert parse(both(data, {"session": {"compact_at": 0.6}})).session.compact_at == 0.6
        assert parse(both(data, {"session": {"compact_at": 1}})).session.compact_at == 1.0
    with pytest.raises(ConfigError, match=r"session\.compact_at = 'soon': must be a number "
                                          r"or auto"):
        parse({"session": {"compact_at": "soon"}})
    with pytest.raises(ConfigError, match=r"session\.compact_at = 0\.01: must be at least 0\.05"):
        parse({"session": {"compact_at": 0.01}})
