"""What `taskweaver-lite gateway` adds inside the real Jupyter Kernel Gateway, so that it is a boundary between the users it serves.

This module runs in the gateway's process (Kernel Gateway imports it as its API module); launch.py
checks, prepares and starts it.

What is ours is small; the rest is Kernel Gateway as it ships:

- its only kernelspec (`taskweaver-lite`, forced for every start whatever a client asks) names
  `SandboxProvisioner` (provisioner.py), so each kernel starts in the local sandbox, in its own
  session's folder, over IPC sockets;
- its API personality is Kernel Gateway's own WebSocket one plus one route,
  `DELETE /api/taskweaver-lite/sessions/<id>`: a deleted session's kernels end and its folder and log go;
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
