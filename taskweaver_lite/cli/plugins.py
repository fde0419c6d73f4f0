"""`taskweaver-lite plugins` and `/plugins`: every plugin with its state, broken ones with their error.

The command also imports each enabled plugin the way the kernel would, in a short-lived process of
this interpreter with the kernel's environment, so an import that fails in the kernel (a missing
dependency, an error at module level) shows here before any session starts. In a chat, the
kernel's own import failures become one stderr line each (`report_kernel_failures`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from taskweaver_lite.cli.console import PlainConsole, RichConsole
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.kernel import plugin_runtime
from taskweaver_lite.plugins.catalog import PluginEntry, discover, entries_as_json
from taskweaver_lite.safety.terminal import strip_controls
from taskweaver_lite.session.session import Session

IMPORT_CHECK_TIMEOUT = 60.0
# Loads the in-kernel runtime by path (as the kernel does) and installs the specs read from stdin.
_CHECK = (
    "import importlib.util as u, json, sys\n"
    "p = u.spec_from_file_location({module!r}, {path!r}); m = u.module_from_spec(p); sys.modules[p.name] = m\n"
    "p.loader.exec_module(m); m.register_shims()\n"
    "print(json.dumps(m.check(sys.stdin.read())))\n"
)


def run_plugins(project: Path, *, as_json: bool) -> int:
    """`taskweaver-lite plugins`: list the project's and installed packages' plugins with their state."""
    config = load_config(project)
    entries = with_import_errors(discover(config.project_dir).entries)
    if as_json:
        print(entries_as_json(entries))
    else:
        print(plugin_table(entries))
    return 0


def plugin_table(entries: Sequence[PluginEntry], failures: Sequence[str] = ()) -> str:
    """One line per plugin: name, state, and the file and error of a broken one; kernel failures after."""
    if not entries:
        return "No plugins. Put <name>.yaml and <name>.py in PROJECT_DIR/plugins/ (see its README.md)."
    width = max(len(e.name) for e in entries)
    lines = []
    failed_calls = {line.partition(": ")[0]: line.partition(": ")[2] for line in failures}
    for entry in entries:
        state, detail = entry.state, entry.spec.description.partition("\n")[0] if entry.spec else ""
        if entry.state == "broken":
            detail = f"{entry.path}: {entry.error}"
        elif entry.name in failed_calls:  # its first call failed on an import in this kernel
            state, detail = "broken", f"{entry.path}: {failed_calls.pop(entry.name)}"
        lines.append(f"{entry.name:<{width}}  {state:<8}  {strip_controls(detail)}")
    lines += [f"not loaded in the kernel: {strip_controls(name + ': ' + line)}" for name, line in failed_calls.items()]
    return "\n".join(lines)


def with_import_errors(entries: Sequence[PluginEntry]) -> tuple[PluginEntry, ...]:
    """`entries` with the enabled plugins whose import fails turned broken, naming the error."""
    enabled = [e.spec for e in entries if e.state == "enabled" and e.spec is not None]
    if not enabled:
        return tuple(entries)
    failures = _import_failures([spec.kernel_spec() for spec in enabled])
    result = []
    for entry in entries:
        error = next((line.partition(": ")[2] for line in failures if entry.spec and line.startswith(f"{entry.spec.source_path}: ")), "")
        result.append(dataclasses.replace(entry, state="broken", error=f"import failed: {error}") if error else entry)
    return tuple(result)


def _import_failures(specs: list[dict[str, object]]) -> list[str]:
    """`plugin_runtime.install`'s failure lines, from a fresh process; every plugin fails if the check itself does."""
    from taskweaver_lite.kernel.process import filtered_environment

    script = _CHECK.format(module=plugin_runtime.MODULE_NAME, path=plugin_runtime.__file__)
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(specs),
        capture_output=True,
        text=True,
        timeout=IMPORT_CHECK_TIMEOUT,
        env=filtered_environment(os.environ, allowed=[]),
    )
    try:
        value = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        reason = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return [f"{spec['source_file']}: the import check did not finish ({reason[0]})" for spec in specs]
    return [str(line) for line in value] if isinstance(value, list) else []


def report_kernel_failures(session: Session, renderer: RichConsole | PlainConsole, *, to_stderr: Callable[[str], None]) -> None:
    """Plugins whose import failed in the kernel, one stderr line each, once the kernel has started.

    Piped, we wait for the kernel here: the first request would wait for it anyway, and the lines
    come out before any answer. On a terminal a background thread hands them to the renderer, so
    the prompt is not held up.
    """
    executor: Any = session.executor
    if not hasattr(executor, "plugin_failures") or not session.plugins.enabled:
        return  # nothing to load, or an executor that does not load plugins

    def lines() -> list[str]:
        try:
            executor.wait_ready()
        except TaskWeaverError:
            return []  # the first request reports a kernel that cannot start, with the way out
        return [strip_controls(f"plugin {line}; the session goes on without it") for line in executor.plugin_failures]

    def hand_over(rich: RichConsole) -> None:
        for line in lines():
            rich.notice(line)

    if isinstance(renderer, RichConsole):
        threading.Thread(target=hand_over, args=(renderer,), name="plugin-report", daemon=True).start()
        return
    for line in lines():
        to_stderr(line)
