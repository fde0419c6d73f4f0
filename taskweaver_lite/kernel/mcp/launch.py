"""Starting a session's MCP servers, seen from our side: the request that asks the kernel to start them, and its answer.

The servers run inside the kernel, as its children (`client.py` is the kernel's half): they reach
what the kernel reaches and no more. A server whose config says it needs the network is not
started while the kernel's sandbox has none; it is listed with the setting that would allow it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from taskweaver_lite.config.settings import McpServerConfig
from taskweaver_lite.kernel.mcp import client as kernel_client
from taskweaver_lite.kernel.namespace import expression_json
from taskweaver_lite.kernel.process import load_by_path
from taskweaver_lite.records.mcp_tools import McpServer

REPORT = "mcp_servers"
REPORT_EXPRESSION = {REPORT: f"__import__('sys').modules[{kernel_client.MODULE_NAME!r}].report()"}
# Seconds past the slowest server's start_timeout the kernel may take to answer the start request.
START_MARGIN = 15.0


class McpLaunch:
    """The servers a kernel starts (those allowed where it runs) and the ones refused before it starts, each with its line."""

    def __init__(self, servers: Mapping[str, McpServerConfig], *, network: bool) -> None:
        """`network`: whether the kernel reaches the network (no sandbox, or execution.network: true)."""
        self.servers = {name: spec for name, spec in servers.items() if network or not spec.network}
        self.refused = tuple(McpServer(name=name, error=_no_network(name)) for name, spec in servers.items() if spec.network and not network)

    @property
    def wait(self) -> float:
        """Seconds the start request may take: the slowest server's start timeout and a margin (0 without servers)."""
        return max((spec.start_timeout for spec in self.servers.values()), default=-START_MARGIN) + START_MARGIN

    def code(self) -> str:
        """The silent cell that loads the kernel's client and starts the servers ('' when there are none to start)."""
        if not self.servers:
            return ""
        specs = {name: spec.model_dump(mode="json") for name, spec in self.servers.items()}
        start = f"__import__('sys').modules[{kernel_client.MODULE_NAME!r}].start({json.dumps(specs)!r})"
        return f"{load_by_path(kernel_client.MODULE_NAME, kernel_client.__file__)}; {start}"

    def reported(self, reply: dict[str, Any] | None) -> tuple[McpServer, ...]:
        """Every configured server as the kernel's answer to the start request reports it (refused ones first)."""
        value = expression_json(reply or {}, REPORT)
        if not isinstance(value, dict):
            return (*self.refused, *(McpServer(name=name, error="the kernel did not answer the request that starts it") for name in self.servers))
        return (*self.refused, *(McpServer.from_dict(name, value.get(name)) for name in self.servers))


def _no_network(name: str) -> str:
    return (
        f"not started: it needs the network (mcp.servers.{name}.network: true) and the kernel's sandbox has none; "
        "set execution.network: true (or execution.sandbox: none) to let it run"
    )
