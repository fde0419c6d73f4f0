"""What `taskweaver-lite gateway` adds inside the real Jupyter Kernel Gateway, so that it is a boundary between the users it serves.

This module runs in the gateway's process (Kernel Gateway imports it as its API module); launch.py
checks, prepares and starts it.

What is ours is small; the rest is Kernel Gateway as it ships:

- its only kernelspec (`taskweaver-lite`, forced for every start whatever a client asks) names
  `SandboxProvisioner` (provisioner.py), so each kernel starts in the local sandbox, in its own
  session's folder, over IPC sockets;
- its API personality is Kernel Gateway's own WebSocket one plus two routes,
  `DELETE /api/taskweaver-lite/sessions/<id>`: a deleted session's kernels end and its folder and log go;
  `GET /metrics`, behind the gateway's token: Prometheus's text format of the kernels per user
  (starting ones included), the starts `gateway.max_kernels_per_user` refused, the kernels ended to
  make room and those culled, each by user (user_limit.py keeps the counts);
- its token comes from `KG_AUTH_TOKEN` only (Kernel Gateway reads it there itself), and without
  one it will not listen on anything but loopback;
- idle kernels are culled (`gateway.cull_idle_timeout`, `gateway.cull_interval`: the culling settings of
  jupyter_server's mapping kernel manager, which Kernel Gateway's inherits).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from jupyter_server.utils import url_path_join
from kernel_gateway.jupyter_websocket import JupyterWebsocketPersonality
from kernel_gateway.mixins import JSONErrorsMixin, TokenAuthorizationMixin
from tornado import web
from traitlets import Unicode

from taskweaver_lite.kernel.gateway.provisioner import LOGS, SESSION_ROUTE, SESSIONS, kernels_of_session, session_name
from taskweaver_lite.kernel.gateway.user_limit import SETTING, KernelCounts


class SessionHandler(TokenAuthorizationMixin, JSONErrorsMixin, web.RequestHandler):  # type: ignore[misc]  # Kernel Gateway's mixins are untyped
    """`DELETE /api/taskweaver-lite/sessions/<id>`: the session's kernels end and its folder and log on this machine go (204)."""

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
        (root / LOGS / f"{name}.log").unlink(missing_ok=True)
        self.set_status(204)
        self.finish()


class MetricsHandler(TokenAuthorizationMixin, web.RequestHandler):  # type: ignore[misc]  # Kernel Gateway's mixins are untyped
    """`GET /metrics`: the gateway's kernels per user, and the refusals, evictions and culls so far, in Prometheus's text format."""

    def get(self) -> None:
        """The counts as they are now."""
        counts = getattr(self.settings["kernel_manager"], "counts", None)
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(metrics_text(counts if isinstance(counts, KernelCounts) else KernelCounts()))


def metrics_text(counts: KernelCounts) -> str:
    """`counts` in Prometheus's text exposition format."""
    families = (
        ("taskweaver_gateway_kernels", "gauge", "Kernels each user has on this gateway now, starting ones included", counts.per_user()),
        ("taskweaver_gateway_kernel_starts_refused_total", "counter", f"Kernel starts refused by {SETTING}, by user", counts.refused),
        ("taskweaver_gateway_kernel_evictions_total", "counter", f"Kernels ended to make room under {SETTING}, by user", counts.evicted),
        ("taskweaver_gateway_kernel_culls_total", "counter", "Idle kernels culled (gateway.cull_idle_timeout), by user", counts.culled),
    )
    lines = []
    for name, kind, about, by_user in families:
        lines += [f"# HELP {name} {about}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{user="{user}"}} {value}' for user, value in sorted(by_user.items())]  # user names are safe names: no quoting needed
    return "\n".join(lines) + "\n"


class SandboxPersonality(JupyterWebsocketPersonality):  # type: ignore[misc]  # Kernel Gateway's classes are untyped
    """Kernel Gateway's WebSocket API, plus the route that removes a deleted session and the metrics."""

    root = Unicode("", config=True, help="the folder holding the sessions' folders (gateway.root)")

    def create_request_handlers(self) -> list[tuple[Any, ...]]:
        """Kernel Gateway's handlers, and ours first."""
        ours = [
            (url_path_join("/", self.parent.base_url, SESSION_ROUTE + "([^/]+)"), SessionHandler),
            (url_path_join("/", self.parent.base_url, "/metrics"), MetricsHandler),
        ]
        return [*ours, *super().create_request_handlers()]


def create_personality(*, parent: Any, log: Any) -> SandboxPersonality:
    """Kernel Gateway's hook for an API module (`KernelGatewayApp.api` names this module)."""
    return SandboxPersonality(parent=parent, log=log)
