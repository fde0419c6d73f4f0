"""How long the quick tier takes: `pytest -m unit` as you run it (a worker per core and one more) against the same tests in one process.

Each run is a fresh `python -m pytest` from this checkout, timed from start to exit (interpreter
start, collection and the tests), `--runs` times each, alternating; the figure is the median. No
bytecode cache is kept between runs unless your environment keeps one (PYTHONDONTWRITEBYTECODE).

    python bench/unit_tier_bench.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 30.0  # seconds: the quick tier's aim on a 2-core machine


def timed(extra: list[str]) -> tuple[float, str]:
    """Seconds one `pytest -m unit` run took, and its summary line (it must pass)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "unit", "-rf", *extra]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"the unit tier failed ({' '.join(extra) or 'as run'}):\n{done.stdout[-3000:]}")
    return seconds, done.stdout.strip().splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each way, alternating")
    args = parser.parse_args()
    ways = {"as run (a worker per core and one more)": [], "one process (-n 0)": ["-n", "0"]}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.runs):
        for name, extra in ways.items():
            took, summary = timed(extra)
            seconds[name].append(took)
            print(f"{name:40} {took:6.1f} s  {summary}", file=sys.stderr)
    worker, single = (statistics.median(seconds[name]) for name in ways)
    print(f"\nthe unit tier on {os.cpu_count()} cores, median of {args.runs} runs")
    verdict = "met" if worker < TARGET else "missed"
    print(f"{'as run (a worker per core and one more)':40} {worker:6.1f} s  {worker / single:.2f}x one process; aim under {TARGET:.0f} s: {verdict}")
    print(f"{'one process (-n 0)':40} {single:6.1f} s  1.00x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
