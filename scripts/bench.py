"""`make bench`: runs every scripts/bench_*.py, prints one table, writes bench/results.json.

Each bench module has ``run() -> list[dict]``; a row holds ``bench``, ``name``, ``value``,
``unit`` and optionally ``ratio`` (against the floor measured in the same run) and ``note``.
Ratios are the numbers to compare: these machines are noisy, absolute numbers are not.

``--smoke`` runs every bench at tiny sizes (seconds each: each module's ``SMOKE`` maps its
size constants to small values) to show that it still runs whole, not to measure anything;
``tests/scripts/test_bench.py`` does that in ``make test``, so a contract change that breaks a
bench fails there. ``--out FILE`` writes the results elsewhere than ``bench/results.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench")
    parser.add_argument("only", nargs="*", help="benches to run (log, tools, ...); default all")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: does each bench run?")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args(argv)
    only = set(args.only)
    rows: list[dict[str, Any]] = []
    for path in sorted((ROOT / "scripts").glob("bench_*.py")):
        name = path.stem.removeprefix("bench_")
        if only and name not in only:
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        module = importlib.import_module(f"scripts.{path.stem}")
        started = time.perf_counter()
        try:
            if args.smoke:
                for constant, value in module.SMOKE.items():
                    if not hasattr(module, constant):
                        raise AttributeError(f"{path.name}: SMOKE names no constant {constant}")
                    setattr(module, constant, value)
            for row in module.run():
                rows.append({"bench": name, **row})
        except Exception as e:  # one broken bench must not hide the others
            traceback.print_exc()
            rows.append(
                {"bench": name, "name": "error", "value": None, "unit": "", "note": repr(e)}
            )
        print(f"   ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    _table(rows)
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(), "machine": platform.machine(),
            "smoke": args.smoke}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\nwritten {out}")
    return 1 if any(r["name"] == "error" for r in rows) else 0


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="loopd bench (ratios are side by side in this run)")
    for col in ("bench", "measure", "value", "unit", "ratio", "note"):
        table.add_column(col, justify="right" if col in ("value", "ratio") else "left")
    for r in rows:
        value = r.get("value")
        ratio = r.get("ratio")
        table.add_row(
            r["bench"], r["name"],
            "-" if value is None else f"{value:,.3g}" if isinstance(value, float) else f"{value:,}",
            r.get("unit", ""),
            "" if ratio is None else f"{ratio:.2f}x",
            r.get("note", ""),
        )
    console = Console()
    if not console.is_terminal:  # a log file: wide enough that notes stay on one line
        console = Console(width=200)
    console.print(table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
