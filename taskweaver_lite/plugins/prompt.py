"""Plugins as the models see them: typed Python stubs for the CodeGenerator, one line each for the Planner.

A stub is generated from the YAML spec alone, so what the model reads and what the kernel loads
cannot drift: required parameters first-class with their types (where TaskWeaver printed `Any`),
optional ones with their defaults, the description and each parameter's description as the
docstring, the examples after it. With many plugins, `select` ranks them lexically against the
current step (BM25 over name, description and parameters: offline, no model download). In a
small window the block keeps to its share of the CodeGenerator's budget: past it, each plugin is
shown as its typed signature with the first sentence of its description.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.records.mcp_tools import McpServer
from taskweaver_lite.records.plugin_spec import Parameter, PluginSpec

PLANNER_LINE_CHARS = 160
# The plugin block's share of the CodeGenerator's prompt budget before it shows signatures only
# (291 tokens at an 8k window: two full stubs take ~400).
PLUGINS_SHARE = 0.08
# BM25's usual constants: term frequency saturates at k1, length normalised by b.
_K1, _B = 1.2, 0.75
_WORD = re.compile(r"[a-z0-9]+")


def render_stub(spec: PluginSpec) -> str:
    """One plugin as a Python signature with its docstring, the way the CodeGenerator reads it."""
    lines = [f"def {spec.name}({_signature(spec.parameters)}) -> {_returns(spec.returns)}:", '    """' + _first_line(spec.description)]
    rest = spec.description.partition("\n")[2].strip()
    if rest:
        lines += ["", *_indented(rest, 4)]
    if spec.parameters:
        lines += ["", "    Args:"] + [f"        {p.name}: {_argument_note(p)}" for p in spec.parameters]
    if spec.returns:
        lines += ["", "    Returns:"] + [f"        {p.name} ({p.type}): {p.description}".rstrip(": ") for p in spec.returns]
    if spec.examples:
        lines += ["", "    Examples:", *_indented(spec.examples, 8)]
    lines.append('    """')
    return "\n".join(lines)


def render_block(specs: Sequence[PluginSpec], *, max_tokens: int | None = None, tokenizer: Tokenizer | None = None) -> str:
    """The stubs of `specs` as one Python block ('' when there are none); compact stubs when the full ones pass `max_tokens`."""
    if not specs:
        return ""
    block = "```python\n" + "\n\n".join(render_stub(s) for s in specs) + "\n```"
    if max_tokens is None or tokenizer is None or tokenizer.count(block) <= max_tokens:
        return block
    return "```python\n" + "\n".join(_compact_stub(s) for s in specs) + "\n```"


def render_mcp_block(servers: Sequence[McpServer], *, max_tokens: int | None = None, tokenizer: Tokenizer | None = None) -> str:
    """The tools of the MCP servers that started, one class per server with a stub per tool ('' when none); compact past `max_tokens`."""
    started = [server for server in servers if server.started and server.tools]
    if not started:
        return ""
    block = "```python\n" + "\n\n".join(_mcp_server_stub(server, compact=False) for server in started) + "\n```"
    if max_tokens is None or tokenizer is None or tokenizer.count(block) <= max_tokens:
        return block
    return "```python\n" + "\n\n".join(_mcp_server_stub(server, compact=True) for server in started) + "\n```"


def _mcp_server_stub(server: McpServer, *, compact: bool) -> str:
    """A server as a class whose methods are its tools: keyword arguments from the tool's JSON Schema, its description as docstring."""
    lines = [f"class {server.name}:  # MCP server: call its tools as {server.name}.<tool>(name=value, ...)"]
    for tool in server.tools:
        arguments = ", ".join(["*", *(_parameter(p, keyword_only=True) for p in tool.parameters)]) if tool.parameters else ""
        head = f"    def {tool.attribute}({arguments}) -> dict | list | str:"
        if compact:
            lines.append(f"{head} ...  # {_first_sentence(tool.description)}".rstrip(" #"))
            continue
        lines += [head, '        """' + (_first_line(tool.description) or f"The MCP tool {tool.name}.")]
        rest = tool.description.strip().partition("\n")[2].strip()
        if rest:
            lines += ["", *_indented(rest, 8)]
        if tool.parameters:
            lines += ["", "        Args:"] + [f"            {p.name}: {_argument_note(p)}" for p in tool.parameters]
        lines.append('        """')
    return "\n".join(lines)


def _first_sentence(text: str) -> str:
    sentence, dot, _ = _first_line(text).partition(". ")
    return sentence + "." if dot else sentence


def _compact_stub(spec: PluginSpec) -> str:
    """One plugin in one or two lines: its typed signature and its description's first sentence."""
    return f"def {spec.name}({_signature(spec.parameters)}) -> {_returns(spec.returns)}: ...  # {planner_line(spec).partition(': ')[2]}"


def planner_line(spec: PluginSpec) -> str:
    """What the Planner knows of a plugin: its name and the first sentence of its description."""
    text = _first_line(spec.description)
    sentence, dot, _ = text.partition(". ")
    text = sentence + "." if dot else text
    if len(text) > PLANNER_LINE_CHARS:
        text = text[: PLANNER_LINE_CHARS - 3].rstrip() + "..."
    return f"{spec.name}: {text}"


def _signature(parameters: Sequence[Parameter]) -> str:
    parts: list[str] = []
    optional_seen = keyword_only = False
    for index, p in enumerate(parameters):
        if not p.required and not optional_seen:
            optional_seen = True
            # Python wants defaulted parameters last; a required one after them makes the rest keyword-only.
            if any(q.required for q in parameters[index + 1 :]):
                parts.append("*")
                keyword_only = True
        parts.append(_parameter(p, keyword_only=keyword_only))
    return ", ".join(parts)


def _parameter(p: Parameter, *, keyword_only: bool) -> str:
    if p.required:
        return f"{p.name}: {p.type}"
    if p.has_default:
        return f"{p.name}: {p.type} = {p.default!r}"
    kind = p.type if p.type in ("Any", "None") or p.type.endswith("| None") else f"{p.type} | None"
    return f"{p.name}: {kind} = None"


def _argument_note(p: Parameter) -> str:
    if p.required:
        state = "required"
    elif p.has_default:
        state = f"optional, default {p.default!r}"
    else:
        state = "optional"
    return f"{p.description} ({state})" if p.description else f"({state})"


def _returns(returns: Sequence[Parameter]) -> str:
    if not returns:
        return "None"
    if len(returns) == 1:
        return returns[0].type
    return "tuple[" + ", ".join(r.type for r in returns) + "]"


def _first_line(text: str) -> str:
    return text.strip().partition("\n")[0].strip()


def _indented(text: str, spaces: int) -> list[str]:
    pad = " " * spaces
    return [f"{pad}{line}".rstrip() for line in text.strip().splitlines()]


def select(specs: Sequence[PluginSpec], query: str, *, top_k: int, keep: Iterable[str] = ()) -> tuple[PluginSpec, ...]:
    """The `top_k` plugins most relevant to `query`, plus every plugin named in `keep`, in catalog order."""
    kept = set(keep)
    documents = [_words(_document(s)) for s in specs]
    scores = _bm25(_words(query), documents)
    ranked = sorted(range(len(specs)), key=lambda i: (-scores[i], i))
    chosen = {i for i in ranked[:top_k] if scores[i] > 0} | {i for i, s in enumerate(specs) if s.name in kept}
    return tuple(specs[i] for i in sorted(chosen))


def used_plugins(specs: Sequence[PluginSpec], code: Iterable[str]) -> set[str]:
    """Names of the plugins that code called (`name(`), so that they stay shown."""
    text = "\n".join(code)
    return {s.name for s in specs if re.search(rf"\b{re.escape(s.name)}\s*\(", text)}


def _document(spec: PluginSpec) -> str:
    params = " ".join(f"{p.name} {p.description}" for p in (*spec.parameters, *spec.returns))
    return f"{spec.name.replace('_', ' ')} {spec.name} {spec.description} {params}"


def _words(text: str) -> list[str]:
    # A light stem (plural s) so "anomalies"/"anomaly" and "rows"/"row" meet; nothing language-specific beyond it.
    return [_stem(w) for w in _WORD.findall(text.lower())]


def _stem(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _bm25(query: list[str], documents: list[list[str]]) -> list[float]:
    if not documents:
        return []
    average = sum(map(len, documents)) / len(documents) or 1.0
    containing = Counter(word for doc in documents for word in set(doc))
    total = len(documents)
    scores: list[float] = []
    for doc in documents:
        counts = Counter(doc)
        score = 0.0
        for word in set(query):
            tf = counts.get(word, 0)
            if tf:
                idf = math.log(1 + (total - containing[word] + 0.5) / (containing[word] + 0.5))
                score += idf * tf * (_K1 + 1) / (tf + _K1 * (1 - _B + _B * len(doc) / average))
        scores.append(score)
    return scores
