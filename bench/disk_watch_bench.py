"""The disk limit's watcher: its CPU during ordinary cells, and how far a folder growing fast gets past the limit before it is seen.

    .venv/bin/python bench/disk_watch_bench.py [--cells 5] [--seconds 2] [--files 2000] [--busy 4] [--rounds 2] [--tries 5]

Measured side by side in one run: the watcher as shipped (it looks again before the growth it saw
between its last two looks could pass a limit; before it has seen growth it pauses twenty times its
walk's CPU time, its wall time stretching the pause a second at most) and, as the baseline, the
watcher before it (the same, but paused twenty times its walk's wall time, which a busy machine
stretches), in the same class otherwise. Both watch a working folder of `--files` files (an
analyst's data and outputs, 4 KB to 64 KB each, some 70 MB) under a 1 GB limit.

- Ordinary cells: each cell runs `--seconds` and writes a 2 MB table in 64 KB pieces, as a cell
  saving a CSV does; the watcher's CPU (its walks, on its own thread) per second of cell is printed
  for both, with the ratio shipped / baseline (1.0: no extra cost).
- A fast writer: between cells, 16 MB/s toward a 20 MB limit, beside `--busy` processes spinning
  (a loaded CI machine; 0: idle): the size at which each watcher first sees the folder past the
  limit (the worst of `--tries`), and their ratio.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from taskweaver_lite.kernel.sandbox.disk_limit import FAST, SLOW, DiskWatch, Reached

MB = 1024 * 1024


class Counted(DiskWatch):
    """The shipped watcher, counting the CPU its own thread spends measuring."""

    cpu = 0.0

    def measure(self) -> Reached | int:
        mine = threading.current_thread() is self._thread
        began = time.thread_time()
        try:
            return super().measure()
        finally:
            if mine:
                self.cpu += time.thread_time() - began


class WallPaced(Counted):
    """The watcher before: the pause twenty times the walk's wall time (a busy machine's wait for a core included)."""

    def _pause(self, walked: float, cpu: float, *, between: bool) -> float:
        if self._near:
            return FAST
        pause = max(FAST if self._in_cell or between else SLOW, walked * 20)
        return min(pause, max(FAST, self._pace.until(self._allowed, self._allowed_files) / 2))


def working_folder(root: Path, files: int) -> Path:
    """`files` files of 4 KB to 64 KB in a few folders."""
    folder = root / "cwd"
    for i in range(files):
        part = folder / f"part-{i % 20:02d}"
        part.mkdir(parents=True, exist_ok=True)
        (part / f"out-{i:05d}.csv").write_bytes(b"x" * (4096 * (1 + i % 16)))
    return folder


def ordinary_cells(kind: type[Counted], folder: Path, *, cells: int, seconds: float) -> float:
    """The watcher's CPU per second of cell, over `cells` cells each writing a 2 MB table."""
    watch = kind((folder,), limit=1024 * MB, on_reached=lambda reached, in_cell: None)
    try:
        time.sleep(0.5)
        before, cell_time = watch.cpu, 0.0
        for n in range(cells):
            began = time.monotonic()
            with watch.cell():
                with (folder / f"table-{kind.__name__}-{n}.csv").open("wb") as out:
                    for _ in range(32):
                        out.write(b"y" * (64 * 1024))
                        out.flush()
                        time.sleep(seconds / 64)
                time.sleep(max(0.0, began + seconds - time.monotonic()))
            cell_time += time.monotonic() - began
            watch.reached_in_cell()
            time.sleep(0.2)  # the analyst reads the answer
        return (watch.cpu - before) / cell_time
    finally:
        watch.close()


def fast_writer(kind: type[Counted], root: Path) -> float:
    """Bytes the folder held when the watcher first saw it past a 20 MB limit, written at 16 MB/s between cells."""
    folder = root / f"fast-{kind.__name__}"
    folder.mkdir()
    seen: list[Reached] = []
    passed = threading.Event()

    def told(reached: Reached, in_cell: bool) -> None:
        seen.append(reached)
        passed.set()

    watch = kind((folder,), limit=20 * MB, on_reached=told)
    try:
        write(folder / "growing.bin", pace=16 * MB, until=passed.is_set, wait=passed.wait)
        passed.wait(10)
    finally:
        watch.close()
    return float(seen[0].size or 0) if seen else float("inf")


def write(path: Path, *, pace: int, until: Callable[[], bool], wait: Callable[[float], bool]) -> None:
    """Half-megabyte pieces at `pace` bytes a second at most until `until()` (or 80 MB); late, it never catches up in a burst."""
    chunk, written, due = b"x" * (MB // 2), 0, time.monotonic()
    with path.open("wb") as out:
        while not until() and written < 80 * MB:
            out.write(chunk)
            out.flush()
            written += len(chunk)
            due = max(due + len(chunk) / pace, time.monotonic())
            wait(max(0.0, due - time.monotonic()))


def busy(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` processes spinning on a core each: the load a CI machine runs tests under."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--busy", type=int, default=4, help="processes spinning beside the fast writer")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of ordinary cells, each kind twice per round")
    parser.add_argument("--tries", type=int, default=5, help="fast writers per kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = working_folder(root, args.files)
        cost: dict[type[Counted], float] = {WallPaced: 0.0, Counted: 0.0}
        for kind in (WallPaced, Counted, Counted, WallPaced) * args.rounds:  # alternated, so a change in the machine's load falls on both
            cost[kind] += ordinary_cells(kind, folder, cells=args.cells, seconds=args.seconds) / (2 * args.rounds)
        spinning = busy(args.busy)
        try:
            reach = {WallPaced: 0.0, Counted: 0.0}
            for _ in range(args.tries):
                for kind in (WallPaced, Counted):
                    (root / "try").mkdir()
                    reach[kind] = max(reach[kind], fast_writer(kind, root / "try"))
                    subprocess.run(["rm", "-rf", str(root / "try")], check=True)
        finally:
            for process in spinning:
                process.kill()
                process.wait()
    shipped, baseline = cost[Counted], cost[WallPaced]
    print(
        f"ordinary cells ({args.files} files in the folder), watcher CPU per second of cell: shipped {shipped * 1000:.2f} ms, before {baseline * 1000:.2f} ms"
    )
    print(f"  ratio shipped / before: {shipped / baseline:.2f}")
    print(
        f"16 MB/s toward a 20 MB limit beside {args.busy} busy processes, first seen past it at (worst of {args.tries}): "
        f"shipped {reach[Counted] / MB:.1f} MB, before {reach[WallPaced] / MB:.1f} MB"
    )
    print(f"  ratio shipped / before: {reach[Counted] / reach[WallPaced]:.2f}" if math.isfinite(reach[WallPaced]) else "  before: never seen")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
