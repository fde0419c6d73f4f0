"""A cell stopped at the disk limit: how long a cell whose child process writes takes to stop, against one that writes itself.

    .venv/bin/python bench/disk_stop_bench.py [--cells 8] [--busy 2] [--sandbox bubblewrap]

Measured side by side in one run, each cell under `execution.disk_limit: 20MB` and followed by a
cell that deletes what it wrote (which must run):

- a child writer: the cell waits on `sh` writing 1 MB files in a loop (`subprocess.run`). The watcher
  interrupts the cell, waits for the kernel to say it raised the interrupt (a sandboxed kernel is
  interrupted by a message), then ends the writer;
- the baseline, a cell writing 1 MB pieces itself in Python: the interrupt alone stops it.

Printed: each kind's median and worst time from the cell's start to its result, their ratio, and how
many of the cells after them failed (an interrupt that landed late fails the next cell). `--busy`
processes spin beside it (a loaded CI machine; 0: idle).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor

CHILD = "import subprocess\nsubprocess.run(['sh', '-c', 'i=0; while true; do i=$((i+1)); head -c 1048576 /dev/zero > w-$i; done'])"
ITSELF = "i = 0\nwhile True:\n    i += 1\n    with open(f'w-{i}', 'wb') as f:\n        f.write(bytes(1048576))"
CLEAN = "import glob, os\nfor name in glob.glob('w-*'): os.remove(name)"


def stops(executor: KernelExecutor, code: str, cells: int) -> tuple[list[float], int, int]:
    """Each cell's seconds to its result; how many were not stopped at the limit; how many cleaning cells after them failed."""
    elapsed, unstopped, failed = [], 0, 0
    for _ in range(cells):
        result = executor.run(code)
        elapsed.append(result.elapsed)
        unstopped += "execution.disk_limit" not in result.limit_reached
        failed += not executor.run(CLEAN).success
    return elapsed, unstopped, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=8, help="cells of each kind")
    parser.add_argument("--busy", type=int, default=2, help="processes spinning beside it (0: an idle machine)")
    parser.add_argument("--sandbox", default="bubblewrap", choices=("bubblewrap", "none"), help="execution.sandbox")
    args = parser.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        with tempfile.TemporaryDirectory() as folder:
            config = ExecutionConfig(sandbox=args.sandbox, disk_limit="20MB", timeout=120)
            with KernelExecutor(Path(folder) / "sessions" / "s", config=config) as executor:
                executor.run("x = 1")  # the kernel started: not what is measured
                measured: dict[str, tuple[list[float], int, int]] = {}
                for _ in range(2):  # in turn, so that a drifting load weighs on both alike
                    for name, code in (("child writer", CHILD), ("writes itself", ITSELF)):
                        times, unstopped, failed = stops(executor, code, args.cells // 2)
                        before = measured.get(name, ([], 0, 0))
                        measured[name] = (before[0] + times, before[1] + unstopped, before[2] + failed)
    finally:
        for spinner in spinners:
            spinner.kill()
    print(f"{args.cells} cells each, sandbox {args.sandbox}, {args.busy} busy processes beside")
    print(f"{'cell':<14} {'median s':>9} {'worst s':>8} {'not stopped':>12} {'next cell failed':>17}")
    for name, (times, unstopped, failed) in measured.items():
        print(f"{name:<14} {statistics.median(times):9.2f} {max(times):8.2f} {unstopped:12d} {failed:17d}")
    child, itself = (statistics.median(measured[name][0]) for name in ("child writer", "writes itself"))
    print(f"child writer / writes itself, median: {child / itself:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
