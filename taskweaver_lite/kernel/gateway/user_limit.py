"""`gateway.max_kernels_per_user`, kept by the gateway's kernel manager: counted when a start is asked, under a lock per user.

Kernel Gateway's manager adds a kernel to its list only once it has started, so a count of that
list misses every kernel still starting: a user's first requests sent at once all passed it.
`SandboxKernelManager` counts instead what it has promised: a kernel is the user's from the moment
its start is accepted (its id chosen here) until it is removed, starting or not. One start per user
at a time is decided, under that user's lock; other users' starts do not wait for it.

Past the limit, room is made by ending the user's least recently used kernel that nobody can be
about to use: idle, no client holding its channels open (a replica holds a session's kernel open
while it keeps the session in memory, from before its first cell until it lets go of the session),
and quiet for `gateway.eviction_grace` seconds (a replica attaching to it opens its channels right
after finding it). When there is none, the start is refused with HTTP 429 and a message naming the setting.

The gateway says one line for each refusal, eviction and cull, naming the user and the reason, and
counts them for its `/metrics` (`KernelCounts`).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from kernel_gateway.services.kernels.manager import SeedingMappingKernelManager
from tornado.web import HTTPError
from traitlets import Unicode

from taskweaver_lite.kernel.gateway.provisioner import OWNER_VARIABLE, SESSION_VARIABLE, USER_NAME_VARIABLE, project_config, safe_name

SETTING = "gateway.max_kernels_per_user"
_log = logging.getLogger("taskweaver_lite.gateway")


class LimitReached(HTTPError):
    """A start the limit refuses: HTTP 429 with this message (the answer's `message` field)."""

    def __init__(self, message: str) -> None:
        super().__init__(429, message, reason="Too many kernels")


@dataclass
class Owned:
    """One kernel a user has on this gateway, from its accepted start to its removal."""

    owner: str
    name: str  # how the log and the metrics call the user (their name, sent by serve; else the owner key)
    session: str
    started: bool = False


@dataclass
class KernelCounts:
    """What `/metrics` reports of the kernels: per user now, and the refusals, evictions and culls so far."""

    kernels: dict[str, Owned] = field(default_factory=dict)  # by kernel id
    refused: dict[str, int] = field(default_factory=dict)  # by user name
    evicted: dict[str, int] = field(default_factory=dict)
    culled: dict[str, int] = field(default_factory=dict)

    def per_user(self) -> dict[str, int]:
        """Kernels per user name, starting ones included."""
        counts: dict[str, int] = {}
        for owned in self.kernels.values():
            counts[owned.name] = counts.get(owned.name, 0) + 1
        return counts


def refusal(name: str, count: int, limit: int) -> str:
    """The one line a refused start answers with (a replica passes it to the user)."""
    return (
        f"{name} already has {count} kernels on this gateway, each in use by an open session, the most {SETTING} ({limit}) allows: "
        f"wait until one of those sessions has been left for a while, or ask an administrator to raise {SETTING} in the gateway's project"
    )


class SandboxKernelManager(SeedingMappingKernelManager):  # type: ignore[misc]  # Kernel Gateway's classes are untyped
    """Kernel Gateway's kernel manager, counting each user's kernels from the moment their start is accepted."""

    project_dir = Unicode("", config=True, help="the project whose gateway.max_kernels_per_user applies")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.counts = KernelCounts()
        self._locks: dict[str, asyncio.Lock] = {}

    async def start_kernel(self, *args: Any, **kwargs: Any) -> str:
        """Start a kernel, counted against its user from now; LimitReached past the limit when nothing can make room."""
        env = kwargs.get("env") or {}
        owner = safe_name(env.get(OWNER_VARIABLE))
        if owner is None:
            return str(await super().start_kernel(*args, **kwargs))
        kernel_id = kwargs.get("kernel_id") or str(uuid.uuid4())
        kwargs["kernel_id"] = kernel_id
        owned = Owned(owner=owner, name=safe_name(env.get(USER_NAME_VARIABLE)) or owner, session=str(env.get(SESSION_VARIABLE, "")))
        async with self._locks.setdefault(owner, asyncio.Lock()):
            await self._make_room(owned)
            self.counts.kernels[kernel_id] = owned
        try:
            started = str(await super().start_kernel(*args, **kwargs))
        except BaseException:
            self.counts.kernels.pop(kernel_id, None)
            raise
        owned.started = True
        return started

    async def _make_room(self, owned: Owned) -> None:
        gateway = project_config(self.project_dir).gateway if self.project_dir else None
        limit = gateway.max_kernels_per_user if gateway is not None else None
        if gateway is None or limit is None:
            return
        theirs = [kernel_id for kernel_id, other in self.counts.kernels.items() if other.owner == owned.owner]
        if len(theirs) < limit:
            return
        spare = sorted((kernel_id for kernel_id in theirs if self._nobody_uses(kernel_id, grace=gateway.eviction_grace)), key=self._last_activity)
        if len(theirs) - len(spare) >= limit:
            self.counts.refused[owned.name] = self.counts.refused.get(owned.name, 0) + 1
            said = "refused a kernel to %s for session %s: %d kernels in use, the most %s (%d) allows"
            _log.warning(said, owned.name, owned.session, len(theirs), SETTING, limit)
            raise LimitReached(refusal(owned.name, len(theirs), limit))
        for kernel_id in spare[: len(theirs) - limit + 1]:
            ended = self.counts.kernels[kernel_id]
            idle = self._idle_seconds(kernel_id)
            _log.warning(
                "ended %s's kernel %s (session %s, idle %ds, no client connected) to make room for session %s under %s (%d)",
                owned.name, kernel_id, ended.session, idle, owned.session, SETTING, limit,
            )  # fmt: skip
            self.counts.evicted[owned.name] = self.counts.evicted.get(owned.name, 0) + 1
            await self.shutdown_kernel(kernel_id)

    def _nobody_uses(self, kernel_id: str, *, grace: float) -> bool:
        """Started, idle, no client holding its channels, quiet for `grace` seconds: nobody can be about to run a cell in it."""
        if kernel_id not in self._kernels or not self.counts.kernels[kernel_id].started:
            return False
        kernel = self._kernels[kernel_id]
        connected = self._kernel_connections.get(kernel_id, 0)
        return getattr(kernel, "execution_state", "") == "idle" and not connected and self._idle_seconds(kernel_id) >= grace

    def _last_activity(self, kernel_id: str) -> datetime.datetime:
        return getattr(self._kernels[kernel_id], "last_activity", datetime.datetime.min.replace(tzinfo=datetime.timezone.utc))

    def _idle_seconds(self, kernel_id: str) -> int:
        return int((datetime.datetime.now(datetime.timezone.utc) - self._last_activity(kernel_id)).total_seconds())

    def remove_kernel(self, kernel_id: str) -> Any:
        """A kernel leaves the manager's list (ended, culled or dead): it no longer counts."""
        self.counts.kernels.pop(kernel_id, None)
        return super().remove_kernel(kernel_id)

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        """jupyter_server's culling, with one line naming the user and the count of culls."""
        owned = self.counts.kernels.get(kernel_id)
        idle = self._idle_seconds(kernel_id) if kernel_id in self._kernels else 0
        await super().cull_kernel_if_idle(kernel_id)
        if owned is not None and kernel_id not in self._kernels:
            self.counts.culled[owned.name] = self.counts.culled.get(owned.name, 0) + 1
            _log.warning("culled %s's kernel %s (session %s) after %ds idle (gateway.cull_idle_timeout)", owned.name, kernel_id, owned.session, idle)
