"""Which executor a session gets, chosen in one place by what the config asks for.

A kernel on `execution.kernel_gateway` when one is set (the gateway extra), else a Jupyter kernel on
this machine (in the sandbox or not: `execution.sandbox`). A session opened by `%%ask` inside a
notebook runs its cells in that notebook's own kernel instead (`own_kernel_factory`): no new kernel,
no sandbox, the notebook's namespace. A kernel on a gateway may outlive the
process that started it (a replica's): its `KernelHandover` says which kernel to attach to and whether
to leave it running. What a session asks of either, whether a kernel came back with the session's
variables and whether a stale copy can catch up on it included, is the `Executor` protocol (interface.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.kernel.interface import ExecutorFactory
from taskweaver_lite.records.plugin_spec import PluginSpec

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from taskweaver_lite.kernel.gateway.remote import KernelHandover


def executor_factory(config: Config, *, plugins: Sequence[PluginSpec] = (), handover: KernelHandover | None = None) -> ExecutorFactory:
    """A Jupyter kernel per session, started in the background with `plugins` loaded: on `execution.kernel_gateway`, else here.

    `handover` (a gateway's kernel only): the kernel to attach to, and whether it outlives this process.
    """
    gateway = config.execution.kernel_gateway
    if gateway is not None:
        try:
            from taskweaver_lite.kernel.gateway.remote import GatewayExecutor, KernelHandover
        except ImportError as exc:
            raise ConfigError(f"execution.kernel_gateway needs {exc.name}: pip install 'taskweaver-lite[gateway]'") from exc
        kernel = handover or KernelHandover()
        return functools.partial(
            GatewayExecutor, config=config.execution, gateway=gateway, output_tokens=config.cell_output_tokens, plugins=tuple(plugins), kernel=kernel
        )
    if handover is not None:
        raise ValueError("a kernel handover needs execution.kernel_gateway: a kernel on this machine ends with its process")
    from taskweaver_lite.kernel.executor import KernelExecutor

    # A sandboxed kernel sees neither the project folder nor the store (wherever store.path puts it), nor the sign-in key's folder.
    key_folder = config.sign_in_key_path.parent
    hidden = (config.project_dir, config.store_path.parent, *((key_folder,) if key_folder != Path(key_folder.anchor) else ()))
    return functools.partial(
        KernelExecutor, config=config.execution, output_tokens=config.cell_output_tokens, plugins=tuple(plugins), hidden=hidden, mcp_servers=config.mcp.servers
    )


def own_kernel_factory(config: Config, *, shell: InteractiveShell) -> ExecutorFactory:
    """Cells run in `shell`, the IPython shell of this process (a notebook's kernel): its namespace is the session's."""
    from taskweaver_lite.kernel.own_kernel import OwnKernelExecutor

    return functools.partial(OwnKernelExecutor, shell=shell, config=config.execution, output_tokens=config.cell_output_tokens)
