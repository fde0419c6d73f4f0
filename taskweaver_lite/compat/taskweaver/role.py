"""A TaskWeaver role class running as one of ours: its module names provided, its object built by `injector`, its reply adapted.

The role registry finds this module through the entry point `taskweaver` of the group
`taskweaver_lite.role_adapters` (`ADAPTER`, pyproject.toml; roles/adapters.py says what an adapter does).
`provide_modules()` registers `compat/taskweaver/api.py`, `session.py` and `memory.py` under the
names TaskWeaver's role files import (`taskweaver.role`, `taskweaver.memory`,
`taskweaver.module.event_emitter`, `taskweaver.logging`, `taskweaver.module.tracing`,
`taskweaver.llm`...), as the kernel's plugin runtime registers `taskweaver.plugin`. A role file is
then loaded as it is. An import of a TaskWeaver module or name not provided here becomes one line
saying what to port (`import_problem`); a missing third-party package (`injector`) one line naming it.

`TaskWeaverRole` is the role handler the session runs: on its first request it builds the class
through the real `injector` package (the optional `taskweaver` extra) with what the class asks for,
then, per request, hands it the role's view as TaskWeaver's `Memory` and turns the `Post` it returns
into ours.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

from taskweaver_lite.compat.taskweaver import api as api
from taskweaver_lite.compat.taskweaver import memory as memory
from taskweaver_lite.compat.taskweaver import session as lent
from taskweaver_lite.records.conversation import Post as OurPost
from taskweaver_lite.records.events import Working
from taskweaver_lite.roles.worker import RoleHandler, RoleRequest, RoleTools

INSTALL_HINT = "pip install 'taskweaver-lite[taskweaver]'"
_MEMORY = ("Memory", "Post", "Round", "Attachment", "AttachmentType", "Conversation")
_ROLE = ("Role", "RoleConfig", "RoleEntry")
# TaskWeaver's module names -> the names each provides (from the two shim modules).
PROVIDED: dict[str, tuple[str, ...]] = {
    "taskweaver": (),
    "taskweaver.role": _ROLE,
    "taskweaver.role.role": _ROLE,
    "taskweaver.memory": _MEMORY,
    "taskweaver.memory.memory": ("Memory",),
    "taskweaver.memory.post": ("Post",),
    "taskweaver.memory.round": ("Round",),
    "taskweaver.memory.conversation": ("Conversation",),
    "taskweaver.memory.attachment": ("Attachment", "AttachmentType"),
    "taskweaver.memory.type_vars": ("RoleName",),
    "taskweaver.module": (),
    "taskweaver.module.event_emitter": ("SessionEventEmitter", "PostEventProxy"),
    "taskweaver.module.tracing": ("Tracing", "tracing_decorator", "tracing_decorator_non_class", "get_tracer"),
    "taskweaver.logging": ("TelemetryLogger",),
    "taskweaver.llm": ("LLMApi", "format_chat_message"),
    "taskweaver.llm.util": ("format_chat_message", "ChatMessageType"),
    "taskweaver.config": (),
    "taskweaver.config.module_config": ("ModuleConfig",),
    "taskweaver.config.config_mgt": ("AppConfigSource",),
    "taskweaver.session": ("SessionMetadata",),
}
_SHIM = "__taskweaver_lite_shim__"


def provide_modules() -> None:
    """Make TaskWeaver's role API importable under its own module names in this process."""
    for name, names in PROVIDED.items():
        module = sys.modules.get(name)
        if module is None or not getattr(module, _SHIM, False):
            module = types.ModuleType(name, f"TaskWeaver's {name}, as taskweaver-lite provides it to role classes")
            module.__path__ = []  # a package: `import taskweaver.role.role` resolves children from sys.modules
            setattr(module, _SHIM, True)
            sys.modules[name] = module
        for attribute in names:
            setattr(module, attribute, next(getattr(m, attribute) for m in (memory, lent, api) if hasattr(m, attribute)))
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def import_problem(exc: ImportError) -> str | None:
    """One line for an import a TaskWeaver role file could not make (None: not a TaskWeaver or package problem)."""
    name = exc.name or ""
    if name == "injector" or name.startswith("injector."):
        return f"TaskWeaver's roles are built by the package injector, which is not installed: {INSTALL_HINT}"
    if name.startswith("taskweaver.") or (name == "taskweaver" and "cannot import name" in str(exc)):
        what = f"{name}.{_missing_name(exc)}" if "cannot import name" in str(exc) else name
        return str(lent.NotProvided(what))
    return None


def _missing_name(exc: ImportError) -> str:
    text = str(exc)
    return text.split("'")[1] if text.count("'") >= 2 else "?"


def is_taskweaver_role(cls: type) -> bool:
    """Whether `cls` subclasses TaskWeaver's Role (as provided here)."""
    return issubclass(cls, api.Role)


def injector_problem() -> str | None:
    """The line to show when the injector package is missing (None when installed)."""
    try:
        import injector  # noqa: F401 - only whether it imports
    except ImportError:
        return f"TaskWeaver's roles are built by the package injector, which is not installed: {INSTALL_HINT}"
    return None


class TaskWeaverRole:
    """Runs a TaskWeaver role class through our `reply(request, tools)`."""

    def __init__(self, cls: type[api.Role], *, name: str, alias: str, intro: str) -> None:
        self.cls = cls
        self.entry = api.RoleEntry(name=name, alias=alias, module=cls, intro=intro)
        self.role: api.Role | None = None
        self.emitter = lent.SessionEventEmitter()

    def reply(self, request: RoleRequest, tools: RoleTools) -> OurPost:
        """The TaskWeaver role's reply to the request, as our post."""
        role = self.role = self.role or self._build(tools)
        alias = self.entry.alias
        self.emitter.on_status = lambda status: request.turn.notify(Working("role_working", f"{alias} ({status})"))
        self.emitter.start_round(request.live.id)
        seen = memory.memory_for(tools.working_dir.name, request.history, request.current)
        try:
            post = role.reply(seen)
        except AttributeError as exc:
            missing = _not_provided(exc)
            if missing is None:
                raise
            raise missing from None
        finally:
            self.emitter.end_round(request.live.id)
        if not isinstance(post, memory.Post):
            raise TypeError(f"reply() returned {type(post).__name__}, not a Post (return post_proxy.end())")
        return memory.our_post(post)

    def _build(self, tools: RoleTools) -> api.Role:
        """The role object, built by injector with its config, logger, tracing, emitter, entry, model and session metadata."""
        problem = injector_problem()
        if problem:
            raise RuntimeError(problem)
        import injector

        values = {f"{self.entry.name}.{key}": value for key, value in tools.options.items()}
        source = api.AppConfigSource(values, app_base_path=tools.project_dir)
        metadata = lent.SessionMetadata(session_id=tools.working_dir.name, workspace=str(tools.working_dir), execution_cwd=str(tools.working_dir))
        bound: dict[type, Any] = {
            api.AppConfigSource: source,
            lent.TelemetryLogger: lent.TelemetryLogger(self.entry.name),
            lent.Tracing: lent.Tracing(),
            lent.SessionEventEmitter: self.emitter,
            api.RoleEntry: self.entry,
            lent.LLMApi: lent.LLMApi(lambda messages, max_tokens: tools.complete(messages, max_tokens=max_tokens)),
            lent.SessionMetadata: metadata,
        }

        def configure(binder: injector.Binder) -> None:
            for kind, value in bound.items():
                binder.bind(kind, to=value)

        built: api.Role = injector.Injector([configure]).get(self.cls)
        return built


def _not_provided(exc: AttributeError) -> lent.NotProvided | None:
    """An attribute a role asked of a provided object that TaskWeaver has and we do not: the porting line (None: another error)."""
    owner = getattr(exc, "obj", None)
    if owner is not None and type(owner).__module__ in (api.__name__, lent.__name__, memory.__name__):
        return lent.NotProvided(f"{type(owner).__name__}.{exc.name}")
    return None


class TaskWeaverAdapter:
    """TaskWeaver's role classes as roles of ours (a `RoleAdapter`, registered by entry point)."""

    def prepare(self) -> None:
        """Provide TaskWeaver's module names (`provide_modules`)."""
        provide_modules()

    def import_problem(self, exc: ImportError) -> str | None:
        """The porting line for a TaskWeaver import, or the install line for injector (`import_problem`)."""
        return import_problem(exc)

    def adapt(self, cls: type, *, name: str, alias: str, intro: str) -> Callable[[], RoleHandler] | None:
        """`TaskWeaverRole` for a subclass of TaskWeaver's Role; ValueError naming the install line when injector is missing."""
        if not is_taskweaver_role(cls):
            return None
        problem = injector_problem()
        if problem:
            raise ValueError(problem)
        return functools.partial(TaskWeaverRole, cls, name=name, alias=alias, intro=intro)


ADAPTER = TaskWeaverAdapter()
