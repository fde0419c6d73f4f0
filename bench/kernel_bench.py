"""Benchmark of the Jupyter executor against bare jupyter-client, measured side by side in one run.

    .venv/bin/python bench/kernel_bench.py [--starts 5] [--cells 300]

Measures: kernel ready time (vs `KernelManager.start_kernel` + `wait_for_ready`), the round trip
of `x = 1` (vs bare `execute` + wait for idle), the variable snapshot with 50 variables of which 5
are 1M-row DataFrames, and how long a dead kernel (`os._exit(1)`) goes unnoticed (the bare client
notices nothing: it gives up when its 30 s read timeout runs out, measured once). Medians.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor

# 45 small variables plus 5 DataFrames of 1M rows and 4 columns (~32 MB each).
FIFTY_VARIABLES = """
del x
import numpy as np, pandas as pd
for _i in range(5):
    globals()[f"frame{_i}"] = pd.DataFrame({"a": np.arange(1_000_000), "b": np.ones(1_000_000),
                                            "c": np.zeros(1_000_000, dtype="int32"), "d": ["x"] * 1_000_000})
for _i in range(15):
    globals()[f"number{_i}"] = _i * 1.5
    globals()[f"label{_i}"] = f"label number {_i}"
    globals()[f"items{_i}"] = list(range(_i * 100))
"""
SNAPSHOT_TIMING = """
import sys as _s, time as _t
_f = _s.modules["_taskweaver_snapshot"].snapshot
_t0 = _t.perf_counter()
for _ in range(50):
    _f()
print((_t.perf_counter() - _t0) / 50 * 1000)
"""


def bare_start() -> tuple[KernelManager, BlockingKernelClient]:
    """The baseline: a kernel as jupyter-client starts it by default."""
    manager = KernelManager()
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return manager, client


BARE_WAIT = 30.0  # seconds the baseline waits for each iopub message before giving up


def bare_execute(client: BlockingKernelClient, code: str) -> None:
    """The baseline cell: execute, then read iopub until the kernel is idle again."""
    msg_id = client.execute(code)
    while True:
        msg = client.get_iopub_msg(timeout=BARE_WAIT)
        if msg["parent_header"].get("msg_id") == msg_id and msg["content"].get("execution_state") == "idle":
            break
    client.get_shell_msg(timeout=30)  # keep the shell queue empty; the reply is already there


def ratio_row(label: str, bare: float, ours: float, *, digits: int) -> tuple[str, str, str, str]:
    """One table row from two durations in seconds."""
    return (label, f"{bare * 1000:.{digits}f} ms", f"{ours * 1000:.{digits}f} ms", f"{ours / bare:.2f}x")


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure_ready(starts: int, root: Path) -> tuple[float, float]:
    bare: list[float] = []
    ours: list[float] = []
    config = ExecutionConfig()
    for round_number in range(starts):
        started = time.perf_counter()
        manager, client = bare_start()
        bare.append(time.perf_counter() - started)
        client.stop_channels()
        manager.shutdown_kernel(now=True)

        started = time.perf_counter()
        executor = KernelExecutor(root / f"ready{round_number}", config=config)
        executor.wait_ready()
        ours.append(time.perf_counter() - started)
        executor.shutdown()
    return statistics.median(bare), statistics.median(ours)


def measure_round_trip(executor: KernelExecutor, client: BlockingKernelClient, cells: int) -> tuple[float, float]:
    bare: list[float] = []
    ours: list[float] = []
    for _ in range(20):  # warm both kernels
        bare_execute(client, "x = 1")
        executor.run("x = 1")
    for _ in range(cells):
        bare.append(timed(lambda: bare_execute(client, "x = 1")))
        ours.append(timed(lambda: executor.run("x = 1")))
    return statistics.median(bare), statistics.median(ours)


def measure_bare_death() -> float:
    """How long bare jupyter-client takes to give up on a cell whose kernel died: nothing watches the process, so its read times out."""
    manager, client = bare_start()
    try:
        bare_execute(client, "y = 2")
        started = time.perf_counter()
        try:
            bare_execute(client, "import os; os._exit(1)")
        except queue.Empty:
            return time.perf_counter() - started
        raise RuntimeError("the bare client got an answer from a kernel that exited")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def measure_death(executor: KernelExecutor, repeats: int) -> tuple[float, float]:
    detected: list[float] = []
    total: list[float] = []
    for _ in range(repeats):
        executor.run("y = 2")
        started = time.perf_counter()
        result = executor.run("import os; os._exit(1)")
        total.append(time.perf_counter() - started)
        if not (result.kernel_died and "y" in result.lost_variables):
            raise RuntimeError(f"the dead kernel was not reported: {result}")
        detected.append(result.elapsed)
    return statistics.median(detected), statistics.median(total)


def main() -> None:
    """Run every measurement and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="kernel starts per side")
    parser.add_argument("--cells", type=int, default=300, help="`x = 1` cells per side")
    args = parser.parse_args()
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="kernel-bench-") as tmp:
        root = Path(tmp)
        bare_ready, our_ready = measure_ready(args.starts, root)
        rows.append(ratio_row("kernel ready", bare_ready, our_ready, digits=0))

        manager, client = bare_start()
        executor = KernelExecutor(root / "session", config=ExecutionConfig())
        try:
            bare_trip, our_trip = measure_round_trip(executor, client, args.cells)
            rows.append(ratio_row("`x = 1` round trip", bare_trip, our_trip, digits=2))

            executor.run(FIFTY_VARIABLES)
            count = len(executor.variables())
            in_kernel = float(executor.run(SNAPSHOT_TIMING).stdout)
            bare_execute(client, FIFTY_VARIABLES)
            bare_full, our_full = measure_round_trip(executor, client, max(args.cells // 3, 30))
            rows.append((f"snapshot alone ({count} vars, 5x1M-row frames)", "-", f"{in_kernel:.2f} ms", "-"))
            rows.append(ratio_row("`x = 1` round trip, with those vars", bare_full, our_full, digits=2))

            detected, total = measure_death(executor, 3)
            bare_gave_up = measure_bare_death()
            bare_cell = f"{bare_gave_up * 1000:.0f} ms (read timeout)"
            rows.append(("dead kernel noticed (os._exit)", bare_cell, f"{detected * 1000:.0f} ms", f"{detected / bare_gave_up:.3f}x"))
            rows.append(("  ... and running again (restart)", "-", f"{total * 1000:.0f} ms", "-"))
        finally:
            executor.shutdown()
            client.stop_channels()
            manager.shutdown_kernel(now=True)

    table = [("measure", "bare jupyter-client", "KernelExecutor", "ratio"), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
