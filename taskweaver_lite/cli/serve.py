"""`taskweaver-lite serve`: the web page and HTTP API (web/app.py) on uvicorn."""

from __future__ import annotations

import argparse
import sys

from taskweaver_lite.cli.chat import project_dir
from taskweaver_lite.config import load_config
from taskweaver_lite.roles.registry import discover_roles
from taskweaver_lite.terminal import strip_controls
from taskweaver_lite.web.app import build_app
from taskweaver_lite.web.auth import Access


def run_serve(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C; every session open in the server is closed (and stays stored) on the way out."""
    import uvicorn

    config = load_config(project_dir(args), list(args.overrides))
    access = Access.for_address(args.host, args.token)
    app = build_app(config, access)
    where = f"http://{'[' + args.host + ']' if ':' in args.host else args.host}:{args.port}/"
    print(f"taskweaver-lite serving {config.project_dir} at {where}" + (" (token required)" if access.token else ""), file=sys.stderr, flush=True)
    for line in discover_roles(config.project_dir, enabled=config.session.roles, config=config).problems:
        print(strip_controls(line), file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0
