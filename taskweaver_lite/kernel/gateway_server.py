"""`taskweaver-lite gateway`: the real Jupyter Kernel Gateway, set up so that it is a boundary between the users it serves.

What is ours is small; the rest is Kernel Gateway as it ships:

- its only kernelspec (`taskweaver-lite`, forced for every start whatever a client asks) names
  `SandboxProvisioner` (provisioner.py), so each kernel starts in the local sandbox, in its own
  session's folder, over IPC sockets;
- its API personality is Kernel Gateway's own WebSocket one plus one route,
  `DELETE /api/taskweaver-lite/sessions/<id>`: a deleted session's kernels end and its folder goes;
- its token comes from `KG_AUTH_TOKEN` only (Kernel Gateway reads it there itself), and without
  one it will not listen on anything but loopback;
- idle kernels are culled (`gateway.cull_idle_timeout`, `gateway.cull_interval`: the culling settings of
  jupyter_server's mapping kernel manager, which Kernel Gateway's inherits).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from jupyter_server.utils import url_path_join
from kernel_gateway.jupyter_websocket import JupyterWebsocketPersonality
from kernel_gateway.mixins import JSONErrorsMixin, TokenAuthorizationMixin
from tornado import web
from traitlets import Unicode

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.kernel.process import make_undumpable
from taskweaver_lite.kernel.provisioner import SESSION_ROUTE, SESSIONS, kernels_of_session, kernelspec, session_name
from taskweaver_lite.kernel.sandbox import fallback_notice, uses_sandbox

KERNEL_NAME = "taskweaver-lite"
TOKEN_VARIABLE = "KG_AUTH_TOKEN"


class SessionHandler(TokenAuthorizationMixin, JSONErrorsMixin, web.RequestHandler):  # type: ignore[misc]  # Kernel Gateway's mixins are untyped
    """`DELETE /api/taskweaver-lite/sessions/<id>`: the session's kernels end and its folder on this machine goes (204)."""

    async def delete(self, session: str) -> None:
        """End the session's kernels, remove its folder."""
        try:
            name = session_name({"KERNEL_TASKWEAVER_SESSION": session}, kernel_id="")
        except web.HTTPError:
            raise web.HTTPError(400, "not a session id") from None
        manager = self.settings["kernel_manager"]
        for kernel_id in kernels_of_session(manager, name):
            await manager.shutdown_kernel(kernel_id)
        root = Path(self.settings["kg_personality"].root)
        shutil.rmtree(root / SESSIONS / name, ignore_errors=True)
        self.set_status(204)
        self.finish()


class SandboxPersonality(JupyterWebsocketPersonality):  # type: ignore[misc]  # Kernel Gateway's classes are untyped
    """Kernel Gateway's WebSocket API, plus the route that removes a deleted session."""

    root = Unicode("", config=True, help="the folder holding the sessions' folders (gateway.root)")

    def create_request_handlers(self) -> list[tuple[Any, ...]]:
        """Kernel Gateway's handlers, and ours first."""
        ours = (url_path_join("/", self.parent.base_url, SESSION_ROUTE + "([^/]+)"), SessionHandler)
        return [ours, *super().create_request_handlers()]


def create_personality(*, parent: Any, log: Any) -> SandboxPersonality:
    """Kernel Gateway's hook for an API module (`KernelGatewayApp.api` names this module)."""
    return SandboxPersonality(parent=parent, log=log)


def is_loopback(ip: str) -> bool:
    """Whether `ip` is an address only this machine reaches (127.0.0.1, ::1, localhost)."""
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_can_start(config: Config, *, ip: str, environ: dict[str, str]) -> str | None:
    """ConfigError (one line) when the gateway must not start; a warning line to print, if any."""
    if not environ.get(TOKEN_VARIABLE) and not is_loopback(ip):
        raise ConfigError(
            f"taskweaver-lite gateway listens on {ip} without a token: set the {TOKEN_VARIABLE} environment variable "
            "(the replicas' execution.kernel_gateway.token), or listen on 127.0.0.1"
        )
    if config.execution.sandbox == "none":
        return "execution.sandbox is none: this gateway's kernels run unsandboxed, and its users can reach each other's files and kernels."
    if not uses_sandbox(config.execution):
        raise ConfigError(
            "taskweaver-lite gateway starts every kernel in the sandbox, and it cannot be built here: "
            f"{fallback_notice() or 'bubblewrap is not installed (Debian/Ubuntu: sudo apt-get install bubblewrap)'}"
        )
    return None


def prepare(config: Config) -> Path:
    """The gateway's private folders under gateway.root, with its kernelspec; returns the root."""
    root = config.gateway_root.resolve()
    for folder in (root, root / SESSIONS, root / "kernels", root / ".runtime", root / ".jupyter" / "kernels" / KERNEL_NAME):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)  # the sessions' folders are the kernels' own; nobody else on this machine looks in
    spec = kernelspec(project_dir=config.project_dir.resolve(), root=root)
    (root / ".jupyter" / "kernels" / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return root


def gateway_arguments(config: Config, *, root: Path, ip: str, port: int) -> list[str]:
    """Kernel Gateway's options: where it listens, our kernelspec alone, our personality, culling."""
    culling = config.gateway
    return [
        f"--KernelGatewayApp.ip={ip}", f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
        f"--KernelGatewayApp.api={__name__}", f"--SandboxPersonality.root={root}", "--SandboxPersonality.list_kernels=True",
        f"--KernelGatewayApp.default_kernel_name={KERNEL_NAME}", f"--KernelGatewayApp.force_kernel_name={KERNEL_NAME}",
        f"--KernelSpecManager.allowed_kernelspecs={KERNEL_NAME}", "--KernelSpecManager.ensure_native_kernel=False",
        f"--MappingKernelManager.cull_idle_timeout={culling.cull_idle_timeout}", f"--MappingKernelManager.cull_interval={culling.cull_interval}",
    ]  # fmt: skip


def run(config: Config, *, ip: str, port: int) -> None:
    """Run the gateway in this process until it is stopped (SIGTERM, Ctrl-C)."""
    from kernel_gateway.gatewayapp import KernelGatewayApp

    root = prepare(config)
    # Kernelspecs and runtime files from our folders only; the token stays in the environment, where Kernel Gateway reads it.
    os.environ["JUPYTER_PATH"] = str(root / ".jupyter")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(root / ".runtime")
    os.environ.pop("KG_FORCE_KERNEL_NAME", None)
    make_undumpable()
    KernelGatewayApp.launch_instance(argv=gateway_arguments(config, root=root, ip=ip, port=port))
    sys.stdout.flush()
