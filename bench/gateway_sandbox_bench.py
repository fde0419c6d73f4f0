"""What the sandbox costs on a gateway: `taskweaver-lite gateway` against a plain `jupyter kernelgateway`, side by side in one run.

    .venv/bin/python bench/gateway_sandbox_bench.py [--starts 8] [--cells 200]

Both gateways run on 127.0.0.1 at once; each measurement alternates between them, so load on the
machine falls on both alike. Per kernel start: from `GatewayExecutor` made to the kernel ready for
its first cell (REST start, WebSocket, our start-up code: what a session waits for), with the
kernel ended after each. Per cell: the round trip of `x = 1` through `GatewayExecutor.run`. Medians
and the ratio sandboxed / plain.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from taskweaver_lite.config.settings import ExecutionConfig, KernelGatewayConfig
from taskweaver_lite.kernel.gateway.remote import GatewayExecutor, KernelHandover
from taskweaver_lite.testing.kernel_gateway import Gateway, kernel_gateway, sandbox_gateway


def executor_for(gateway: Gateway, folder: Path) -> GatewayExecutor:
    config = KernelGatewayConfig(url=gateway.url, token=gateway.token, connect_timeout=60)
    return GatewayExecutor(folder, config=ExecutionConfig(), gateway=config, kernel=KernelHandover(owner="bench"))


def time_start(gateway: Gateway, folder: Path) -> float:
    """Seconds from the executor made to its kernel ready; the kernel is ended afterwards."""
    started = time.perf_counter()
    executor = executor_for(gateway, folder)
    executor.wait_ready()
    took = time.perf_counter() - started
    executor.shutdown()
    return took


def time_cells(executor: GatewayExecutor, cells: int) -> list[float]:
    """Seconds per `x = 1`, each."""
    times = []
    for _ in range(cells):
        started = time.perf_counter()
        assert executor.run("x = 1").success
        times.append(time.perf_counter() - started)
    return times


def project(folder: Path) -> Path:
    """The sandboxed gateway's project: the defaults (`execution.sandbox: auto`, the syscall filter on), culling off for the run."""
    folder.mkdir(parents=True)
    (folder / "taskweaver_config.yaml").write_text(yaml.safe_dump({"gateway": {"cull_idle_timeout": 0, "max_kernels_per_user": None}}), encoding="utf-8")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=8)
    parser.add_argument("--cells", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "plain").mkdir()
        with kernel_gateway(root / "plain") as plain, sandbox_gateway(project(root / "project")) as ours:
            gateways = {"plain": plain, "sandboxed": ours}
            starts: dict[str, list[float]] = {name: [] for name in gateways}
            for number in range(args.starts):
                for name, gateway in gateways.items():
                    starts[name].append(time_start(gateway, root / "sessions" / f"{name}-{number}"))
            executors = {name: executor_for(gateway, root / "sessions" / f"{name}-cells") for name, gateway in gateways.items()}
            cells: dict[str, list[float]] = {name: [] for name in gateways}
            try:
                for executor in executors.values():
                    executor.wait_ready()
                    time_cells(executor, 10)  # warm up
                for _ in range(10):  # in rounds, alternating
                    for name, executor in executors.items():
                        cells[name] += time_cells(executor, max(args.cells // 10, 1))
            finally:
                for executor in executors.values():
                    executor.shutdown()
    report(starts, cells)


def report(starts: dict[str, list[float]], cells: dict[str, list[float]]) -> None:
    start = {name: statistics.median(values) for name, values in starts.items()}
    cell = {name: statistics.median(values) for name, values in cells.items()}
    print(f"{'':34} {'plain':>10} {'sandboxed':>10} {'ratio':>7}")
    for label, values, digits in (("kernel start to ready (median)", start, 0), ("cell x = 1 round trip (median)", cell, 1)):
        plain, ours = values["plain"] * 1000, values["sandboxed"] * 1000
        print(f"{label:34} {plain:8.{digits}f}ms {ours:8.{digits}f}ms {ours / plain:6.2f}x")
    print(f"(starts: {len(starts['plain'])} each; cells: {len(cells['plain'])} each)")


if __name__ == "__main__":
    main()
