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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from taskweaver_lite.cli.console import PlainConsole, RichConsole
from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig, McpServerConfig
from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.kernel import plugin_runtime
from taskweaver_lite.kernel.mcp import client as mcp_client
from taskweaver_lite.plugins.catalog import PluginEntry, discover, entries_as_json
from taskweaver_lite.records.mcp_tools import McpServer
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

# Starts the servers read from stdin with the kernel's MCP client (loaded by path, as the kernel does) and prints its report.
_MCP_CHECK = (
    "import importlib.util as u, os, sys\n"
    "p = u.spec_from_file_location({module!r}, {path!r}); m = u.module_from_spec(p); sys.modules[p.name] = m\n"
    "p.loader.exec_module(m); print(m.start(sys.stdin.read()), flush=True); os._exit(0)\n"
)


def run_plugins(project: Path, *, as_json: bool) -> int:
    """`taskweaver-lite plugins`: list the project's and installed packages' plugins with their state, and the MCP servers."""
    config = load_config(project)
    entries = with_import_errors(discover(config.project_dir).entries)
    servers = checked_mcp_servers(config.mcp.servers, execution=config.execution) if config.mcp.servers else ()
    if as_json:
        rows = json.loads(entries_as_json(entries)) + [_server_json(server) for server in servers]
        print(json.dumps(rows, indent=2))
    elif servers:
        print("\n".join([plugin_table(entries), "MCP servers (mcp.servers):", *mcp_lines(servers)]))
    else:
        print(plugin_table(entries))
    return 0


def checked_mcp_servers(servers: Mapping[str, McpServerConfig], *, execution: ExecutionConfig) -> tuple[McpServer, ...]:
    """The MCP servers started once as a kernel starts them (in a short-lived process of this interpreter), with their tools or why not.

    A server that needs the network is refused, as the kernel refuses it, when the kernel's sandbox
    has none; the others are checked outside the sandbox.
    """
    from taskweaver_lite.kernel.mcp.launch import McpLaunch
    from taskweaver_lite.kernel.process import filtered_environment
    from taskweaver_lite.kernel.sandbox.bwrap import uses_sandbox

    launch = McpLaunch(servers, network=execution.network or not uses_sandbox(execution))
    if not launch.servers:
        return launch.refused
    script = _MCP_CHECK.format(module=mcp_client.MODULE_NAME, path=mcp_client.__file__)
    specs = json.dumps({name: spec.model_dump(mode="json") for name, spec in launch.servers.items()})
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], input=specs, capture_output=True, text=True, timeout=launch.wait, env=filtered_environment(os.environ, allowed=[])
        )
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, ValueError):
        report = {}
    checked = tuple(McpServer.from_dict(name, report.get(name) if isinstance(report, dict) else None) for name in launch.servers)
    return (*launch.refused, *checked)


def _server_json(server: McpServer) -> dict[str, object]:
    """An MCP server in `plugins --json`: {name, kind: mcp_server, state: enabled|broken, error, tools}."""
    state = "enabled" if server.started else "broken"
    return {"name": server.name, "kind": "mcp_server", "state": state, "error": server.error, "tools": [t.attribute for t in server.tools]}


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


def kernel_failures(executor: Any) -> list[str]:
    """What the kernel could not load, one line each: plugins (named so) and MCP servers."""
    plugins = [f"plugin {line}" for line in getattr(executor, "plugin_failures", ())]
    servers: tuple[McpServer, ...] = getattr(executor, "mcp_servers", ())
    return plugins + [server.line() for server in servers if not server.started]


def mcp_lines(servers: Sequence[McpServer]) -> list[str]:
    """/plugins' lines for the MCP servers: each with its tools, or why it did not start."""
    width = max((len(server.name) for server in servers), default=0)
    return [
        f"{server.name:<{width}}  {'mcp':<8}  {', '.join(t.attribute for t in server.tools) or 'no tools'}" if server.started else strip_controls(server.line())
        for server in servers
    ]


def report_kernel_failures(session: Session, renderer: RichConsole | PlainConsole, *, to_stderr: Callable[[str], None]) -> None:
    """Plugins whose import failed in the kernel, one stderr line each, once the kernel has started.

    Piped, we wait for the kernel here: the first request would wait for it anyway, and the lines
    come out before any answer. On a terminal a background thread hands them to the renderer, so
    the prompt is not held up.
    """
    executor: Any = session.executor
    if not hasattr(executor, "plugin_failures") or not (session.plugins.enabled or session.config.mcp.servers):
        return  # nothing to load, or an executor that does not load plugins

    def lines() -> list[str]:
        try:
            executor.wait_ready()
        except TaskWeaverError:
            return []  # the first request reports a kernel that cannot start, with the way out
        return [strip_controls(f"{line}; the session goes on without it") for line in kernel_failures(executor)]

    def hand_over(rich: RichConsole) -> None:
        for line in lines():
            rich.notice(line)

    if isinstance(renderer, RichConsole):
        threading.Thread(target=hand_over, args=(renderer,), name="plugin-report", daemon=True).start()
        return
    for line in lines():
        to_stderr(line)
