"""TaskWeaver Lite in JupyterLab's chat: a Jupyter AI persona that `@TaskWeaver` reaches.

Jupyter AI 3 finds personas through the `jupyter_ai.personas` entry point group; this one is built
on `jupyter-ai-acp-client`'s `BaseAcpPersona`, which starts an Agent Client Protocol agent as a
child of the Jupyter server and turns its updates into chat messages (its answer, its tool calls
with their output, its permission questions as buttons). The agent is `taskweaver-lite acp`
(acp/agent.py), run by the server's own Python: each chat is one stored session of the project,
its kernel our usual sandboxed one, lent the chat's folder read-only.

The project is the one a notebook's `%%ask` would use: `TASKWEAVER_LITE_PROJECT`, else the
server's root folder when it holds a project (or its `project/`), else the defaults' folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, ClassVar

from jupyter_ai_persona_manager import PersonaDefaults, PersonaRequirementsUnmet

try:
    from jupyter_ai_acp_client.base_acp_persona import BaseAcpPersona
except ImportError as exc:  # Jupyter AI without its ACP client: the persona list says why, the others load
    raise PersonaRequirementsUnmet(f"TaskWeaver needs {exc.name}: pip install 'taskweaver-lite[jupyter]'") from None

from taskweaver_lite.notebook.notebook_session import notebook_project

NAME = "TaskWeaver"
AVATAR = Path(__file__).resolve().with_name("avatar.svg")


def agent_command(root_dir: str | os.PathLike[str], environ: dict[str, str] | None = None) -> list[str]:
    """`taskweaver-lite acp -p PROJECT` on this Python, for a Jupyter server whose root folder is `root_dir`."""
    project = notebook_project(os.environ if environ is None else environ, Path(root_dir)).folder
    return [sys.executable, "-m", "taskweaver_lite", "acp", "-p", str(project)]


class TaskWeaverPersona(BaseAcpPersona):  # type: ignore[misc] # jupyter-ai-acp-client ships no type information
    """`@TaskWeaver` in JupyterLab's chat: the Planner, the CodeGenerator and a sandboxed kernel, over ACP."""

    # The base class puts a note about Jupyter's notebook-editing MCP tools before the first prompt; this
    # agent edits no notebook and its kernel does not reach those tools, so its Planner is spared it.
    NOTEBOOK_EDITING_GUIDANCE: ClassVar[str] = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        manager = kwargs.get("parent")
        root = getattr(manager, "root_dir", None) or os.getcwd()
        super().__init__(*args, executable=agent_command(root), **kwargs)

    @property
    def defaults(self) -> PersonaDefaults:
        """The name the chat mentions, what the persona list says of it, its avatar."""
        return PersonaDefaults(
            name=NAME,
            description="A data-analysis agent: it plans, writes Python, runs it in a sandboxed kernel and answers.",
            avatar_path=str(AVATAR),
            system_prompt="unused: the agent's prompts are its own",
        )
