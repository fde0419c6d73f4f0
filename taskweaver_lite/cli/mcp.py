"""`taskweaver-lite mcp`: this agent as an MCP server on standard input and output (the protocol is `mcp/server.py`).

The command checks that the project folder is there and hands it to the server, which reads the
config and opens the project when the first call needs it (`session/lazy_workspace.py`), so that a host
hears `initialize` at once. Standard output carries the protocol alone, so whatever it has to say
(the config's notices, a broken plugin or role, a project that could not be opened) goes to stderr,
where MCP hosts keep a server's log.
"""

from __future__ import annotations

import argparse
import sys

from taskweaver_lite.cli.project import project_dir
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.safety.terminal import strip_controls


def run_mcp(args: argparse.Namespace) -> int:
    """Serve MCP on stdin and stdout until the client closes them; 0 then."""
    try:
        import anyio

        from taskweaver_lite.mcp.server import refuse_confirm_mode, serve
        from taskweaver_lite.session.lazy_workspace import LazyWorkspace
    except ImportError as exc:
        raise ConfigError(f"taskweaver-lite mcp needs the MCP SDK ({exc.name} is missing): pip install '.[mcp]' in the checkout") from None
    with LazyWorkspace(project_dir(args), list(args.overrides), say=say, check=refuse_confirm_mode) as project:
        anyio.run(serve, project)
    return 0


def say(line: str) -> None:
    """One line for the server's log: stderr, its control sequences stripped."""
    print(strip_controls(line), file=sys.stderr, flush=True)
