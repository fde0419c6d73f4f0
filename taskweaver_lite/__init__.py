"""taskweaver_lite: a light code-interpreter agent for data analysis.

from taskweaver_lite import Workspace
with Workspace.load("project") as workspace, workspace.new_session() as session:
    print(session.ask("load sales.csv; which region grew fastest?").answer)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Session", "Workspace", "__version__", "load_config"]

if TYPE_CHECKING:
    __version__: str  # written once, in pyproject.toml; read from the installed package's metadata on first use
    from taskweaver_lite.config.file import load_config
    from taskweaver_lite.session.session import Session
    from taskweaver_lite.session.workspace import Workspace


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
