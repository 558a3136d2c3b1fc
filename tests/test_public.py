"""The package's public face: ``actors.__all__`` and what importing it loads.

``actors/__init__.py`` runs in every loopd process (importing ``actors.tools.host`` runs it
first), so it must stay light: the daemon client is loaded when a caller asks for
``actors.Client``, and nothing of the face loads pykka. Each check runs in a fresh
interpreter, where ``sys.modules`` shows what an import really loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import actors
from actors.base import errors
from actors.base.config import Config, load
from actors.daemon.client import Client

ROOT = Path(__file__).resolve().parents[1]


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_face_is_curated() -> None:
    assert sorted(actors.__all__) == ["Client", "Config", "LoopdError", "load_config"]
    assert actors.Client is Client
    assert actors.Config is Config
    assert actors.load_config is load
    assert actors.LoopdError is errors.LoopdError


def test_every_error_of_the_tree_is_a_loopd_error() -> None:
    tree = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)]
    assert len(tree) > 10
    assert all(issubclass(cls, actors.LoopdError) for cls in tree)


def test_a_name_that_is_not_there_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'actors' has no attribute 'Session'"):
        _ = actors.Session  # type: ignore[attr-defined]


def test_star_import_gives_the_face() -> None:
    names: dict[str, object] = {}
    exec("from actors import *", names)
    assert {"Client", "Config", "LoopdError", "load_config"} <= names.keys()


def test_importing_the_package_loads_no_client_no_zeromq_no_pykka() -> None:
    """What every process pays: the config and the errors, nothing of a client or an actor."""
    loaded = loaded_after("import actors")
    assert {"actors.base.config", "actors.base.errors"} <= loaded
    assert not loaded & {"actors.daemon.client", "zmq", "pykka", "msgpack"}, loaded


def test_a_tool_host_does_not_load_the_daemon_client() -> None:
    loaded = loaded_after("import actors.tools.host.main")
    assert "actors.tools.host.server" in loaded
    assert "actors.daemon.client" not in loaded and "pykka" not in loaded
    assert "jsonschema" not in loaded  # its standard tools' schemas need no jsonschema
    # OpenSSL's hashlib (secrets loads it): 4 MiB more in every host; its ids use os.urandom
    assert "_hashlib" not in loaded


def test_a_session_process_loads_no_cli_of_httpx_no_jsonschema_no_tomlkit() -> None:
    """Start-up CPU of every loopd run, chat and daemon (each ~0.1 s or more): httpx's own
    command-line tool, jsonschema before arguments need it, tomlkit before a rule is saved.
    A loopd process starts from actors.cli (or actors.tools.host), which leaves httpx's
    tool out before anything imports httpx."""
    loaded = loaded_after("import actors.cli.main, actors.session.world, httpx\nhttpx.Client")
    assert "httpx" in loaded
    assert not loaded & {"click", "pygments", "jsonschema", "tomlkit"}, loaded


def test_a_tool_host_leaves_out_the_cli_of_httpx() -> None:
    loaded = loaded_after("import actors.tools.host\nimport httpx\nhttpx.Client")
    assert "httpx" in loaded and not loaded & {"click", "pygments"}, loaded


def test_loopd_as_a_library_keeps_httpx_whole() -> None:
    """``import actors`` changes nothing of another library's: httpx's own command-line tool
    stays importable for a program that uses it (only loopd's processes leave it out)."""
    loaded = loaded_after("import actors")
    assert "httpx._main" not in loaded and "actors.base.startup" not in loaded


def test_only_a_loopd_program_freezes_its_start_up_heap_and_only_once() -> None:
    """``startup.settled`` freezes the heap (gc.freeze) in a process marked a loopd program
    (its entry point), once: a library user's process, or a test calling ``main``, keeps its
    collector as it was, and what a program makes after start-up stays collectable."""
    code = ("import gc\nfrom actors.base import startup\n"
            "startup.settled(); library = gc.get_freeze_count()\n"
            "startup.program(); startup.settled(); frozen = gc.get_freeze_count()\n"
            "later = [[] for _ in range(1000)]; startup.settled()\n"
            "print(library, frozen > 1000, gc.get_freeze_count() == frozen)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["0", "True", "True"]


def test_tracing_off_loads_nothing_of_opentelemetry() -> None:
    """Off (no OTLP endpoint, no [telemetry] enabled), a session process, its CLI and a tool
    host import no OpenTelemetry module, even after a span was asked for."""
    code = ("import os\n"
            "for k in [k for k in os.environ if k.startswith('OTEL_') or k == 'LOOPD_TELEMETRY']:"
            " del os.environ[k]\n"
            "import actors.session.world, actors.cli.main, actors.tools.host.main\n"
            "from actors.base import telemetry\n"
            "with telemetry.span('invoke_agent loopd') as s: s.set('a', 1)\n"
            "assert not telemetry.enabled()")
    loaded = loaded_after(code)
    assert "actors.base.telemetry" in loaded
    assert not {m for m in loaded if m.startswith("opentelemetry")}, loaded


def test_tracing_on_loads_it() -> None:
    """The check above can fail: on, the same span loads the SDK."""
    loaded = loaded_after("import os\nos.environ['OTEL_EXPORTER_OTLP_ENDPOINT'] = "
                          "'http://127.0.0.1:9'\nos.environ.pop('OTEL_SDK_DISABLED', None)\n"
                          "from actors.base import telemetry\n"
                          "assert telemetry.enabled()\ntelemetry.reset()")
    assert "opentelemetry.sdk.trace" in loaded


def test_the_client_from_the_face_loads_no_pykka() -> None:
    """A script that only drives a daemon loads its client and the protocol, no actor."""
    loaded = loaded_after("from actors import Client, load_config\nClient, load_config()")
    assert {"actors.daemon.client", "actors.daemon.protocol", "zmq"} <= loaded
    assert "pykka" not in loaded
    assert not any(m.startswith(("actors.session", "actors.inference")) for m in loaded), loaded


def test_a_bad_config_is_a_loopd_error_from_the_face(tmp_path: Path) -> None:
    bad = tmp_path / "loopd.toml"
    bad.write_text("[loop]\ntool_iterations = -1\n")
    with pytest.raises(actors.LoopdError, match="tool_iterations") as caught:
        actors.load_config(bad)
    assert caught.value.exit_code == 2
