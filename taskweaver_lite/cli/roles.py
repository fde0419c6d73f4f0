"""`taskweaver-lite roles` and `/roles`: every role found, with its state, and why a broken one is off.

Roles come from the package, the project's `roles/` folder and installed packages (roles/registry.py);
`session.roles` picks the enabled ones. A name in `session.roles` that is no role is listed too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from taskweaver_lite.config.file import load_config
from taskweaver_lite.roles.registry import RoleEntry, discover_roles
from taskweaver_lite.safety.terminal import strip_controls


def run_roles(project: Path, *, as_json: bool) -> int:
    """`taskweaver-lite roles`: list the roles with their state (enabled, disabled, or the error)."""
    config = load_config(project)
    catalog = discover_roles(config.project_dir, enabled=config.session.roles, config=config)
    print(json.dumps([entry.to_dict() for entry in catalog.entries], indent=2) if as_json else role_table(catalog.entries))
    return 0


def role_table(entries: Sequence[RoleEntry]) -> str:
    """One line per role: name, alias, state, where it is declared, and its intro's first line or its error."""
    name_width = max((len(e.name) for e in entries), default=4)
    alias_width = max((len(e.spec.alias) for e in entries if e.spec), default=5)
    lines = []
    for entry in entries:
        alias = entry.spec.alias if entry.spec else "-"
        detail = f"{entry.where}: {entry.error}" if entry.state in ("broken", "off", "replaced") else _first_line(entry.spec.intro if entry.spec else "")
        lines.append(f"{entry.name:<{name_width}}  {alias:<{alias_width}}  {entry.state:<8}  {strip_controls(detail)}")
    lines.append("Enable a role by listing its name in session.roles; write one in PROJECT_DIR/roles/<name>/<name>.role.yaml.")
    return "\n".join(lines)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].lstrip("- ").strip() if text.strip() else ""
