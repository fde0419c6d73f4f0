"""`taskweaver-lite acp`: this agent for editors, over the Agent Client Protocol on standard input and output (`acp/agent.py`).

The command checks that the project folder is there and hands it to the agent, which reads the
config and opens the project when the first `session/new` or `session/load` needs it
(`session/lazy_workspace.py`), so that the editor hears `initialize` at once. Standard output
carries the protocol alone, so whatever it has to say (the config's notices, a broken plugin or
role, a project that could not be opened) goes to stderr, which editors keep as the agent's log.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from taskweaver_lite.cli.project import project_dir
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.safety.terminal import strip_controls


def run_acp(args: argparse.Namespace) -> int:
    """Speak ACP on stdin and stdout until the editor closes them; 0 then."""
    try:
        from taskweaver_lite.acp.agent import serve
        from taskweaver_lite.session.lazy_workspace import LazyWorkspace
    except ImportError as exc:
        raise ConfigError(f"taskweaver-lite acp needs the Agent Client Protocol SDK ({exc.name} is missing): pip install 'taskweaver-lite[acp]'") from None
    with LazyWorkspace(project_dir(args), list(args.overrides), say=say) as project:
        asyncio.run(serve(project))
    return 0


def say(line: str) -> None:
    """One line for the agent's log: stderr, its control sequences stripped."""
    print(strip_controls(line), file=sys.stderr, flush=True)
