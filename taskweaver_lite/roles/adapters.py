"""Role classes written for another agent framework (TaskWeaver's), run through adapters found by entry point.

An adapter is registered in the entry-point group `taskweaver_lite.role_adapters` (ours for TaskWeaver
is `compat/taskweaver/role.py`, declared in pyproject.toml): the registry loads the adapters when it
first loads a role class, so that no role module imports a framework's compatibility code. Before a
role file is imported each adapter makes its framework's modules importable (`prepare`); when the
import fails it may explain the failure in one line (`import_problem`); and it wraps a class of its
framework as a handler of ours (`adapt`), or says the class is not one of its (None).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Protocol

from taskweaver_lite.roles.worker import RoleHandler

ADAPTER_GROUP = "taskweaver_lite.role_adapters"


class RoleAdapter(Protocol):
    """Runs another framework's role classes as roles of ours."""

    def prepare(self) -> None:
        """Make the framework's module names importable in this process (before a role file is imported)."""
        ...

    def import_problem(self, exc: ImportError) -> str | None:
        """One line for an import of the framework a role file could not make (None: not the framework's)."""
        ...

    def adapt(self, cls: type, *, name: str, alias: str, intro: str) -> Callable[[], RoleHandler] | None:
        """How to build a handler of ours for `cls` (None: not the framework's class); raises ValueError with the fix when it cannot run."""
        ...


@functools.cache
def role_adapters() -> tuple[RoleAdapter, ...]:
    """The installed adapters, loaded once per process."""
    return tuple(point.load() for point in entry_points(group=ADAPTER_GROUP))
