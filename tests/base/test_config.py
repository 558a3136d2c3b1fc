"""Config: defaults, partial files, and every bad value refused with its key."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest

from actors.base import config as cfg
from actors.base.config import Config, HostConfig, load, parse
from actors.base.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TOP = {f.name: type(getattr(Config(), f.name)) for f in dataclasses.fields(Config)}
# every section, sub-tables such as [tools.shell] included, by its dotted name
SECTIONS = {
    **TOP,
    **{
        f"{name}.{f.name}": cfg._TABLES[str(f.type)]
        for name, cls in TOP.items()
        for f in dataclasses.fields(cls)
        if str(f.type) in cfg._TABLES
    },
}


def keys() -> list[tuple[str, str, str]]:
    """(section, key, annotation) of every scalar key of every section."""
    out = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if str(f.type) not in cfg._TABLES:  # a sub-table: its keys are listed as its own
                out.append((section, f.name, str(f.type).replace(" ", "")))
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


def bad_values(annotation: str) -> list[Any]:
    if annotation.startswith("Literal["):
        return ["bogus", 1]
    table: dict[str, list[Any]] = {
        "str": [1, ["x"], True],
        "int": ["1", 1.5, True],
        "float": ["1", True],
        "bool": ["yes", 1],
        "tuple[str,...]": ["x", [1], {"a": "b"}],
        "tuple[HostConfig,...]": ["x", [5]],
    }
    return table[annotation]


def test_defaults_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPD_CONFIG", raising=False)
    config = load()
    assert config == Config()
    assert config.log.fsync == "always"
    assert config.loop.tool_iterations == 16
    assert config.log_dir == Path("~/.local/share/loopd/sessions").expanduser()


def test_the_documented_file_holds_every_key_with_its_default() -> None:
    path = ROOT / "config" / "loopd.toml"
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert load(path) == Config()
    missing = [
        f"{section}.{key}"
        for section, key, _ in keys()
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
    [(s, k, v) for s, k, ann in keys() for v in bad_values(ann)],
)
def test_every_bad_value_is_refused_with_its_key(section: str, key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse(nest(section, {key: value}))
    assert f"{section}.{key}" in str(info.value)


def test_literal_errors_list_what_is_allowed() -> None:
    expected = r"log\.fsync = 'sometimes': allowed values are always, turn, never"
    with pytest.raises(ConfigError, match=expected):
        parse({"log": {"fsync": "sometimes"}})


@pytest.mark.parametrize(("key", "low"), sorted(cfg._MINIMUM.items()))
def test_values_below_the_minimum_are_refused(key: str, low: float) -> None:
    section, name = key.split(".")
    annotation = str(SECTIONS[section].__dataclass_fields__[name].type)
    too_small = low - 1 if annotation == "int" else low / 2 if low > 0 else low - 0.5
    with pytest.raises(ConfigError, match=rf"^{key} = .*: must be at least"):
        parse({section: {name: too_small}})
    at_minimum = parse({section: {name: int(low) if annotation == "int" else low}})
    assert getattr(getattr(at_minimum, section), name) == low


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


def test_every_annotation_has_a_check() -> None:
    """A key added with a new type must get a check (else parse raises AssertionError)."""
    for section, key, annotation in keys():
        assert annotation.startswith("Literal[") or annotation in {
            "str", "int", "float", "bool", "tuple[str,...]", "tuple[HostConfig,...]"
        }, f"{section}.{key}: {annotation}"


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
