"""`taskweaver-lite mcp`: this agent as an MCP server on standard input and output (the protocol is `mcp/server.py`).

The command only opens the project and hands it to the server: standard output carries the
protocol alone, so whatever it has to say (the config's notices, a broken plugin or role) goes to
stderr, where MCP hosts keep a server's log.
"""

from __future__ import annotations

import argparse
import sys

from taskweaver_lite.cli.project import project_dir
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.safety.terminal import strip_controls
from taskweaver_lite.session.workspace import Workspace


def run_mcp(args: argparse.Namespace) -> int:
    """Serve MCP on stdin and stdout until the client closes them; 0 then."""
    try:
        import anyio

        from taskweaver_lite.mcp.server import serve
    except ImportError as exc:
        raise ConfigError(f"taskweaver-lite mcp needs the MCP SDK ({exc.name} is missing): pip install '.[mcp]' in the checkout") from None
    config = load_config(project_dir(args), list(args.overrides))
    if config.execution.confirm:
        # Nobody could answer "run, edit or skip?": refused rather than running each cell unasked.
        raise ConfigError(
            "execution.confirm: true asks a person at a terminal before each cell runs, and an MCP server has none: "
            "set it to false for this project, or start with --set execution.confirm=false"
        )
    with Workspace(config) as workspace:
        for line in [*config.notices, *(entry.line() for entry in workspace.plugins.broken), *workspace.roles.problems]:
            print(strip_controls(line), file=sys.stderr)
        anyio.run(serve, workspace, list(args.overrides))
    return 0
