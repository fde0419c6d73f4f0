"""`taskweaver-lite init [PROJECT_DIR]`: a new project folder, copied from the bundled one.

A project is what `chat -p PROJECT_DIR` reads: `taskweaver_config.yaml` (commented), the few-shot
`examples/` that show the models the reply format, `plugins/`, `sample_data/` to try it on, and
`docs/` (what the sample data's columns mean) for the document_retriever role.
An existing project is never overwritten. The folder is its owner's only (0700, the config 0600).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.config.file import CONFIG_FILE_NAME
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.safety.workfiles import owner_only_file, owner_only_folder

# What a session writes into its project; a user's own project keeps it out of version control.
GITIGNORE = "# written by taskweaver-lite sessions\nsessions/\nsessions.db*\ndocs_index.db*\n.chat_history\n# taskweaver-lite eval reports\neval/\n"
# Never copied: another checkout's sessions, and the packaging files of the installed copy.
_NOT_COPIED = ("sessions", "*.db*", ".chat_history", "__init__.py", "__pycache__")


def init_project(target: Path) -> Path:
    """Create `target` as a project from the bundled one; ConfigError if it exists and is not empty."""
    if (target / CONFIG_FILE_NAME).exists():
        raise ConfigError(f"{target} is already a project ({target / CONFIG_FILE_NAME} exists); nothing was changed")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} exists and is not empty; nothing was changed: name a new or empty folder")
    shutil.copytree(bundled_project(), target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*_NOT_COPIED))
    (target / "plugins").mkdir(exist_ok=True)
    (target / ".gitignore").write_text(GITIGNORE, encoding="utf-8")
    # The config may hold an API key and the project will hold every conversation: owner-only, so
    # no other user, nor a kernel running as another user (SECURITY.md), can read or enter it.
    owner_only_file(target / CONFIG_FILE_NAME)
    owner_only_folder(target)
    return target


def run_init(directory: str) -> int:
    """Create the project and say what is in it and what to do next."""
    target = init_project(Path(directory))
    option = "" if directory == "project" else f" -p {directory}"
    print(
        f"Created the project {target}:\n"
        f"  {CONFIG_FILE_NAME}   model, endpoint and limits, with comments\n"
        "  examples/                few-shot examples for the Planner and the CodeGenerator\n"
        "  plugins/                 your plugins (TaskWeaver's format)\n"
        "  roles/reviewer/          an example role, off until listed in session.roles (`taskweaver-lite roles`)\n"
        "  sample_data/sales.csv    data to try it on\n"
        "  docs/sales_data.md       what its columns mean: the document_retriever role answers from docs/\n"
        "  eval_cases/              evaluation cases for `taskweaver-lite eval` (offline with --scripted)\n"
        f"Next: set llm.model (and OPENAI_API_KEY, or llm.api_base for a local model), then\n"
        f"  taskweaver-lite chat{option}\n"
        f"and type: /load {target / 'sample_data' / 'sales.csv'}"
    )
    return 0
