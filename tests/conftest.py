"""Shared test set-up: hypothesis profiles, and a guard against leaked actors."""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pykka
import pytest
from hypothesis import HealthCheck, settings

from actors.inference.embedded.server import NO_REPACK_MARKER
from tests.support.baselines import baseline_files, copy_into
from tests.support.embedded import THREADS, missing

# CI: fixed, derandomized runs (hypothesis auto-loads "ci" when CI is set; we pin it here
# so the settings are ours). Locally: random exploration, the seed printed on failure.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev",
    deadline=None,
    print_blob=True,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# The tests see none of the person's own loopd: no LOOPD_CONFIG, and a runtime directory of
# their own, so `loopd run` in a test never finds (and never talks to) a daemon the person
# (or another test run) has running. Subprocesses inherit both.
os.environ.pop("LOOPD_CONFIG", None)
# A test run started in the background by a script (`pytest &`) has SIGINT ignored, and every
# loopd it starts would inherit that, so the tests that cancel a turn with Ctrl-C would see
# nothing happen. A handler (not SIG_IGN) is reset to the default in each child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Likewise their own config home: the person's rules file (tools.rules_file's default place)
# would otherwise allow or deny calls the tests expect to be asked about.
for _xdg in ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"):
    os.environ[_xdg] = tempfile.mkdtemp(prefix="loopd-tests-")
    atexit.register(shutil.rmtree, os.environ[_xdg], ignore_errors=True)

# And their own data home (log.dir's and embedded.data_dir's default places): the KV state a
# test's llama-server saves (slots/) is that test's, not what another build, config or test
# run left there (a stale baseline under the same name is a CacheLoss the test did not cause,
# and concurrent tests pruned each other's baselines). Only the assembled model, ~400 MB and
# slow to verify, and the note that this machine's llama-server needs --no-repack, are the
# person's, linked in. The controller's real place is kept for its xdist workers. A test that
# does not show a cold start may start from a baseline's KV state saved once in this run
# (marker ``baseline``: tests/support/baselines.py), never from one of another run or build.
REAL_DATA_HOME = Path(os.environ.setdefault(
    "LOOPD_TESTS_REAL_DATA_HOME",
    str(Path(os.environ.get("XDG_DATA_HOME") or "~/.local/share").expanduser() / "loopd")))


def private_data_home() -> str:
    """A new ``XDG_DATA_HOME`` whose ``loopd/`` links the person's model folder in."""
    home = Path(tempfile.mkdtemp(prefix="loopd-data-"))
    (home / "loopd").mkdir()
    for name in ("models", NO_REPACK_MARKER):
        real = REAL_DATA_HOME / name
        if name == "models":
            real.mkdir(parents=True, exist_ok=True)  # the first run assembles the model there
        (home / "loopd" / name).symlink_to(real)
    return str(home)


os.environ["XDG_DATA_HOME"] = private_data_home()
atexit.register(shutil.rmtree, os.environ["XDG_DATA_HOME"], ignore_errors=True)


@pytest.fixture(scope="session")
def _run_baselines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's store of saved baselines, one for all its xdist workers."""
    base = tmp_path_factory.getbasetemp()
    store = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "baselines"
    store.mkdir(exist_ok=True)
    return store


@pytest.fixture(autouse=True)
def _own_data_home_on_the_real_model(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Each real-model test its own saved KV state (see above); one marked
    ``baseline(NAME)`` starts with that baseline's state as this run saved it
    (tests/support/baselines.py)."""
    if request.node.get_closest_marker("embedded") is None:
        yield
        return
    home = private_data_home()
    marker = request.node.get_closest_marker("baseline")
    if marker is not None and missing() is None:  # without the model the test skips itself
        store: Path = request.getfixturevalue("_run_baselines")
        copy_into(baseline_files(marker.args[0], store, private_data_home, THREADS), home)
    monkeypatch.setenv("XDG_DATA_HOME", home)
    yield
    shutil.rmtree(home, ignore_errors=True)


# Bytecode: the tests start a loopd process (a session, a tool host, a daemon) hundreds of
# times. Under PYTHONDONTWRITEBYTECODE (set by some CI and sandbox environments) each of them
# compiled every loopd module again: 0.77 CPU-s to start a session process instead of 0.42.
# The run writes loopd's bytecode (__pycache__, ignored by git) like any Python run does; a
# bytecode cache of its own (PYTHONPYCACHEPREFIX) would compile the standard library and
# every dependency again instead.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all(timeout=10)


# Every run of the property tests has one seed, printed in the header: CI uses a fixed one
# (deterministic runs), a local run a new one each time. Replay a run with
# `pytest --hypothesis-seed=N`.
CI_SEED = 20261202


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # a pytest-xdist worker: the run's one seed, from the controller
        config.option.hypothesis_seed = workerinput["hypothesis_seed"]
        return
    if config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = str(
            CI_SEED if os.environ.get("CI") else random.randrange(2**32)
        )


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """pytest-xdist (``make test`` runs 3 workers): every worker uses the seed the header shows."""
    node.workerinput["hypothesis_seed"] = node.config.option.hypothesis_seed  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = config.getoption("hypothesis_seed")
    profile = settings.get_current_profile_name()
    bwrap = shutil.which("bwrap")
    return [
        f"hypothesis: profile {profile}, seed {seed} (replay: --hypothesis-seed={seed})",
        f"bubblewrap: {bwrap}" if bwrap else "bubblewrap: not found; the tests that run "
        "run_command fail (apt-get install bubblewrap)",
    ]


# The longest tests start first, so that the run does not end on one of them while the other
# workers sit idle (`make test` hands tests out one at a time: --maxschedchunk 1). The real
# model's tests, longest first: seconds of each alone (-n 0, its llama-server on one thread,
# so about its CPU time), measured at load 2-3 (2026-12-06, after the pages and agents tests
# were cut to 45 and 43 s from 86 and 106). A model test not listed starts after these.
MODEL_LONG_FIRST = (
    "tests/session/test_compaction_embedded.py::test_pasted_pages",  # 40-49
    "tests/session/test_agents_embedded.py::",  # 43 (it started 43rd while unlisted)
    "tests/scripts/test_bench.py::test_each_bench_runs_whole_at_tiny_sizes[slots]",  # 36
    "tests/session/test_compaction_embedded.py::",  # 19-31
    "tests/scripts/test_bench.py::test_each_bench_runs_whole_at_tiny_sizes[agents]",  # 17-25
    "tests/session/test_fork_embedded.py::",  # 22
    "tests/inference/embedded/test_embedded_turn.py::",  # 9, and 18 to save a baseline
    "tests/inference/slots/test_slots_embedded.py::",  # 8-11 each
    "tests/test_eval.py::test_smoke_two_tasks_on_the_embedded_model",  # 8
    "tests/scripts/test_bench.py::test_each_bench_runs_whole_at_tiny_sizes[fork]",  # 8
)
# The rest of this list, longest first, took 11-75 s each under load (--durations,
# 2026-12-04). A test not listed keeps its place; a renamed one only loses its head start.
LONG_FIRST = (
    "tests/faults/test_crash.py::test_sigkill_at_random_moments_loses_nothing",
    "tests/session/turn/test_extension_property.py::test_every_request_extends_the_last",
    "tests/daemon/test_daemon_faults.py::test_sigterm_and_sigkill_of_the_daemon_at_random",
    "tests/scripts/test_bench.py::test_each_bench_runs_whole_at_tiny_sizes[mcp]",
    "tests/faults/test_daemon_load.py::test_32_clients_at_once_through_the_daemon",
    # runs the whole MCP conformance suite for its scenario tests (they wait for it on a lock)
    "tests/mcp_conformance/test_conformance.py::test_the_scenarios_here_are_the_suites",
    "tests/faults/test_tool_faults.py::test_a_command_printing_gigabytes",
    "tests/session/test_messages.py::test_extension_property",
    "tests/session/test_messages.py::test_ends_count_the_messages_of_each_prefix",
    "tests/test_references.py::test_every_reference_points_at_something",
    "tests/acp/test_python_client.py::test_the_python_sdk_client_drives_a_whole_session",
    "tests/session/test_fork.py::test_forks_and_rewinds_of_generated_conversations",
    "tests/test_eval_overflow.py::test_each_conversation_overflows_the_context",
    "tests/session/test_messages.py::test_a_rewind_renders_what_was_rendered",
    "tests/tools/providers/test_mcp.py::test_git_tools_through_a_tool_host_and_port",
    "tests/faults/test_load.py::test_32_sessions_at_once_on_4_hosts",
    "tests/daemon/test_daemon.py::test_run_and_chat_go_through_the_daemon",
    "tests/daemon/test_daemon_first_hour.py::test_a_workspace_of_its_own_beside_the_daemon",
    "tests/acp/test_daemon_backend.py::test_turns_run_in_the_daemon_that_serves",
    "tests/scripts/test_bench.py::test_each_bench_runs_whole_at_tiny_sizes",
    # 2026-12-06, -n 2 under load: 6.7 CPU-s; four tool calls left to time out (11 s on any
    # machine); the toolbox's OAuth against the suite's server (its own node process)
    "tests/acp/test_node_client.py::test_the_typescript_sdk_client_drives_a_whole_session",
    "tests/faults/test_tool_faults.py::test_a_host_answering_garbage",
    "tests/mcp_conformance/test_conformance.py::test_oauth_through_a_tool_host",
)


def _ranked(items: list[pytest.Item], order: tuple[str, ...]) -> list[pytest.Item]:
    """``items`` by the first entry of ``order`` each starts with (unlisted last), stably."""
    def rank(item: pytest.Item) -> int:
        return next((n for n, p in enumerate(order) if item.nodeid.startswith(p)), len(order))
    return sorted(items, key=rank)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real model's tests and the listed long ones first, one of the model's after every
    two long ones (three workers: rarely two model servers at once); the rest in order."""
    model = _ranked([i for i in items if i.get_closest_marker("embedded") is not None],
                    MODEL_LONG_FIRST)
    models = set(model)
    long = _ranked([i for i in items if i not in models and any(
        i.nodeid.startswith(p) for p in LONG_FIRST)], LONG_FIRST)
    head: list[pytest.Item] = []
    while model or long:
        head += model[:1] + long[:2]
        del model[:1], long[:2]
    first = set(head)
    items[:] = head + [i for i in items if i not in first]
