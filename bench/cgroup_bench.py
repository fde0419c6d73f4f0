"""What one user's busy kernel costs another's: alice's CPU loop beside bob's kernel running busy processes, with and without kernel cgroups.

Two local sandboxed kernels, alice's and bob's. Alice's cell times a fixed CPU loop inside her
kernel. Bob's cell leaves `--busy` processes spinning (as a cell that starts a pool and returns
does), each in a session of its own (`setsid`), so that Linux's per-session autogroups do not
already hold them to one share. Three conditions, alternated round by round in one run, each kernel pair started afresh:

- alone: bob's kernel idle (the baseline), with kernel cgroups;
- busy, no cgroups: bob's processes spinning, `execution.cgroup: off` (each process its own
  share of the CPU, as before kernels had cgroups);
- busy, cgroups: the same with `execution.cgroup: auto` (each kernel one group to the scheduler,
  capped at `--cpu-limit` cores: without a cap, Linux spreads a group's share over the cores it
  runs on, so a kernel spinning on both of two cores still takes a third of the other kernel's).

Printed: the median loop time of each and its ratio to the baseline. Target: busy, cgroups / alone
<= 1.10. Needs a machine where this program may make cgroups (root, or a delegated cgroup v2).

    python bench/cgroup_bench.py [--rounds 5] [--busy 4] [--loops 3] [--cpu-limit 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.sandbox import cgroup

LOOP = "import time\nbegan = time.perf_counter()\ntotal = 0\nfor i in range(6_000_000):\n    total += i * i\nprint(time.perf_counter() - began)"
# Each in a session of its own: Linux's autogroups (a scheduling group per session) no longer hold them to the kernel's share.
SPIN = (
    "import subprocess, sys\n"
    "spinners = [subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True) for _ in range({busy})]\n"
    "print(len(spinners))"
)
CONDITIONS = ("alone", "busy, no cgroups", "busy, cgroups")


def one_round(root: Path, condition: str, *, busy: int, loops: int, cpu_limit: float) -> list[float]:
    """Alice's loop times (seconds) under `condition`, with a fresh pair of kernels."""
    setting = "off" if condition == "busy, no cgroups" else "auto"
    config = ExecutionConfig.model_validate({"sandbox": "bubblewrap", "cgroup": setting, "cpu_limit": cpu_limit, "timeout": 600})
    alice = KernelExecutor(root / "alice", config=config)
    bob = KernelExecutor(root / "bob", config=config)
    try:
        alice.wait_ready()
        bob.wait_ready()
        alice.run(LOOP)  # warm
        if condition != "alone":
            started = bob.run(SPIN.format(busy=busy))
            if not started.success:
                raise SystemExit(f"bob's cell failed: {started.error}")
        times = []
        for _ in range(loops):
            result = alice.run(LOOP)
            if not result.success:
                raise SystemExit(f"alice's cell failed: {result.error}")
            times.append(float(result.stdout.strip()))
        return times
    finally:
        bob.shutdown()
        alice.shutdown()


def main() -> int:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three conditions (default 5)")
    parser.add_argument("--busy", type=int, default=4, help="bob's spinning processes (default 4)")
    parser.add_argument("--loops", type=int, default=3, help="alice's loops per round (default 3)")
    parser.add_argument("--cpu-limit", type=float, default=1.0, help="execution.cpu_limit of both kernels, in cores (default 1)")
    args = parser.parse_args()
    reason = cgroup.probe(cgroup.Caps())
    if reason is not None:
        print(f"cgroup_bench: no kernel cgroup can be made here ({reason}); nothing to measure", file=sys.stderr)
        return 1
    times: dict[str, list[float]] = {condition: [] for condition in CONDITIONS}
    with tempfile.TemporaryDirectory(prefix="cgroup-bench-") as folder:
        for n in range(args.rounds):
            for condition in CONDITIONS:
                times[condition] += one_round(
                    Path(folder) / f"{n}-{CONDITIONS.index(condition)}", condition, busy=args.busy, loops=args.loops, cpu_limit=args.cpu_limit
                )
    base = statistics.median(times["alone"])
    print(
        f"alice's loop (6M multiply-adds) beside bob's kernel with {args.busy} spinning processes; execution.cpu_limit {args.cpu_limit:g}; "
        f"{args.rounds} rounds x {args.loops} loops; {os.cpu_count()} cores"
    )
    print("| condition | median loop | ratio to alone |")
    print("| --- | --- | --- |")
    for condition in CONDITIONS:
        median = statistics.median(times[condition])
        aim = " (aim <= 1.10x)" if condition == "busy, cgroups" else ""
        print(f"| {condition} | {median:.3f} s | {median / base:.2f}x{aim} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
