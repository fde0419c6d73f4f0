"""The project folder a command works on (`-p PROJECT_DIR`, else ./project), light enough for every command to import."""

from __future__ import annotations

import argparse
from pathlib import Path

from taskweaver_lite.errors import ConfigError

DEFAULT_PROJECT = "project"


def project_dir(args: argparse.Namespace) -> Path:
    """The project folder named by -p (or ./project); a missing one is an error that says how to make it."""
    given = args.project is not None
    project = Path(args.project if given else DEFAULT_PROJECT)
    if project.is_file():
        raise ConfigError(
            f"{project} is a file, not a project folder: -p takes the folder that holds taskweaver_config.yaml "
            "(`taskweaver-lite init` makes one). To analyse this file, /load it in the chat."
        )
    if not project.is_dir():
        create = f"taskweaver-lite init {project}" if given else "taskweaver-lite init"
        other = "" if given else ", or pass -p PROJECT_DIR to use another folder"
        raise ConfigError(f"{project}: project folder not found; create one with `{create}`{other}")
    return project


def sessions_command(project: Path) -> str:
    """The command that lists `project`'s stored sessions, for messages about an unknown session id."""
    return f"taskweaver-lite sessions -p {project}"
