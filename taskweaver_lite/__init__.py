"""taskweaver_lite: a light code-interpreter agent for data analysis.

from taskweaver_lite import Workspace
with Workspace.load("project") as workspace, workspace.new_session() as session:
    print(session.ask("load sales.csv; which region grew fastest?").answer)

In a notebook, `%load_ext taskweaver_lite` registers `%%ask` (notebook/magics.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Session", "Workspace", "__version__", "load_config"]

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    __version__: str  # written once, in pyproject.toml; read from the installed package's metadata on first use
    from taskweaver_lite.config.file import load_config
    from taskweaver_lite.session.session import Session
    from taskweaver_lite.session.workspace import Workspace


def load_ipython_extension(shell: InteractiveShell) -> None:
    """`%load_ext taskweaver_lite`: register `%%ask`, `%ask`, `%ask_history` and `%ask_reset` in this kernel."""
    from taskweaver_lite.notebook.magics import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell: InteractiveShell) -> None:
    """`%unload_ext taskweaver_lite`: close this notebook's session (it stays stored) and remove the magics."""
    from taskweaver_lite.notebook.magics import unload_ipython_extension as unload

    unload(shell)


def __getattr__(name: str) -> Any:
    # Imported on first use so that `taskweaver-lite --help` does not pay for pydantic and friends
    # (nor for importlib.metadata, 50 ms, which only the version needs).
    if name == "__version__":
        from importlib.metadata import version

        globals()["__version__"] = found = version("taskweaver-lite")
        return found
    if name == "Session":
        from taskweaver_lite.session.session import Session

        return Session
    if name == "Workspace":
        from taskweaver_lite.session.workspace import Workspace

        return Workspace
    if name == "load_config":
        from taskweaver_lite.config.file import load_config

        return load_config
    raise AttributeError(f"module 'taskweaver_lite' has no attribute {name!r}")
