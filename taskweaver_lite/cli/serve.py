"""`taskweaver-lite serve`: the web page and HTTP API (web/app.py) on uvicorn.

The port is bound here before uvicorn starts, so a busy one is one line naming `--port` (and
"serving at" is printed only once the address is really ours). Every line `serve` writes to stderr
while it runs starts with the time (ISO 8601, UTC offset included): ours, the log's and uvicorn's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from urllib.parse import quote

import uvicorn

from taskweaver_lite.cli.project import project_dir
from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.roles.registry import discover_roles
from taskweaver_lite.safety.terminal import strip_controls
from taskweaver_lite.store.opening import store_has_users
from taskweaver_lite.telemetry.log_lines import LOG_FORMAT, LOG_TIME, one_line_handler, utc_stamp
from taskweaver_lite.web.access_log import AccessLog
from taskweaver_lite.web.app import build_app
from taskweaver_lite.web.auth import LOOPBACK, TOKEN_ENV, Access
from taskweaver_lite.web.connections import server_settings
from taskweaver_lite.web.hub import Hub

WILDCARDS = frozenset({"0.0.0.0", "::", ""})

# uvicorn's loggers in the same form (its default has no time); its access log stays off (serve --log writes ours).
UVICORN_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"stamped": {"()": "taskweaver_lite.telemetry.log_lines.UtcFormatter", "format": LOG_FORMAT, "datefmt": LOG_TIME}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "stamped", "stream": "ext://sys.stderr"}},
    "loggers": {"uvicorn": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}
DRAIN_POLL = 0.1  # seconds between looks at whether requests still run here, once stopping
CUT_GRACE = 10.0  # seconds past serve.drain_timeout for the requests cut then to end before uvicorn cancels what is left


def run_serve(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C; every session open in the server is closed (and stays stored) on the way out."""
    if args.demo:
        from taskweaver_lite.cli.demo_model import demo_config, kept_line, known_requests, sample_data

        with demo_config(args.project, overrides=list(args.overrides)) as config:
            try:
                # Said once the port is ours (a busy one is the only line), and the page opens on a new session.
                intro = f"Demo project: {config.project_dir}. The scripted model answers these requests:\n{known_requests()}"
                return _serve(config, args, preload=[sample_data(config)], intro=intro, fresh=True)
            finally:
                kept = kept_line(config.project_dir, command="taskweaver-lite serve --demo")
                if kept is not None:
                    say(kept)
    config = load_config(project_dir(args), list(args.overrides))
    for notice in config.notices:
        say(notice)
    return _serve(config, args)


def say(line: str) -> None:
    """One line (or several) to stderr, each stamped with the time as the log's lines are."""
    stamp = utc_stamp()
    print("\n".join(f"{stamp} {part}" for part in line.splitlines()), file=sys.stderr, flush=True)


def _serve(config: Config, args: argparse.Namespace, *, preload: Sequence[Path] = (), intro: str = "", fresh: bool = False) -> int:
    """Serve `config` on the command's address: `intro` is said once it is listening, and with `fresh` its link opens a new session."""
    logging.basicConfig(handlers=[one_line_handler(sys.stderr)], level=logging.WARNING)  # the server's warnings (a driver's too), one line each
    has_users = store_has_users(config)
    # A team's store (PostgreSQL) with no users yet: its replicas start all the same (compose starts them first on a first
    # start), and refuse every request, saying so, until an administrator adds the first user.
    awaiting_users = not has_users and config.store.url is not None and not (args.token or os.environ.get(TOKEN_ENV)) and args.host not in LOOPBACK
    access = Access.for_address(args.host, args.token, store_has_users=has_users or awaiting_users)
    log = AccessLog(args.log) if args.log else None
    try:
        app = build_app(config, access, log=log, preload=preload)
        with listening(args.host, args.port) as sock:
            if intro:
                say(intro)
            say(start_line(config.project_dir, host=args.host, port=args.port, token=access.token, fresh=fresh))
            if awaiting_users:
                say(f"The store has no users yet: every request is refused (401) until an administrator adds one: {add_user_line(config)}")
            for warning in (gateway_warning(config) if has_users else None, proxy_warning(config)):
                if warning:
                    say(warning)
            for line in discover_roles(config.project_dir, enabled=config.session.roles, config=config).problems:
                say(strip_controls(line))
            drain = config.serve.drain_timeout
            settings = server_settings(app, config.serve, log_level="warning", log_config=UVICORN_LOGGING, timeout_graceful_shutdown=round(drain + CUT_GRACE))
            server = _Server(settings, hub=app.state.hub, drain=drain)
            server.run(sockets=[sock])
    finally:
        if log is not None:
            log.close()
    return 0


class _Server(uvicorn.Server):
    """uvicorn, told of SIGTERM and Ctrl-C at once: the hub refuses new requests (503 "stopping") while the running ones finish.

    Once none runs, uvicorn stops listening and waits for the connections still open (a replica's
    event streams end at once: their clients reconnect to another replica, missing nothing). Those still running after
    `serve.drain_timeout` are cut short by the hub: each client gets its error event, and the round
    is marked cut off, as for a replica that died. uvicorn's own cancelling, CUT_GRACE seconds
    later, is only for a request that did not end even then. The hub then closes its sessions; on a
    replica their kernels stay on the gateway and their leases are freed, so another replica takes
    their next request.
    """

    def __init__(self, config: uvicorn.Config, *, hub: Hub, drain: float) -> None:
        super().__init__(config)
        self._hub = hub
        self._drain = drain
        self._cutter: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._cutter is not None:  # a second signal: stop waiting for the running requests
            super().handle_exit(sig, frame)
            return
        running = self._hub.running()
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        say(
            f"{name}: stopping; new requests get 503, {running} running request{'s' if running != 1 else ''} may finish within "
            f"serve.drain_timeout ({self._drain:g} s)"
        )
        self._hub.stop_taking()
        self._cutter = threading.Timer(self._drain, self._hub.cut_running)
        self._cutter.daemon = True
        self._cutter.start()
        # Still listening while requests run: a new one is answered 503 "stopping" (the proxy retries it
        # elsewhere), not refused at connect. uvicorn stops listening once none runs here.
        threading.Thread(target=self._exit_when_idle, args=(sig, frame), name="drain", daemon=True).start()

    def _exit_when_idle(self, sig: int, frame: FrameType | None) -> None:
        while self._hub.running():
            time.sleep(DRAIN_POLL)
        super().handle_exit(sig, frame)


@contextlib.contextmanager
def listening(host: str, port: int) -> Iterator[socket.socket]:
    """A socket bound to host:port and listening; a busy or forbidden port is a ConfigError naming --port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port left in TIME_WAIT by our last run is free
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(_bind_problem(exc, host=host, port=port)) from None
        sock.listen(128)
        yield sock
    finally:
        sock.close()


def _bind_problem(exc: OSError, *, host: str, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use (another server?): choose another with --port, e.g. --port {port + 1}"
    if exc.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges: choose one above 1023 with --port"
    return f"cannot listen on {host}:{port} ({exc.strerror}): choose another --host or --port"


def gateway_warning(config: Config) -> str | None:
    """One line when users share `execution.kernel_gateway` and it is not `taskweaver-lite gateway` (None: nothing to say)."""
    gateway = config.execution.kernel_gateway
    if gateway is None:
        return None
    from taskweaver_lite.kernel.gateway.kernel import GatewayKernel  # the gateway extra, as the sessions' executors need

    client = GatewayKernel(gateway)
    try:
        sandboxed = client.sandboxed()
    finally:
        client.release()
    if sandboxed:
        return None
    what = "is a plain Jupyter gateway" if sandboxed is False else "did not list its kernelspecs, so it may be a plain Jupyter gateway"
    return (
        f"Warning: the kernel gateway {gateway.url} {what}: it does not keep users apart, so code run in one user's session can read "
        "other sessions' files, variables and kernels there, and the gateway's token; run `taskweaver-lite gateway` there instead."
    )


def proxy_warning(config: Config) -> str | None:
    """One line when `serve.trusted_user_header` is set but no proxy is trusted to send it (None: nothing to say)."""
    header = config.serve.trusted_user_header
    if not header or config.serve.trusted_proxies:
        return None
    return (
        f"Warning: serve.trusted_user_header is {header} but serve.trusted_proxies is empty, so every request carrying {header} "
        "is refused (403); list your proxy's address there, as the server sees it (127.0.0.1 for a proxy on this machine)."
    )


def add_user_line(config: Config) -> str:
    """The command that adds the first user to `config`'s store."""
    return f"taskweaver-lite users add NAME --admin -p {config.project_dir}"


def start_line(project: Path, *, host: str, port: int, token: str | None, fresh: bool = False) -> str:
    """What `serve` prints once listening: the project and a link that opens the page (with the token when one is needed).

    With `fresh` the link ends in `#new`: the page opens on a new session instead of on none.
    """
    shown = "127.0.0.1" if host in WILDCARDS else host
    where = f"http://{'[' + shown + ']' if ':' in shown else shown}:{port}/"
    opening = "#new" if fresh else ""
    listening = f" (listening on every address of this machine, {host or '0.0.0.0'} port {port})" if host in WILDCARDS else ""
    if token is None:
        return f"taskweaver-lite serving {project} at {where}{opening}{listening}"
    return f"taskweaver-lite serving {project} at {where}{listening} (token required); open {where}?token={quote(token, safe='')}{opening}"
