"""Plugins as they live inside the kernel: `Plugin`, `register_plugin`, the context, and loading.

This file runs in the ipykernel process, not in ours. `process.py` loads it by path at kernel start
(as `_taskweaver_plugins`) and registers it under the names plugin files import from, so that both
`from taskweaver_lite.plugin import ...` and TaskWeaver's `from taskweaver.plugin import ...` work
unchanged. The executor then sends each plugin's *source text* with `install(...)`: nothing is read
from the project folder here, so a sandboxed or remote kernel gets the plugins the same way. It
must stay standalone (no taskweaver_lite imports: they would pull the whole agent into the kernel).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback
import types
from typing import Any

MODULE_NAME = "_taskweaver_plugins"
# Plugin files import from these; both resolve to this module inside the kernel.
SHIM_NAMES = ("taskweaver.plugin", "taskweaver_lite.plugin")
MAX_LOG_LINES = 20
MAX_LOG_CHARS = 300
_TEXT_TYPES = {"txt", "svg", "html", "file", "chart"}

# What plugins reported during the current cell; the executor drains it with `drain()` after each cell.
# "broken": plugins whose call failed on an import (a dependency imported inside `__call__`).
_reported: dict[str, list[str]] = {"logs": [], "artifacts": [], "broken": []}
_state: dict[str, Any] = {"session_id": "", "working_dir": "", "classes": {}, "failures": [], "cell": 0, "tests": {}, "broken": set()}


class PluginContext:
    """What a plugin can do besides computing: its session's ids, and files reported as artifacts."""

    def __init__(self, plugin_name: str) -> None:
        self.plugin_name = plugin_name

    @property
    def session_id(self) -> str:
        """The session's id (the name of its folder)."""
        return str(_state["session_id"])

    @property
    def env_id(self) -> str:
        """TaskWeaver's environment id; here the session's, as each session has its own kernel."""
        return self.session_id

    @property
    def execution_id(self) -> str:
        """An id of the running cell, unique within the session: `<session>-<cell number>`.

        The number is the executor's (it names the cell's output files), not IPython's execution
        count, which starts again at 1 in a restarted kernel.
        """
        return f"{self.session_id}-{_state['cell'] + 1}"

    def create_artifact_path(self, name: str, file_name: str) -> tuple[str, str]:
        """A path in the working folder for a file the plugin writes itself; returns (id, path)."""
        path = os.path.join(_state["working_dir"] or os.getcwd(), os.path.basename(file_name) or f"{name}.dat")
        return os.path.basename(path), path

    def add_artifact(self, name: str, file_name: str, type: str, val: Any, desc: str | None = None) -> str:
        """Write `val` as `file_name` in the working folder and report it with the cell's result; returns its id."""
        artifact_id, path = self.create_artifact_path(name, file_name)
        _write(path, type, val)
        _reported["artifacts"].append(path)
        if desc and len(_reported["logs"]) < MAX_LOG_LINES:
            _reported["logs"].append(f"[{self.plugin_name}] saved {os.path.basename(path)} ({type}): {str(desc)[:MAX_LOG_CHARS]}")
        return artifact_id

    def get_session_var(self, name: str, default: Any = None) -> Any:
        """A variable of the user's namespace, or `default`."""
        shell = _shell()
        return shell.user_ns.get(name, default) if shell is not None else default


class Plugin:
    """Base of every plugin: `config` from the YAML's `configurations`, `ctx`, and `log`."""

    def __init__(self, name: str, ctx: PluginContext, config: dict[str, Any]) -> None:
        self.name = name
        self.ctx = ctx
        self.config = config

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """What the plugin does; every registered subclass overrides it (`register_plugin` checks)."""
        raise TypeError(f"the plugin {self.name} defines no __call__")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__call__" in cls.__dict__:
            cls.__call__ = _reporting_import_errors(cls.__dict__["__call__"])  # type: ignore[method-assign]

    def log(self, level: str, message: str) -> None:
        """Record a message; it reaches the result of the cell the model reads."""
        if len(_reported["logs"]) < MAX_LOG_LINES:
            _reported["logs"].append(f"[{self.name}] {str(level).upper()}: {str(message)[:MAX_LOG_CHARS]}")

    def get_env(self, variable_name: str) -> str:
        """The environment variable `PLUGIN_<name>_<variable>` (TaskWeaver's convention); KeyError if unset."""
        key = f"PLUGIN_{self.name}_{variable_name}"
        if key not in os.environ:
            raise KeyError(f"the environment variable {key} that the plugin {self.name} needs is not set")
        return os.environ[key]


def _reporting_import_errors(call: Any) -> Any:
    """`call` that, when it fails on an import, reports its plugin broken once (the error still reaches the cell)."""

    def guarded(self: Plugin, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(self, *args, **kwargs)
        except ImportError as exc:
            if self.name not in _state["broken"]:
                _state["broken"].add(self.name)
                _reported["broken"].append(f"{self.name}: its call failed on an import: {type(exc).__name__}: {exc}")
            raise

    guarded.__name__, guarded.__doc__, guarded.__wrapped__ = call.__name__, call.__doc__, call  # type: ignore[attr-defined]
    return guarded


def test_plugin(name: str | None = None, description: str | None = None) -> Any:
    """TaskWeaver's decorator for a plugin's self-test: the test is kept (by name) and the function returned unchanged."""

    def keep(func: Any) -> Any:
        if callable(func):
            title = name or func.__name__
            _state["tests"][title] = (description if description is not None else func.__doc__ or "", func)
        return func

    return keep


def register_plugin(cls: Any) -> Any:
    """Decorator marking the plugin of the file being loaded: a Plugin subclass, or (as TaskWeaver allows) a plain function."""
    if callable(cls) and not isinstance(cls, type):
        return _function_plugin(cls)
    if not (isinstance(cls, type) and issubclass(cls, Plugin)):
        raise TypeError(f"@register_plugin is for subclasses of Plugin, not {cls!r}")
    if cls.__call__ is Plugin.__call__:
        # Refused here, so the plugin is reported broken when it loads, not when the model first calls it.
        raise TypeError(f"{cls.__name__} defines no __call__: a plugin is called like a function")
    _state["classes"][cls.__module__] = cls
    return cls


def _function_plugin(func: Any) -> Any:
    """A function registered as a plugin: a Plugin class whose call is the function's; the function is returned as it is."""

    def call(self: Plugin, *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    cls = type(f"FunctionPlugin_{func.__name__}", (Plugin,), {"__call__": call, "__module__": func.__module__})
    _state["classes"][cls.__module__] = cls
    return func


def register_shims() -> None:
    """Make `taskweaver.plugin` and `taskweaver_lite.plugin` importable as this module inside the kernel."""
    me = sys.modules[MODULE_NAME]
    if "taskweaver" not in sys.modules:
        parent = types.ModuleType("taskweaver")
        parent.__path__ = []  # a package, so `import taskweaver.plugin` resolves its child from sys.modules
        sys.modules["taskweaver"] = parent
    sys.modules["taskweaver"].plugin = me  # type: ignore[attr-defined]
    for name in SHIM_NAMES:
        sys.modules[name] = me


def missing_call_imports(spec: dict[str, Any]) -> list[str]:
    """Modules the plugin's `__call__` imports (outside a try) that cannot be found here: its first call would fail."""
    import ast
    import importlib.util

    missing = []
    for node in ast.walk(ast.parse(spec["source"])):
        if isinstance(node, ast.FunctionDef) and node.name == "__call__":
            guarded = {id(n) for t in ast.walk(node) if isinstance(t, ast.Try) for n in ast.walk(t)}
            for found in ast.walk(node):
                names = [a.name for a in found.names] if isinstance(found, ast.Import) else [found.module or ""] if isinstance(found, ast.ImportFrom) else []
                for name in names:
                    top = name.split(".")[0]
                    if top and id(found) not in guarded and importlib.util.find_spec(top) is None and top not in missing:
                        missing.append(top)
    return missing


def check(specs_json: str) -> list[str]:
    """`install`'s failures plus, for the plugins that load, the imports inside `__call__` that would fail (the `plugins` command)."""
    failures = install(specs_json, "check", ".")
    for spec in json.loads(specs_json):
        absent = missing_call_imports(spec) if not any(line.startswith(f"{spec['source_file']}: ") for line in failures) else []
        if absent:
            failures.append(f"{spec['source_file']}: its __call__ imports {', '.join(absent)}, not installed where the kernel runs")
    return failures


def install(specs_json: str, session_id: str, working_dir: str, cells_before: int = 0) -> list[str]:
    """Load each plugin's source and put an instance in the user namespace; returns one line per failure.

    Instances are also entered in `user_ns_hidden`, which keeps them out of the variable snapshot
    and out of `%who`; a failing plugin is left out and named, the others still load.
    """
    _state.update(session_id=session_id, working_dir=working_dir, failures=[], cell=cells_before)
    shell = _shell()
    for spec in json.loads(specs_json):
        try:
            instance = _instantiate(spec)
        except Exception as exc:  # noqa: BLE001 - any error in a plugin file must only remove that plugin
            _state["failures"].append(f"{spec['source_file']}: {type(exc).__name__}: {exc}{_where(exc)}")
            continue
        if shell is not None:
            shell.user_ns[spec["name"]] = instance
            shell.user_ns_hidden[spec["name"]] = instance
    return list(_state["failures"])


def failures() -> str:
    """The failures of the last `install` as JSON (asked for in `user_expressions`)."""
    return json.dumps(_state["failures"])


def drain() -> str:
    """What plugins logged and saved since the last call, as JSON; emptied for the next cell."""
    out = json.dumps(_reported)
    _reported["logs"], _reported["artifacts"], _reported["broken"] = [], [], []
    _state["cell"] += 1
    return out


def _instantiate(spec: dict[str, Any]) -> Plugin:
    module_name = f"_taskweaver_plugin_{spec['code']}"
    module = sys.modules.get(module_name)
    if module is None:  # several YAML specs may share one code file: load it once
        module = types.ModuleType(module_name)
        module.__file__ = spec["source_file"]
        sys.modules[module_name] = module
        try:
            exec(compile(spec["source"], spec["source_file"], "exec"), module.__dict__)
        except BaseException:
            del sys.modules[module_name]
            raise
    cls = _state["classes"].get(module_name)
    if cls is None:
        raise LookupError("no class decorated with @register_plugin (from taskweaver_lite.plugin import Plugin, register_plugin)")
    instance: Plugin = cls(spec["name"], PluginContext(spec["name"]), dict(spec.get("config") or {}))
    return instance


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    return f" (line {frames[-1].lineno})" if frames else ""


def _write(path: str, kind: str, val: Any) -> None:
    if kind == "df" and hasattr(val, "to_csv"):
        val.to_csv(path, index=False)
    elif isinstance(val, bytes):
        with open(path, "wb") as f:
            f.write(val)
    elif kind in ("image", "chart") and isinstance(val, str) and not val.lstrip().startswith("<"):
        with open(path, "wb") as f:
            f.write(base64.b64decode(val))  # TaskWeaver passes images as base64 text
    elif kind in _TEXT_TYPES or isinstance(val, str):
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(val))
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(repr(val))


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()
