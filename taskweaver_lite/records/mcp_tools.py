"""MCP servers as records: what a kernel reported of the servers it started, each with its tools or the reason it did not start.

The kernel-side client (`kernel/mcp/client.py`) sends this JSON shape back; the CodeGenerator's prompt shows
the tools (`plugins/prompt.py`), and the plugin listings show the servers that failed. A tool's
parameters come from its JSON Schema (`inputSchema`), as a plugin's come from its YAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taskweaver_lite.records.plugin_spec import Parameter

# JSON Schema types as the Python types a cell passes.
_PYTHON_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list", "object": "dict", "null": "None"}


@dataclass(frozen=True)
class McpTool:
    """One tool of an MCP server: its name on the wire, the Python name a cell calls it by, its description and parameters."""

    name: str
    attribute: str  # `get-sum` is called as `get_sum`: a Python name
    description: str = ""
    parameters: tuple[Parameter, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> McpTool:
        """A tool from the kernel's report: {name, attribute, description, input_schema}."""
        schema = data.get("input_schema")
        return cls(
            name=str(data.get("name", "")),
            attribute=str(data.get("attribute") or data.get("name", "")),
            description=str(data.get("description") or ""),
            parameters=schema_parameters(schema if isinstance(schema, dict) else {}),
        )


@dataclass(frozen=True)
class McpServer:
    """An MCP server as the kernel started it: its tools, or the one line that says why it is not available."""

    name: str
    tools: tuple[McpTool, ...] = ()
    error: str = ""

    @property
    def started(self) -> bool:
        """Whether its tools can be called (it started and listed them)."""
        return not self.error

    def line(self) -> str:
        """The one line a listing shows for a server that did not start."""
        return f"MCP server {self.name}: {self.error}"

    @classmethod
    def from_dict(cls, name: str, data: Any) -> McpServer:
        """A server from the kernel's report: {tools: [...]} or {error: "..."}; anything else is an error naming it."""
        if not isinstance(data, dict):
            return cls(name=name, error="the kernel sent no report on it")
        if data.get("error"):
            return cls(name=name, error=str(data["error"]))
        tools = data.get("tools")
        return cls(name=name, tools=tuple(McpTool.from_dict(t) for t in tools if isinstance(t, dict)) if isinstance(tools, list) else ())


def schema_parameters(schema: dict[str, Any]) -> tuple[Parameter, ...]:
    """A tool's JSON Schema `properties` as parameters: type, required, description and default, required ones first."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return ()
    required = set(schema.get("required") or ())
    found = [
        Parameter(
            name=str(name),
            type=_python_type(spec),
            required=name in required,
            description=str(spec.get("description") or "") if isinstance(spec, dict) else "",
            default=spec.get("default") if isinstance(spec, dict) else None,
            has_default=isinstance(spec, dict) and "default" in spec,
        )
        for name, spec in properties.items()
    ]
    return tuple(sorted(found, key=lambda p: not p.required))


def _python_type(spec: Any) -> str:
    """`{"type": "string"}` -> `str`; an enum lists its values; a union of types joins them with `|`."""
    if not isinstance(spec, dict):
        return "Any"
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return "Literal[" + ", ".join(repr(v) for v in spec["enum"]) + "]"
    kind = spec.get("type")
    if isinstance(kind, list):
        return " | ".join(_PYTHON_TYPES.get(str(k), "Any") for k in kind) or "Any"
    if isinstance(kind, str):
        return _PYTHON_TYPES.get(kind, "Any")
    options = spec.get("anyOf") or spec.get("oneOf")
    if isinstance(options, list) and options:
        return " | ".join(dict.fromkeys(_python_type(option) for option in options))
    return "Any"
