"""Code safety's costs: the sandbox's kernel start and round trip, and verification's time per cell.

1. Kernel ready: from `KernelExecutor(...)` to the kernel answering, with `execution.sandbox: none`
   and `bubblewrap`, alternated in one run. Target: sandbox / none <= 1.1.
2. Round trip: `x = 1` through `run()` on a warm kernel, both ways. Target: sandbox / none <= 1.1.
3. Verification: `CodeVerifier.check` on a 200-line analysis cell as a model writes one (comments,
   blank lines, one operation a line). Target: < 2 ms per cell. Also shown: 200 dense lines, and
   Python's own compile of them, the floor of any check that parses the cell.

4. Isolation, as root only: each sandboxed kernel under a uid of its own (its folders
   handed to it) against a shared `nobody`, alternated in one run. The `nobody` side is this code with
   `kernel_uid` patched to None (its fallback), not the earlier commit run; the output says so. Targets: kernel ready
   <= 1.1x, `x = 1` <= 1.05x.

5. Syscall filter: sandboxed kernels with `execution.syscall_filter: default` against
   `off`, started and run alternately in one run. Targets: kernel ready <= 1.05x, `x = 1` <= 1.05x.
6. Disk limit: `x = 1` with `execution.disk_limit` against without (the watcher's
   measure at each cell's edges and its thread), alternated; and one measure of a working folder
   of 40 files and of 10,000 files, the watcher's cost per look.

    python bench/safety_bench.py [--starts 6] [--cells 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.sandbox.bwrap import bwrap_path
from taskweaver_lite.kernel.sandbox.disk_limit import used
from taskweaver_lite.safety.verification import CodeVerifier

MODES = ("none", "bubblewrap")


def kernel_figures(root: Path, *, starts: int, cells: int) -> dict[str, tuple[float, float]]:
    """Median seconds to ready and per `x = 1`, by sandbox mode (starts alternate between modes)."""
    ready: dict[str, list[float]] = {mode: [] for mode in MODES}
    trips: dict[str, list[float]] = {mode: [] for mode in MODES}
    for n in range(starts):
        for mode in MODES:
            began = time.perf_counter()
            executor = KernelExecutor(root / f"{mode}-{n}", config=ExecutionConfig(sandbox=mode), hidden=(root,))
            try:
                executor.wait_ready()
                ready[mode].append(time.perf_counter() - began)
                executor.run("x = 0")
                for _ in range(cells // starts):
                    began = time.perf_counter()
                    executor.run("x = 1")
                    trips[mode].append(time.perf_counter() - began)
            finally:
                executor.shutdown()
    return {mode: (statistics.median(ready[mode]), statistics.median(trips[mode])) for mode in MODES}


IDENTITIES = ("shared nobody", "own uid")


def isolation_figures(root: Path, *, starts: int, cells: int) -> dict[str, tuple[float, float]]:
    """Median seconds to ready and per `x = 1` of sandboxed kernels as `nobody` (as before each got its own) and under their own uid.

    Each round starts one kernel of each (in alternating order), then alternates their `x = 1`
    round trips one by one, so the machine's noise falls on both alike.
    """
    ready: dict[str, list[float]] = {name: [] for name in IDENTITIES}
    trips: dict[str, list[float]] = {name: [] for name in IDENTITIES}
    for n in range(starts):
        running: dict[str, KernelExecutor] = {}
        try:
            for name in IDENTITIES if n % 2 == 0 else IDENTITIES[::-1]:
                running[name] = _started(root / f"iso-{n}-{name.split()[0]}", own_uid=name == "own uid", ready=ready[name])
            for _ in range(cells // starts):
                for name, executor in running.items():
                    began = time.perf_counter()
                    executor.run("x = 1")
                    trips[name].append(time.perf_counter() - began)
        finally:
            for executor in running.values():
                executor.shutdown()
    return {name: (statistics.median(ready[name]), statistics.median(trips[name])) for name in IDENTITIES}


def _started(folder: Path, *, own_uid: bool, ready: list[float]) -> KernelExecutor:
    """A sandboxed kernel, ready and warmed up; its time to ready appended to `ready`."""
    config = ExecutionConfig(sandbox="bubblewrap")
    began = time.perf_counter()
    if own_uid:
        executor = KernelExecutor(folder / "sessions" / "s", config=config, hidden=(folder,))
    else:  # no uid of its own: the sandbox falls back to nobody, the identity every kernel had before
        with mock.patch("taskweaver_lite.kernel.executor.kernel_uid", return_value=None):
            executor = KernelExecutor(folder / "sessions" / "s", config=config, hidden=(folder,))
    executor.wait_ready()
    ready.append(time.perf_counter() - began)
    executor.run("x = 0")
    return executor


FILTERS = ("off", "default")


def filter_figures(root: Path, *, starts: int, cells: int) -> dict[str, tuple[float, float]]:
    """Median seconds to ready and per `x = 1` of sandboxed kernels without and with the syscall filter.

    Each round starts one kernel of each (in alternating order), then alternates their round trips
    one by one, so the machine's noise falls on both alike.
    """
    ready: dict[str, list[float]] = {mode: [] for mode in FILTERS}
    trips: dict[str, list[float]] = {mode: [] for mode in FILTERS}
    for n in range(starts):
        running: dict[str, KernelExecutor] = {}
        try:
            for mode in FILTERS if n % 2 == 0 else FILTERS[::-1]:
                config = ExecutionConfig(sandbox="bubblewrap", syscall_filter=mode)
                began = time.perf_counter()
                running[mode] = KernelExecutor(root / f"filter-{n}-{mode}" / "sessions" / "s", config=config, hidden=(root,))
                running[mode].wait_ready()
                ready[mode].append(time.perf_counter() - began)
                running[mode].run("x = 0")
            _alternate(running, trips, cells // starts)
        finally:
            for executor in running.values():
                executor.shutdown()
    return {mode: (statistics.median(ready[mode]), statistics.median(trips[mode])) for mode in FILTERS}


def _alternate(running: dict[str, KernelExecutor], trips: dict[str, list[float]], cells: int) -> None:
    """`x = 1` on each running kernel in turn, `cells` times, the seconds of each appended to `trips`."""
    for _ in range(cells):
        for name, executor in running.items():
            began = time.perf_counter()
            executor.run("x = 1")
            trips[name].append(time.perf_counter() - began)


LIMITS = ("no limit", "disk_limit")


def disk_limit_figures(root: Path, *, cells: int) -> dict[str, float]:
    """Median seconds per `x = 1` on a kernel without and with `execution.disk_limit`, alternated, 40 files in each folder."""
    trips: dict[str, list[float]] = {name: [] for name in LIMITS}
    running: dict[str, KernelExecutor] = {}
    try:
        for name in LIMITS:
            config = ExecutionConfig(sandbox="none", disk_limit="2GB" if name == "disk_limit" else None)
            running[name] = KernelExecutor(root / f"disk-{name.replace(' ', '-')}" / "sessions" / "s", config=config)
            running[name].run("for i in range(40):\n    open(f'file-{i}.csv', 'w').write('a,b\\n' * 1000)")
        _alternate(running, trips, cells)
    finally:
        for executor in running.values():
            executor.shutdown()
    return {name: statistics.median(trips[name]) for name in LIMITS}


def measure_ms(root: Path, files: int, repeats: int = 20) -> float:
    """Median milliseconds one measure of a folder of `files` small files (in 10 subfolders) takes."""
    folder = root / f"measure-{files}"
    for i in range(files):
        sub = folder / f"d{i % 10}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{i}.txt").write_text("x" * 100)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        used((folder,))
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def print_containment(starts: int, cells: int) -> None:
    """5 and 6: the syscall filter's and the disk limit's costs."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
        figures = filter_figures(Path(root), starts=starts, cells=cells)
        limits = disk_limit_figures(Path(root), cells=cells)
        small, large = measure_ms(Path(root), 40), measure_ms(Path(root), 10_000)
    (ready_off, trip_off), (ready_on, trip_on) = figures["off"], figures["default"]
    print(f"5. Syscall filter, kernel ready: off {ready_off:.3f} s, default {ready_on:.3f} s: ratio {ready_on / ready_off:.2f} (target <= 1.05)")
    print(f"   Syscall filter, x = 1: off {trip_off * 1000:.2f} ms, default {trip_on * 1000:.2f} ms: ratio {trip_on / trip_off:.2f} (target <= 1.05)")
    base, kept = limits["no limit"], limits["disk_limit"]
    print(f"6. Disk limit, x = 1: none {base * 1000:.2f} ms, 2GB {kept * 1000:.2f} ms: +{(kept - base) * 1000:.2f} ms per cell, ratio {kept / base:.2f}")
    print(f"   One measure of the working folder: 40 files {small:.3f} ms, 10,000 files {large:.1f} ms (looked at every 20 ms in a cell)")


def analysis_cell(lines: int, *, dense: bool = False) -> str:
    """An analysis cell of `lines` lines as a model writes one: comments, blank lines, group-bys, prints, a plot.

    `dense`: every line a long pandas expression (no comments or blank lines), the worst case.
    """
    body = ["import pandas as pd", "import numpy as np", "import matplotlib.pyplot as plt", "", "df = pd.read_csv('sales.csv')"]
    n = 0
    while len(body) < lines - 2:
        n += 1
        block = [
            f"part_{n} = df[df['units'] > {n}].groupby('region')['revenue'].agg(['sum', 'mean'])",
            f"print(f'part {n}:', part_{n}.shape, round(float(part_{n}['sum'].sum()), 2))",
            f"share_{n} = part_{n}['sum'] / part_{n}['sum'].sum() if len(part_{n}) else np.nan",
        ]
        plain = [
            f"# Revenue by region where more than {n} units sold",
            f"subset_{n} = df[df['units'] > {n}]",
            f"total_{n} = subset_{n}['revenue'].sum()",
            f"print('units >', {n}, 'revenue', round(total_{n}, 2))",
            "",
        ]
        body += block if dense else plain
    body = [*body[: lines - 2], "fig, ax = plt.subplots()", "ax.plot(range(10)); plt.savefig('trend.png'); plt.show()"]
    return "\n".join(body)


def verification_ms(lines: int, repeats: int = 200, *, dense: bool = False) -> float:
    """Median milliseconds `CodeVerifier().check` takes on a `lines`-line cell."""
    verifier, cell = CodeVerifier(), analysis_cell(lines, dense=dense)
    assert not verifier.check(cell), "the bench's cell must pass verification"
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        verifier.check(cell)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def compile_ms(lines: int, repeats: int = 200) -> float:
    """Median milliseconds Python's own `compile` takes on the dense cell: the floor of any check that parses it."""
    cell = analysis_cell(lines, dense=True)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        compile(cell, "<cell>", "exec")
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=6, help="kernel starts per mode (alternating)")
    parser.add_argument("--cells", type=int, default=200, help="`x = 1` round trips per mode")
    args = parser.parse_args()
    print(
        f"3. Verification of a 200-line cell: {verification_ms(200):.2f} ms median (target < 2 ms); "
        f"200 dense lines: {verification_ms(200, dense=True):.2f} ms; compiling that cell alone: {compile_ms(200):.2f} ms"
    )
    if bwrap_path() is None:
        print("bubblewrap (bwrap) is not installed: no sandbox figures (apt-get install bubblewrap)")
        return 1
    with tempfile.TemporaryDirectory() as root:
        figures = kernel_figures(Path(root), starts=args.starts, cells=args.cells)
    (ready_none, trip_none), (ready_box, trip_box) = figures["none"], figures["bubblewrap"]
    print(f"1. Kernel ready: none {ready_none:.3f} s, bubblewrap {ready_box:.3f} s: ratio {ready_box / ready_none:.2f} (target <= 1.1)")
    print(f"2. x = 1 round trip: none {trip_none * 1000:.2f} ms, bubblewrap {trip_box * 1000:.2f} ms: ratio {trip_box / trip_none:.2f} (target <= 1.1)")
    print_containment(args.starts, args.cells)
    if os.geteuid() != 0:
        print("4. Isolation: not root, so kernels keep your uid (in a user namespace): nothing to compare")
        return 0
    with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
        iso = isolation_figures(Path(root), starts=args.starts, cells=args.cells)
    (ready_old, trip_old), (ready_new, trip_new) = iso["shared nobody"], iso["own uid"]
    print("4. 'shared nobody' is today's code with kernel_uid patched to return None (the sandbox's fallback to nobody),")
    print("   standing in for the code before per-kernel uids: not a run of the earlier commit.")
    print(f"4. Isolation, kernel ready: shared nobody {ready_old:.3f} s, own uid {ready_new:.3f} s: ratio {ready_new / ready_old:.2f} (target <= 1.1)")
    print(f"   Isolation, x = 1: shared nobody {trip_old * 1000:.2f} ms, own uid {trip_new * 1000:.2f} ms: ratio {trip_new / trip_old:.2f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
