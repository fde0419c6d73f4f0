"""A server as one replica of a team service: any session, loaded from the store when this replica's copy is stale.

Several `serve` processes on one PostgreSQL store and one kernel gateway answer any request of any
session; nothing routes a session to "its" replica. What makes that safe:

- A request first takes the session's lease (`leases.py`): one request at a time, whichever replica.
- A replica keeps the sessions it served in memory (their kernel connections, their prompts), but
  never trusts one over the store: a copy is reused as it is only when the store has no event newer
  than the last it wrote. Otherwise it is brought up to date in place: the session's record read
  again from the store, the kernel's variables read again over the connection it keeps (what
  another replica ran there meanwhile). Only when that cannot be (another kernel, a round left
  running) is the copy dropped and the session loaded again.
- A session's kernel lives on the gateway, and its id is in the store: the replica that loads the
  session attaches to that kernel, variables and all, and leaves it running when it lets go. Only
  a kernel the gateway no longer has is started afresh, its variables rebuilt by replaying the
  session's cells; a copy whose kernel went (culled, ended for room, the gateway restarted) is
  loaded again the same way. A new session's kernel starts at its first request, so a session
  never used costs the gateway nothing, and a start the gateway refuses is the request's answer.
- Loading a session whose last round is still "running" in the store means the replica that ran it
  died: the round is marked cut off (the resume does it) and counted as a lease takeover.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ConfigError, StoreError
from taskweaver_lite.kernel.choice import executor_factory
from taskweaver_lite.kernel.interface import ExecutorFactory
from taskweaver_lite.records.events import Listener
from taskweaver_lite.session.session import Session
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.store.interface import StoredSession
from taskweaver_lite.web.metrics import Metrics

_log = logging.getLogger(__name__)


def check_replica_setup(config: Config) -> None:
    """Refuse, in one line, a PostgreSQL store whose kernels would run on this machine (they cannot move between replicas)."""
    if config.store.url is None or config.execution.kernel_gateway is not None or config.serve.single_replica:
        return
    raise ConfigError(
        "store.url is a PostgreSQL store, which several serve replicas may share, but kernels would run on this machine, where "
        "no other replica can reach them: set execution.kernel_gateway (a Jupyter Kernel or Enterprise Gateway), or "
        "serve.single_replica: true if this is the only server on that store"
    )


def check_gateway_client(config: Config) -> None:
    """Refuse, in one line, a kernel gateway whose client libraries (the `team` or `gateway` extra) are not installed."""
    if config.execution.kernel_gateway is None:
        return
    try:
        import requests  # noqa: F401  (the gateway's REST API and /healthz)
        import websocket  # noqa: F401  (the kernel's channels)
    except ImportError as exc:
        raise ConfigError(
            f"execution.kernel_gateway needs the gateway's client, and {exc.name} is not installed: pip install 'taskweaver-lite[team]' "
            "(or the `gateway` extra alone)"
        ) from None


def is_replica(config: Config) -> bool:
    """Whether this server is one replica of several (a PostgreSQL store, kernels on a gateway)."""
    return config.store.url is not None and not config.serve.single_replica


class Replica:
    """This replica's part: building sessions on the shared store with kernels that outlive it, and telling a stale copy."""

    def __init__(self, workspace: Workspace, *, metrics: Metrics) -> None:
        self.workspace = workspace  # its roles and plugins were found once: a takeover does not look for them again
        self.config = workspace.config
        self.store = workspace.store
        self.metrics = metrics

    def executor(self, session_id: str, *, owner: str | None, kernel_id: str | None = None, cells_before: int = 0) -> ExecutorFactory | None:
        """How a session's executor is built here: on the gateway, attached to `kernel_id` when given, left running on close.

        None (the session's default) for a single replica on PostgreSQL with local kernels.
        """
        gateway = self.config.execution.kernel_gateway
        if gateway is None:
            return None
        from taskweaver_lite.kernel.gateway.remote import KernelHandover  # the gateway extra, as in kernel/choice.py

        started = functools.partial(self._kernel_started, session_id)
        handover = KernelHandover(
            reuse=kernel_id, keep=True, on_start=started, cells_before=cells_before, owner=owner, owner_name=self._user_name(owner), at_first_use=True
        )
        return executor_factory(self.config, plugins=self.workspace.plugins.enabled, handover=handover)

    def load(self, session_id: str, *, listeners: Iterable[Listener] = ()) -> Session:
        """The session from the store (its kernel attached, or rebuilt by replay); counts the load, and a takeover."""
        started = time.monotonic()
        stored = self.store.load(session_id)
        factory = self.executor(session_id, owner=stored.owner, kernel_id=stored.kernel_id, cells_before=_cells(stored))
        session, report = self.workspace.resume_session(session_id, executor=factory, listeners=listeners, claim=False)
        self.metrics.session_loads.observe(time.monotonic() - started)
        if report.unrestored:
            _log.warning("session %s: loaded files not restored into its new kernel (the store has no copy): %s", session_id, ", ".join(report.unrestored))
        if report.cut_off:
            self.metrics.lease_takeovers.inc()
            _log.warning("session %s: took over request %s, cut off when the replica running it stopped", session_id, report.cut_off)
        return session

    def refresh(self, session: Session) -> bool:
        """Bring this replica's stale copy up to date from the store in place, its kernel connection and models kept.

        False, with the copy unchanged, when only a full load will do: a round left running (its
        replica died: the load marks it cut off), or a kernel that is not the copy's any more.
        """
        started = time.monotonic()
        stored = self.store.load(session.id)
        executor = session.executor
        if stored.interrupted or not executor.catch_up(stored.kernel_id, cells_before=_cells(stored)):
            return False
        session.restore(stored)
        self.metrics.session_refreshes.observe(time.monotonic() - started)
        return True

    def _user_name(self, owner: str | None) -> str | None:
        """The name of the user whose id `owner` is (the gateway's log and metrics name users by it); None when unknown."""
        if owner is None:
            return None
        try:
            return next((user.name for user in self.store.users() if user.id == owner), None)
        except StoreError:
            return None

    def _kernel_started(self, session_id: str, kernel_id: str) -> None:
        try:
            self.store.save_kernel(session_id, kernel_id)
        except StoreError as exc:  # the next replica then starts a kernel of its own and replays
            _log.warning("session %s: could not store its kernel's id (%s)", session_id, exc)


def _cells(stored: StoredSession) -> int:
    """How many cells the session has run, on any replica (a copy numbers its next cells after them)."""
    return sum(1 for rnd in stored.rounds for post in rnd.posts if post.execution is not None)
