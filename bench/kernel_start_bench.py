"""The CPU one kernel start costs: our launcher (ipykernel without its debugger) against ipykernel's own, in the same run.

Each start is a fresh ipykernel on this interpreter, started by jupyter-client with the same options
and start-up code as a session's kernel (no sandbox), timed until it answers `kernel_info`; the
figure is the CPU (user + system) its process spent by then, the median of `--runs` starts of each
way, alternating, so a busy machine weighs on both alike. ipykernel imports debugpy at every start
wherever it is installed; ours leaves it out (a cell that imports it still gets it).

    python bench/kernel_start_bench.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import psutil
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager

from taskweaver_lite.kernel.process import InterpreterKernelManager


def started_cpu(argv: list[str], folder: Path) -> float:
    """CPU seconds the kernel `argv` starts has spent when it first answers."""
    manager = KernelManager(connection_file=str(folder / "connection.json"), transport="ipc", ip=str(folder / "kernel"))  # as a session: no TCP
    manager._kernel_spec = KernelSpec(argv=argv, display_name="bench", language="python")
    manager.start_kernel(cwd=str(folder))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        pid = manager.provisioner.process.pid  # type: ignore[union-attr]
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="starts of each way, alternating")
    args = parser.parse_args()
    ours = list(InterpreterKernelManager(python=sys.executable).kernel_spec.argv)
    launcher = ours.index("ipykernel_launcher")
    theirs = [sys.executable, "-m", "ipykernel_launcher", *ours[launcher + 1 :]]  # the same options and start-up code
    ways = {"our launcher (no debugger)": ours, "ipykernel's launcher": theirs}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as folder:
        for run in range(args.runs):
            for name, argv in ways.items():
                start = Path(folder) / f"{run}-{len(seconds[name])}-{name[:4]}"
                start.mkdir()
                seconds[name].append(started_cpu(argv, start))
    ours_cpu, theirs_cpu = (statistics.median(seconds[name]) for name in ways)
    print(f"CPU of one kernel start until it answers, median of {args.runs}")
    for name, cpu in zip(ways, (ours_cpu, theirs_cpu), strict=True):
        print(f"{name:30} {cpu * 1000:6.0f} ms  {cpu / theirs_cpu:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
