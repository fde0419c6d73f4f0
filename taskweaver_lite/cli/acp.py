"""`taskweaver-lite acp`: this agent for editors, over the Agent Client Protocol on standard input and output (`acp/agent.py`).

The command only opens the project and hands it to the agent: standard output carries the
protocol alone, so whatever it has to say (the config's notices, a broken plugin or role) goes to
stderr, which editors keep as the agent's log.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from taskweaver_lite.cli.project import project_dir
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.safety.terminal import strip_controls
from taskweaver_lite.session.workspace import Workspace


def run_acp(args: argparse.Namespace) -> int:
    """Speak ACP on stdin and stdout until the editor closes them; 0 then."""
    try:
        from taskweaver_lite.acp.agent import serve
    except ImportError as exc:
        raise ConfigError(f"taskweaver-lite acp needs the Agent Client Protocol SDK ({exc.name} is missing): pip install 'taskweaver-lite[acp]'") from None
    config = load_config(project_dir(args), list(args.overrides))
    with Workspace(config) as workspace:
        for line in [*config.notices, *(entry.line() for entry in workspace.plugins.broken), *workspace.roles.problems]:
            print(strip_controls(line), file=sys.stderr)
        asyncio.run(serve(workspace, list(args.overrides)))
    return 0
