"""`taskweaver-lite gateway`'s start: the checks before it listens, its private folders and kernelspec, Kernel Gateway's options.

What runs inside the gateway once it has started is server.py; this module imports nothing of
Kernel Gateway until `run`, so the checks cost nothing to load.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.kernel.gateway.provisioner import KERNELS, LOGS, SESSIONS, kernelspec
from taskweaver_lite.kernel.process import make_undumpable
from taskweaver_lite.kernel.sandbox import cgroup as kernel_cgroup
from taskweaver_lite.kernel.sandbox.bwrap import fallback_notice, uses_sandbox
from taskweaver_lite.telemetry.log_lines import one_line_handler

KERNEL_NAME = "taskweaver-lite"
TOKEN_VARIABLE = "KG_AUTH_TOKEN"
API_MODULE = "taskweaver_lite.kernel.gateway.server"  # Kernel Gateway's `api` option: the module it asks for its personality
KERNEL_MANAGER = "taskweaver_lite.kernel.gateway.user_limit.SandboxKernelManager"  # counts each user's kernels from their start


def is_loopback(ip: str) -> bool:
    """Whether `ip` is an address only this machine reaches (127.0.0.1, ::1, localhost)."""
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_can_start(config: Config, *, ip: str, environ: dict[str, str]) -> tuple[str, ...]:
    """ConfigError (one line) when the gateway must not start; the warning lines to print, if any."""
    warnings: list[str] = []
    if not environ.get(TOKEN_VARIABLE):
        if not is_loopback(ip):
            raise ConfigError(
                f"taskweaver-lite gateway listens on {ip} without a token: set the {TOKEN_VARIABLE} environment variable "
                "(the replicas' execution.kernel_gateway.token), or listen on 127.0.0.1"
            )
        warnings.append(
            f"taskweaver-lite gateway: no {TOKEN_VARIABLE} set, so every account on this machine may start kernels here "
            "and run code in any kernel whose id it learns: set it (the replicas' execution.kernel_gateway.token)."
        )
    if config.execution.cgroup == "auto" and (reason := kernel_cgroup.probe(kernel_cgroup.caps_for(config.execution))) is not None:
        warnings.append(kernel_cgroup.unavailable_notice(reason))
    if config.execution.sandbox == "none":
        warnings.append("execution.sandbox is none: this gateway's kernels run unsandboxed, and its users can reach each other's files and kernels.")
    elif not uses_sandbox(config.execution):
        raise ConfigError(
            "taskweaver-lite gateway starts every kernel in the sandbox, and it cannot be built here: "
            f"{fallback_notice() or 'bubblewrap is not installed (Debian/Ubuntu: sudo apt-get install bubblewrap)'}"
        )
    return tuple(warnings)


def prepare(config: Config) -> Path:
    """The gateway's private folders under gateway.root, with its kernelspec; returns the root."""
    root = config.gateway_root.resolve()
    for folder in (root, root / SESSIONS, root / KERNELS, root / LOGS, root / ".runtime", root / ".jupyter" / "kernels" / KERNEL_NAME):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)  # the sessions' folders are the kernels' own; nobody else on this machine looks in
    spec = kernelspec(project_dir=config.project_dir.resolve(), root=root)
    (root / ".jupyter" / "kernels" / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return root


def gateway_arguments(config: Config, *, root: Path, ip: str, port: int) -> list[str]:
    """Kernel Gateway's options: where it listens, our kernelspec alone, our personality, culling.

    Listing kernels (`GET /api/kernels`, `/api/sessions`) is off, whatever `KG_LIST_KERNELS` says:
    replicas never list, and a kernel's id is all that stands between a caller and its code.
    """
    culling = config.gateway
    return [
        f"--KernelGatewayApp.ip={ip}", f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
        f"--KernelGatewayApp.api={API_MODULE}", f"--SandboxPersonality.root={root}", "--SandboxPersonality.list_kernels=False",
        f"--KernelGatewayApp.kernel_manager_class={KERNEL_MANAGER}", f"--SandboxKernelManager.project_dir={config.project_dir.resolve()}",
        f"--KernelGatewayApp.default_kernel_name={KERNEL_NAME}", f"--KernelGatewayApp.force_kernel_name={KERNEL_NAME}",
        f"--KernelSpecManager.allowed_kernelspecs={KERNEL_NAME}", "--KernelSpecManager.ensure_native_kernel=False",
        f"--MappingKernelManager.cull_idle_timeout={culling.cull_idle_timeout}", f"--MappingKernelManager.cull_interval={culling.cull_interval}",
    ]  # fmt: skip


class _OnceEach(logging.Filter):
    """Lets through the first of each message that jupyter_client repeats for one kernel ("Kernel shutdown: <id>", up to 8 times)."""

    REPEATED = ("Kernel shutdown: ",)

    def __init__(self) -> None:
        super().__init__()
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self.REPEATED):
            return True
        if message in self._seen:
            return False
        self._seen[message] = None
        if len(self._seen) > 1000:
            self._seen.popitem(last=False)
        return True


def one_format(app_log: logging.Logger) -> None:
    """Every line the gateway's process writes in this program's form (UTC with its Z, one line each), ours, Jupyter's and tornado's alike."""
    handler = one_line_handler()
    handler.setLevel(logging.INFO)  # Jupyter's debug lines (each kernel's whole command line) stay out
    handler.addFilter(_OnceEach())
    for logger in (app_log, logging.getLogger("taskweaver_lite"), logging.getLogger("tornado"), logging.getLogger()):
        logger.handlers = [handler]
        logger.propagate = False
    logging.getLogger("taskweaver_lite").setLevel(logging.INFO)


def kernel_gateway_app() -> type[Any]:
    """Kernel Gateway's application class, imported without the IRI grammars jsonschema would build as it loads.

    jupyter_server's event log loads jsonschema, which imports rfc3987_syntax where it is installed
    (jupyter_events' `format-nongpl` extra brings it): that compiles 39 grammars as it loads, about
    1 s of CPU at every gateway start (of 1.4 s for all the gateway's imports), for the "iri" formats
    no schema in the gateway uses. Without it jsonschema leaves only those formats unchecked. This
    process is the gateway's own: no one else's code runs in it to miss them.
    """
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: its import raises ImportError, which jsonschema allows for
    from kernel_gateway.gatewayapp import KernelGatewayApp

    app: type[Any] = KernelGatewayApp
    return app


def run(config: Config, *, ip: str, port: int) -> None:
    """Run the gateway in this process until it is stopped (SIGTERM, Ctrl-C)."""
    gateway_app = kernel_gateway_app()
    root = prepare(config)
    # Kernelspecs and runtime files from our folders only; the token stays in the environment, where Kernel Gateway reads it.
    os.environ["JUPYTER_PATH"] = str(root / ".jupyter")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(root / ".runtime")
    os.environ.pop("KG_FORCE_KERNEL_NAME", None)
    make_undumpable()
    app = gateway_app.instance()
    app.initialize(argv=gateway_arguments(config, root=root, ip=ip, port=port))
    one_format(app.log)
    app.start()
    sys.stdout.flush()
