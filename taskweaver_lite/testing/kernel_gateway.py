"""Real kernel gateways on 127.0.0.1 for tests and benches (`jupyter kernelgateway`, `taskweaver-lite gateway`), and a TCP relay that can drop connections.

Both get their token through `KG_AUTH_TOKEN`: on the command line every process of the machine (a
kernel's too) could read it from `/proc/<pid>/cmdline`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from taskweaver_lite.testing.server_start import free_port as free_port  # where the tests and benches have found it
from taskweaver_lite.testing.server_start import wait_until_answering


@dataclass(frozen=True)
class Gateway:
    """A running gateway: where it listens, its token, the folder its kernels start in."""

    url: str
    token: str
    root: Path
    pid: int = 0  # the gateway's process


@contextlib.contextmanager
def kernel_gateway(root: Path, *, options: Sequence[str] = ()) -> Iterator[Gateway]:
    """`jupyter kernelgateway` on 127.0.0.1 with a fresh token, kernels starting in `root`; ended afterwards. `options`: more of its --flags."""
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(root / ".runtime"), "MPLBACKEND": "Agg", "KG_AUTH_TOKEN": token}
    args = [sys.executable, "-m", "jupyter", "kernelgateway", "--KernelGatewayApp.ip=127.0.0.1", f"--KernelGatewayApp.port={port}"]
    args += ["--KernelGatewayApp.port_retries=0", *options]
    with _running(args, cwd=root, env=env, port=port, token=token, root=root) as gateway:
        yield gateway


@contextlib.contextmanager
def sandbox_gateway(project: Path, *, overrides: Sequence[str] = (), port: int | None = None, token: str | None = None) -> Iterator[Gateway]:
    """`taskweaver-lite gateway -p project` on 127.0.0.1 with a fresh token; its `root` is where its sessions' folders are (gateway.root).

    `port` and `token`: those of a gateway stopped earlier, to start it again where its clients look for it.
    """
    from taskweaver_lite.config.file import load_config

    port, token = port or free_port(), token or secrets.token_hex(16)
    env = {**os.environ, "KG_AUTH_TOKEN": token}
    sets = [arg for item in overrides for arg in ("--set", item)]
    args = [sys.executable, "-m", "taskweaver_lite", "gateway", "-p", str(project), "--port", str(port), *sets]
    root = load_config(project, list(overrides)).gateway_root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    with _running(args, cwd=project, env=env, port=port, token=token, root=root) as gateway:
        yield gateway


@contextlib.contextmanager
def _running(args: list[str], *, cwd: Path, env: dict[str, str], port: int, token: str, root: Path) -> Iterator[Gateway]:
    """The gateway `args` start, its output in `<root>/gateway.log`, once it answers on `port`; stopped afterwards."""
    with (root / "gateway.log").open("wb") as log:
        process = subprocess.Popen(args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    gateway = Gateway(url=f"http://127.0.0.1:{port}", token=token, root=root, pid=process.pid)
    try:
        _wait_until_up(gateway, process)
        yield gateway
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_up(gateway: Gateway, process: subprocess.Popen[bytes]) -> None:
    def answers() -> bool:
        with contextlib.suppress(requests.RequestException):
            return requests.get(f"{gateway.url}/api", headers={"Authorization": f"token {gateway.token}"}, timeout=1).ok
        return False

    wait_until_answering(process, answers, what="the kernel gateway", log=gateway.root / "gateway.log")


class Relay:
    """A TCP relay in front of the gateway: `drop()` cuts every open connection, `refuse` turns new ones away."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.refuse = False
        self._closed = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self._closed:  # woken by `close`: a later socket may already hold our descriptor number
                client.close()
                return
            if self.refuse:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()

    def drop(self) -> None:
        """Cut every connection open now, both ways."""
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open = []

    def close(self) -> None:
        """Stop listening and cut everything."""
        self._closed = True
        # close() alone does not wake a thread blocked in accept(), which would then take the
        # connections of whatever socket reuses the descriptor number next; shutdown() does.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self.drop()


def _pump(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
