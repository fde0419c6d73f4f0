"""Benchmark of the gateway executor against bare gateway calls, side by side in one run.

    .venv/bin/python bench/gateway_bench.py [--starts 5] [--cells 300] [--upload-mb 10]

Starts a real `jupyter kernelgateway` on 127.0.0.1 and measures: the round trip of `x = 1`
through `GatewayExecutor.run` (with its variable snapshot) vs a bare execute over the same
gateway's WebSocket (send, read until idle and the reply; target <= 1.2x); the CPU a cell costs
the process running it, GatewayExecutor against KernelExecutor with a local kernel (ZeroMQ), the
kernels' own not counted (means, interleaved); kernel ready through the executor (REST start,
WebSocket, our start-up code) vs the REST start call alone; and a `/load` upload of a file of
random bytes through the kernel. Medians; the local kernel's own figures are in kernel_bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import socket
import statistics
import tempfile
import time
from pathlib import Path

import requests
import websocket
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session

from taskweaver_lite.config.settings import ExecutionConfig, KernelGatewayConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.gateway.remote import GatewayExecutor
from taskweaver_lite.testing.kernel_gateway import Gateway, kernel_gateway


def bare_execute(sock: websocket.WebSocket, session: Session, code: str, *, quick_ack: bool = True) -> None:
    """The baseline cell: one execute_request over the WebSocket, read until idle and the reply are in.

    `quick_ack` acknowledges packets at once as the executor does (see kernel/gateway/kernel.py `_ack_at_once`).
    """
    msg = session.msg("execute_request", {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False})
    msg["channel"] = "shell"
    sock.send(json.dumps(msg, default=json_default))
    msg_id = msg["header"]["msg_id"]
    idle = replied = False
    while not (idle and replied):
        if quick_ack and hasattr(socket, "TCP_QUICKACK") and sock.sock is not None:
            sock.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        answer = json.loads(sock.recv())
        if answer["parent_header"].get("msg_id") != msg_id:
            continue
        replied = replied or answer["channel"] == "shell"
        idle = idle or (answer["msg_type"] == "status" and answer["content"]["execution_state"] == "idle")


def rest_start(gateway: Gateway) -> str:
    """The baseline start: the gateway's REST call alone."""
    answer = requests.post(f"{gateway.url}/api/kernels", json={}, headers=auth(gateway), timeout=60)
    answer.raise_for_status()
    return str(answer.json()["id"])


def auth(gateway: Gateway) -> dict[str, str]:
    return {"Authorization": f"token {gateway.token}"}


def executor_for(gateway: Gateway, folder: Path) -> GatewayExecutor:
    return GatewayExecutor(folder, config=ExecutionConfig(), gateway=KernelGatewayConfig(url=gateway.url, token=gateway.token))


def measure_start(gateway: Gateway, root: Path, starts: int) -> tuple[float, float]:
    bare: list[float] = []
    ours: list[float] = []
    for number in range(starts):
        started = time.perf_counter()
        kernel_id = rest_start(gateway)
        bare.append(time.perf_counter() - started)
        requests.delete(f"{gateway.url}/api/kernels/{kernel_id}", headers=auth(gateway), timeout=30)
        started = time.perf_counter()
        executor = executor_for(gateway, root / f"start{number}")
        executor.wait_ready()
        ours.append(time.perf_counter() - started)
        executor.shutdown()
    return statistics.median(bare), statistics.median(ours)


def measure_round_trip(gateway: Gateway, root: Path, cells: int) -> tuple[float, float, float]:
    """Interleaved, so both see the same machine load: the executor's cell and a bare one, to one gateway."""
    executor = executor_for(gateway, root / "cells")
    executor.wait_ready()
    kernel_id = rest_start(gateway)
    address = f"ws{gateway.url.removeprefix('http')}/api/kernels/{kernel_id}/channels"
    sock = websocket.create_connection(address, header=[f"Authorization: token {gateway.token}"])
    session = Session(key=secrets.token_bytes(16))
    bare: list[float] = []
    ours: list[float] = []
    delayed: list[float] = []
    for _ in range(cells):
        started = time.perf_counter()
        bare_execute(sock, session, "x = 1", quick_ack=False)
        delayed.append(time.perf_counter() - started)
        started = time.perf_counter()
        bare_execute(sock, session, "x = 1")
        bare.append(time.perf_counter() - started)
        started = time.perf_counter()
        executor.run("x = 1")
        ours.append(time.perf_counter() - started)
    sock.close()
    requests.delete(f"{gateway.url}/api/kernels/{kernel_id}", headers=auth(gateway), timeout=30)
    executor.shutdown()
    return statistics.median(bare), statistics.median(ours), statistics.median(delayed)


def cpu_seconds() -> float:
    """This process's user + system CPU so far (the executors' threads included, not the kernels')."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure_cpu(gateway: Gateway, root: Path, cells: int) -> tuple[float, float]:
    """CPU per `x = 1` in the process that runs the cell: GatewayExecutor (over the WebSocket) against KernelExecutor (ZeroMQ), interleaved.

    What a server spends per cell on its kernel's messages, wherever the kernel runs (the kernels' own CPU is not counted).
    """
    remote = executor_for(gateway, root / "cpu-remote")
    local = KernelExecutor(root / "cpu-local", config=ExecutionConfig())
    remote.wait_ready()
    local.wait_ready()
    for _ in range(20):  # warm both
        remote.run("x = 1")
        local.run("x = 1")
    spent = {"remote": 0.0, "local": 0.0}
    for _ in range(cells):
        for name, executor in (("remote", remote), ("local", local)):
            before = cpu_seconds()
            executor.run("x = 1")
            spent[name] += cpu_seconds() - before
    remote.shutdown()
    local.shutdown()
    return spent["remote"] / cells, spent["local"] / cells


def measure_upload(gateway: Gateway, root: Path, megabytes: int) -> float:
    source = root / "upload.bin"
    source.write_bytes(os.urandom(megabytes * 1024 * 1024))
    executor = executor_for(gateway, root / "upload")
    executor.wait_ready()
    started = time.perf_counter()
    executor.upload(source)
    elapsed = time.perf_counter() - started
    executor.shutdown()
    return elapsed


def main() -> None:
    """Run every measurement and print one table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--upload-mb", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, kernel_gateway(Path(folder)) as gateway:
        root = Path(folder)
        bare_cell, our_cell, delayed_cell = measure_round_trip(gateway, root, args.cells)
        remote_cpu, local_cpu = measure_cpu(gateway, root, args.cells)
        bare_start, our_start = measure_start(gateway, root, args.starts)
        upload = measure_upload(gateway, root, args.upload_mb)
    rows = [
        ("measure", "bare gateway", "GatewayExecutor", "ratio"),
        ("x = 1 round trip", f"{bare_cell * 1000:.2f} ms", f"{our_cell * 1000:.2f} ms", f"{our_cell / bare_cell:.2f}x"),
        ("x = 1, delayed ACKs", f"{delayed_cell * 1000:.2f} ms", "-", f"{delayed_cell / bare_cell:.2f}x of bare"),
        ("CPU per x = 1, this process", f"{local_cpu * 1000:.2f} ms (local kernel)", f"{remote_cpu * 1000:.2f} ms", f"{remote_cpu / local_cpu:.2f}x"),
        ("kernel ready", f"{bare_start * 1000:.0f} ms (REST start)", f"{our_start * 1000:.0f} ms", f"{our_start / bare_start:.2f}x"),
        (f"upload {args.upload_mb} MB", "-", f"{upload * 1000:.0f} ms", f"{args.upload_mb / upload:.1f} MB/s"),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
