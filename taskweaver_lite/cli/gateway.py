"""`taskweaver-lite gateway [-p PROJECT_DIR] [--ip IP] [--port PORT]`: a Jupyter Kernel Gateway whose kernels run in the sandbox.

Replicas use it as any gateway (`execution.kernel_gateway.url` and `token`); what it adds is that
every kernel is a session's, alone in its own sandbox (kernel/gateway/server.py says how; kernel/gateway/launch.py starts it). The
token is read from `KG_AUTH_TOKEN`, never from the command line, where `ps` shows it to everyone.
"""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_GATEWAY_PORT = 8888


def add_gateway_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `gateway` command and its options."""
    gateway = commands.add_parser("gateway", help="a Jupyter Kernel Gateway for serve replicas, every kernel in its session's own sandbox")
    gateway.add_argument("-p", "--project", dest="project", default=None, metavar="PROJECT_DIR", help="project folder (default: ./project)")
    gateway.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other needs KG_AUTH_TOKEN)")
    gateway.add_argument("--port", type=int, default=DEFAULT_GATEWAY_PORT, help=f"port to listen on (default {DEFAULT_GATEWAY_PORT})")
    gateway.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key (value parsed as YAML); repeatable"
    )


def run_gateway(args: argparse.Namespace) -> int:
    """Check the setup, then run the gateway until it is stopped; the exit code."""
    from taskweaver_lite.cli.project import project_dir
    from taskweaver_lite.config.file import load_config
    from taskweaver_lite.errors import ConfigError

    config = load_config(project_dir(args), args.overrides)
    try:
        from taskweaver_lite.kernel.gateway import server as gateway_server  # noqa: F401 - what runs inside Kernel Gateway: imported here only to say early that it is missing
    except ImportError as exc:
        raise ConfigError(f"taskweaver-lite gateway needs {exc.name}: pip install 'taskweaver-lite[team]'") from exc
    from taskweaver_lite.kernel.gateway import launch as gateway_launch

    for warning in gateway_launch.check_can_start(config, ip=args.ip, environ=dict(os.environ)):
        print(warning, file=sys.stderr, flush=True)
    gateway_launch.run(config, ip=args.ip, port=args.port)
    return 0
