"""MCP servers as a cell reaches them: started by the kernel as its children, each tool called as `NAME.tool(**arguments)`.

This file runs in the ipykernel process, not in ours: the executor loads it by path when a session
has `mcp.servers` (as it loads `kernel/plugin_runtime.py`) and calls `start`. So a server runs where
the kernel runs and reaches what the kernel reaches: inside the sandbox, with the kernel's
environment (secrets filtered out) plus the `env` its config gives, in the working folder. It must
stay standalone: the standard library and the `mcp` SDK only.

One event loop on a thread of its own holds every server's connection (a task per server enters
and leaves it, as the SDK's task groups require). A cell's call waits on that loop; an interrupt
(Ctrl-C, Stop, the cell's timeout) cancels the call, and the server goes on for the next one. A
tool that answers with an error raises `McpToolError` with its text, so the CodeGenerator sees a
cell error it can fix. What a server writes on stderr goes to a private file, whose error line
(a traceback's exception, npm's first error rather than its closing notices) explains a server
that would not start.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import keyword
import logging
import mimetypes
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Coroutine
from typing import IO, Any, TextIO, cast

MODULE_NAME = "_taskweaver_mcp"
# Past this many characters a line the server wrote is cut in the one line that names it.
SHOWN_CHARS = 200
_state: dict[str, Any] = {"hub": None, "report": {}, "servers": {}}


class McpToolError(Exception):
    """An MCP tool answered with an error, or could not be reached: the cell fails with this text."""


def start(servers_json: str) -> str:
    """Start the servers `{NAME: {command, env, start_timeout, call_timeout}}` at once, put each in the user namespace; the report as JSON."""
    _quiet_sdk_logs()
    hub = _state["hub"] = _state["hub"] or _Hub()
    servers: dict[str, dict[str, Any]] = json.loads(servers_json)
    pending = {name: hub.submit(_serve(hub, name, spec)) for name, spec in servers.items()}
    report: dict[str, Any] = {}
    for name, future in pending.items():
        wait = float(servers[name].get("start_timeout", 60)) + 5
        try:
            report[name] = {"tools": future.result(wait)}
        except concurrent.futures.TimeoutError:
            report[name] = {"error": f"did not start and list its tools within {wait - 5:g} s (mcp.servers.{name}.start_timeout)"}
            future.cancel()
        except Exception as exc:  # noqa: BLE001 - any failure of one server only leaves that server out, named
            report[name] = {"error": _one_line(str(exc)) or type(exc).__name__}
    _state["report"] = report
    return json.dumps(report)


def report() -> str:
    """The last `start`'s report as JSON (asked for in `user_expressions`)."""
    return json.dumps(_state["report"])


def python_name(tool: str) -> str:
    """The attribute a cell calls a tool by: `get-sum` -> `get_sum`, `class` -> `class_`."""
    name = re.sub(r"\W", "_", tool)
    name = f"_{name}" if not name or name[0].isdigit() else name
    return f"{name}_" if keyword.iskeyword(name) else name


class _Hub:
    """The event loop (on its own thread) that holds every server's connection."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp-servers", daemon=True)
        self.thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run `coroutine` on the hub's loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def wait(self, coroutine: Coroutine[Any, Any, Any], *, timeout: float) -> Any:
        """Run `coroutine` on the hub's loop and wait for its result; an interrupt or the timeout cancels it."""
        future = self.submit(coroutine)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise McpToolError(f"no answer within {timeout:g} s") from None
        except BaseException:  # KeyboardInterrupt (the cell interrupted) above all: the call must not go on
            future.cancel()
            raise


async def _serve(hub: _Hub, name: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Start server `name` and list its tools; its connection then lives in a task of its own until the kernel ends."""
    listed: asyncio.Future[list[dict[str, Any]]] = hub.loop.create_future()
    task = hub.loop.create_task(_connection(name, spec, listed))
    try:
        return await listed
    except BaseException:
        task.cancel()
        raise


async def _connection(name: str, spec: dict[str, Any], listed: asyncio.Future[list[dict[str, Any]]]) -> None:
    """Connect to the server, list its tools into `listed`, and keep the connection open (its process too)."""
    try:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client
    except ImportError:
        listed.set_exception(McpToolError(f"not started: the kernel's Python ({sys.executable}) has no mcp package: pip install 'mcp>=2.3' there"))
        return

    command = [str(part) for part in spec["command"]]
    # A console script of the kernel's own environment is found even when its bin folder is not on PATH.
    command[0] = shutil.which(command[0]) or shutil.which(command[0], path=os.path.dirname(sys.executable)) or command[0]
    env = {**os.environ, **{str(k): str(v) for k, v in (spec.get("env") or {}).items()}}
    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=os.getcwd())
    errlog = cast(TextIO, tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))  # noqa: SIM115 - open as long as the server runs
    garbage: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, Exception) and not garbage:  # a line on its stdout that is not MCP
            garbage.append(_stray_line(message))
            if not listed.done():
                listed.set_exception(McpToolError(f"wrote a line that is not MCP on its stdout ({garbage[0]}): {_describe(command)}"))

    try:
        async with Client(stdio_client(params, errlog=errlog), message_handler=on_message, read_timeout_seconds=float(spec.get("call_timeout", 120))) as client:
            tools = (await client.list_tools()).tools
            _install(name, client, tools, call_timeout=float(spec.get("call_timeout", 120)))
            listed.set_result([_tool_json(tool) for tool in tools])
            await asyncio.Event().wait()  # the connection stays open until the kernel ends (or the task is cancelled)
    except BaseException as exc:
        if not listed.done():
            listed.set_exception(McpToolError(_start_failure(exc, command, errlog)))
        if not isinstance(exc, Exception):
            raise
    finally:
        errlog.close()


def _start_failure(exc: BaseException, command: list[str], errlog: IO[str]) -> str:
    """One line on why a server did not start: the error and the line of its stderr that says why (`error_line`)."""
    errlog.flush()
    errlog.seek(0)
    last = error_line(errlog.read(MAX_STDERR_READ))
    if isinstance(exc, FileNotFoundError):
        why = f"{command[0]} was not found where the kernel runs"
    else:
        why = "; ".join(dict.fromkeys(_one_line(str(e)) or type(e).__name__ for e in _leaves(exc)))
    said = f"; it said: {_one_line(last)}" if last else ""
    return f"did not start ({why}){said}: {_describe(command)}"


MAX_STDERR_READ = 256 * 1024  # what of a server's stderr is read to find why it failed
_NOISE = re.compile(r"^npm (?:notice|warn|WARN)\b")  # npm's update notices and warnings: printed last, never the reason
_ERROR = re.compile(r"(?i)\berror\b|ERR!|exception|fatal|not found|cannot|failed|denied|refused|no such")
_NPM_FIELD = re.compile(r"^npm (?:error|ERR!) (?:code|errno|syscall) \S+$")  # "npm error code E404": the reason is on the next line


def error_line(stderr: str) -> str:
    """The line of a failed server's stderr that says why: a Python traceback's exception, else the first error line (npm's code
    with the line after it), else the last line that is not npm's notice; "" for none."""
    lines = stderr.splitlines()
    if "Traceback (most recent call last):" in lines:
        start = len(lines) - lines[::-1].index("Traceback (most recent call last):")
        raised = next((line for line in lines[start:] if line.strip() and not line[0].isspace()), "")
        if raised:
            return _one_line(raised)
    said = [line.strip() for line in lines if line.strip() and not _NOISE.match(line.strip())]
    for number, line in enumerate(said):
        if _NPM_FIELD.match(line):
            reason = next((later for later in said[number + 1 :] if not _NPM_FIELD.match(later)), "")
            return _one_line(f"{line}: {reason.removeprefix('npm error ').removeprefix('npm ERR! ')}" if reason else line)
        if _ERROR.search(line):
            return _one_line(line)
    return _one_line(said[-1]) if said else ""


def _leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside an exception group (the SDK's task groups raise them), or the error itself."""
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, (list, tuple)) and inner:
        return [leaf for e in inner for leaf in _leaves(e)]
    return [exc]


def _stray_line(error: Exception) -> str:
    """The line a server wrote on stdout that is not MCP, from the parse error the SDK hands over (its text if it names none)."""
    errors = getattr(error, "errors", None)
    try:
        line = errors()[0].get("input") if callable(errors) else None
    except (IndexError, TypeError, AttributeError):
        line = None
    return repr(_one_line(line)) if isinstance(line, str) else _one_line(str(error))


def _describe(command: list[str]) -> str:
    return _one_line(" ".join(command))


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _tool_json(tool: Any) -> dict[str, Any]:
    """What our side shows of a tool: {name, attribute, description, input_schema}."""
    return {"name": tool.name, "attribute": python_name(tool.name), "description": tool.description or "", "input_schema": tool.input_schema or {}}


class McpServerTools:
    """One MCP server in the user namespace: each of its tools is an attribute (`time.get_current_time(timezone="UTC")`)."""

    def __init__(self, name: str, tools: dict[str, McpTool]) -> None:
        self._name = name
        self._tools = tools
        for attribute, tool in tools.items():
            setattr(self, attribute, tool)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        raise AttributeError(f"the MCP server {self._name} has no tool {attribute}; its tools: {', '.join(self._tools) or 'none'}")

    def __dir__(self) -> list[str]:
        return sorted(self._tools)

    def __repr__(self) -> str:
        return f"<MCP server {self._name}: {', '.join(self._tools) or 'no tools'}>"


class McpTool:
    """One tool, called with keyword arguments: structured content as a dict or list, else its text."""

    def __init__(self, server: str, name: str, description: str, client: Any, *, call_timeout: float) -> None:
        self.server = server
        self.name = name
        self.__doc__ = description
        self._client = client
        self._call_timeout = call_timeout

    def __call__(self, *args: Any, **arguments: Any) -> Any:
        if args:
            raise TypeError(f"{self.server}.{python_name(self.name)} takes keyword arguments only, as its parameters are named")
        hub: _Hub = _state["hub"]
        try:
            result = hub.wait(self._client.call_tool(self.name, arguments), timeout=self._call_timeout + 5)
        except McpToolError as exc:
            raise McpToolError(f"{self.server}.{python_name(self.name)}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the SDK's and the server's errors alike become the cell's error, one class
            raise McpToolError(f"{self.server}.{python_name(self.name)}: {_one_line(str(exc)) or type(exc).__name__}") from None
        return _value(self.server, self.name, result)

    def __repr__(self) -> str:
        return f"<MCP tool {self.server}.{python_name(self.name)}>"


def _value(server: str, name: str, result: Any) -> Any:
    """A tool's result as a cell gets it; an error result raised.

    Its images are displayed (the executor keeps them as the cell's artifacts, as it keeps a plot), its
    embedded resources and audio saved in the working folder; each is named in one printed line, so
    neither the cell's output nor the model misses them. The cell gets the structured content, else
    the text, else what was kept of each block.
    """
    texts = [block.text for block in result.content if getattr(block, "type", "") == "text"]
    if result.is_error:
        raise McpToolError(f"{server}.{python_name(name)} failed: {' '.join(texts) or 'no reason given'}")
    kept = [entry for block in result.content if (entry := _keep(f"{server}.{python_name(name)}", block)) is not None]
    if result.structured_content is not None:
        return result.structured_content
    if texts or not result.content:
        return "\n".join(texts)
    return kept


def _keep(called: str, block: Any) -> dict[str, Any] | None:
    """Keep one block that is not text (an image displayed, a resource or audio saved), say so in a line; what was kept, None for text."""
    kind = getattr(block, "type", "")
    if kind == "image":
        mime = str(block.mime_type)
        if _display_image(mime, str(block.data)):
            print(f"[{called} returned an image ({mime}): kept as this cell's artifact]")
            return {"type": "image", "mime_type": mime, "kept": "artifact"}
        saved = _save(_decoded(str(block.data)), _file_name(called, None, mime))
        print(f"[{called} returned an image ({mime}): saved as {saved} in the working folder]")
        return {"type": "image", "mime_type": mime, "file": saved}
    if kind == "audio":
        mime = str(block.mime_type)
        saved = _save(_decoded(str(block.data)), _file_name(called, None, mime))
        print(f"[{called} returned audio ({mime}): saved as {saved} in the working folder]")
        return {"type": "audio", "mime_type": mime, "file": saved}
    if kind == "resource":
        resource = block.resource
        uri, mime = str(resource.uri), str(getattr(resource, "mime_type", None) or "application/octet-stream")
        data = resource.text.encode("utf-8") if getattr(resource, "text", None) is not None else _decoded(str(resource.blob))
        saved = _save(data, _file_name(called, uri, mime))
        print(f"[{called} returned the resource {uri} ({mime}): saved as {saved} in the working folder]")
        return {"type": "resource", "uri": uri, "mime_type": mime, "file": saved}
    if kind == "resource_link":
        print(f"[{called} returned a link to the resource {block.uri} (not read)]")
        return {"type": "resource_link", "uri": str(block.uri), "name": str(getattr(block, "name", "") or "")}
    return None


_SHOWN_IMAGES = ("image/png", "image/jpeg", "image/svg+xml")  # what the executor keeps as a displayed image (kernel/output.py)
_SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/webp": ".webp", "image/svg+xml": ".svg", "text/plain": ".txt"}
MAX_KEPT_BYTES = 50 * 1024 * 1024  # the most one block of a tool's result writes to the working folder


def _display_image(mime: str, data: str) -> bool:
    """Display the base64 image as the cell's output (the executor saves it as an artifact); False for a type it does not keep."""
    if mime not in _SHOWN_IMAGES:
        return False
    try:
        from IPython.display import display
    except ImportError:
        return False
    shown = base64.b64decode(data).decode("utf-8", errors="replace") if mime == "image/svg+xml" else data
    display({mime: shown, "text/plain": f"<image {mime}>"}, raw=True)
    return True


def _decoded(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (ValueError, TypeError):
        return b""


def _file_name(called: str, uri: str | None, mime: str) -> str:
    """A plain file name for a kept block: the last part of its URI, else the tool's name; the suffix its type implies."""
    last = re.sub(r"[^A-Za-z0-9._-]+", "_", (uri or "").rstrip("/").rsplit("/", 1)[-1]).strip("._")
    stem = last or called.replace(".", "-")
    suffix = _SUFFIXES.get(mime) or mimetypes.guess_extension(mime) or ".bin"
    return stem if "." in last else f"{stem}{suffix}"


def _save(data: bytes, name: str) -> str:
    """Write `data` as a new file in the working folder (never over an existing file or through a link); the name it got."""
    stem, dot, suffix = name.rpartition(".") if "." in name else (name, "", "")
    for number in range(1, 1000):
        candidate = name if number == 1 else f"{stem}-{number}{dot}{suffix}"
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as out:
            out.write(data[:MAX_KEPT_BYTES])
        return candidate
    raise McpToolError(f"no free file name like {name} in the working folder")


def _install(name: str, client: Any, tools: list[Any], *, call_timeout: float) -> None:
    """Put the server in the user namespace under `name`, hidden from the variables (as plugins are)."""
    calls = {python_name(tool.name): McpTool(name, tool.name, tool.description or "", client, call_timeout=call_timeout) for tool in tools}
    server = _state["servers"][name] = McpServerTools(name, calls)
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.user_ns[name] = server
        shell.user_ns_hidden[name] = server
        shell.user_ns["McpToolError"] = shell.user_ns_hidden["McpToolError"] = McpToolError


def _quiet_sdk_logs() -> None:
    """The SDK logs a server's stray stdout lines as errors: kept off the cells' output (the one line says it)."""
    logger = logging.getLogger("mcp")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
