"""Code verification: a static check of a cell's syntax tree before it runs (`code_interpreter.code_verification_on`).

The check refuses by what code can reach, not by how it is spelled: imports outside
`allowed_modules`; a risky module (files, processes, network, code) reached any other way, as an
attribute of an allowed module (`pd.io.common.os`), a private alias (`random._os`) or imported out
of any package (`from matplotlib import subprocess`); every use of a name in `blocked_functions`
(called, aliased or reached as an attribute); functions that import or look up a name they are
given (`import_optional_dependency`, `getattr`) unless called directly with the name written out;
strings run as code (`eval`, `exec`, `compile`, `DataFrame.query`) unless written out; shell and
magic lines; and the attribute paths that escape to the interpreter's internals (`__subclasses__`,
frames, globals). A refused cell does not run: the CodeGenerator gets each rule broken, with its
line, and revises.

It is a guard against a model's mistakes and clumsy attacks, not the boundary: file paths given to
allowed libraries (`pd.read_csv("/etc/shadow")`), unsafe deserialisers of allowed libraries
(`pd.read_pickle`) and objects that lead elsewhere without a risky name on the way are out of its
reach. The sandbox (`execution.sandbox`) is what holds against those; SECURITY.md says which layer
stops what.
"""

from __future__ import annotations

import ast
import dis
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import CodeType

from taskweaver_lite.config.settings import DEFAULT_ALLOWED_MODULES, DEFAULT_BLOCKED_FUNCTIONS

# Attributes that lead from any object to the interpreter's internals: classes and their subclasses,
# function globals and code, frames, the builtins.
ESCAPE_ATTRIBUTES = frozenset(
    {
        "__class__", "__bases__", "__base__", "__mro__", "__subclasses__", "__globals__", "__builtins__", "__code__",
        "__closure__", "__func__", "__self__", "__dict__", "__getattribute__", "__import__", "__loader__", "__spec__",
        "__reduce__", "__reduce_ex__", "__init_subclass__", "__traceback__", "__wrapped__", "mro",
        "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "tb_frame", "tb_next", "gi_frame", "gi_code",
        "cr_frame", "cr_code", "ag_frame", "ag_code", "co_code", "_getframe",
    }
)  # fmt: skip
# Names that are the interpreter's internals themselves.
ESCAPE_NAMES = frozenset({"__builtins__", "__loader__", "__spec__", "get_ipython"})
# Modules that reach files, processes, the network or code, wherever they are found: an attribute of
# an allowed module (`pd.io.common.os`), under a private alias (`random._os`, `collections._sys`), or
# imported out of any package (`from matplotlib import subprocess`). Refused unless allowed by name.
RISKY_MODULES = frozenset(
    {
        "os", "sys", "subprocess", "shutil", "ctypes", "builtins", "importlib", "socket", "pty", "posix", "nt", "signal",
        "multiprocessing", "pickle", "marshal", "tarfile", "zipfile", "tempfile", "pathlib", "glob", "fcntl", "mmap", "runpy",
        "codeop", "inspect", "gc", "asyncio", "http", "urllib", "ftplib", "smtplib", "webbrowser", "sqlite3", "shelve", "dbm",
        "posixpath", "ntpath", "genericpath", "resource", "sysconfig", "site", "zipimport", "pkgutil", "linecache",
        "_posixsubprocess", "_thread", "threading", "faulthandler", "pwd", "grp", "termios", "copyreg", "selectors", "ssl",
    }
)  # fmt: skip
# Calls that import the module named by their first argument; any other use of them (renamed, passed) is refused.
IMPORT_CALLS = frozenset(
    {"__import__", "import_module", "load_module", "load_source", "run_module", "run_path", "spec_from_file_location", "import_optional_dependency"}
)
# Calls whose second argument names an attribute: the name must be written out, never computed.
ATTRIBUTE_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr", "attrgetter", "methodcaller"})
# Calls that run a string as code: its text must be written out (and is then checked as code), never built.
EVALUATING_CALLS = frozenset({"eval", "exec", "compile", "execfile", "query", "run_cell", "run_line_magic", "run_cell_magic"})

_ALWAYS_WATCHED = ESCAPE_ATTRIBUTES | ESCAPE_NAMES | RISKY_MODULES | IMPORT_CALLS | ATTRIBUTE_CALLS | EVALUATING_CALLS
MAX_REPORTED = 8
# Strings up to this long that look like code (a call or an attribute) are checked as code, nested this deep.
MAX_CODE_STRING = 2_000
MAX_STRING_DEPTH = 2
_CODE_LIKE = re.compile(r"[\w)\]]\s*[.(]|@|__")
_WORD = re.compile(r"[A-Za-z_]\w*")
_SHELL_LINE = re.compile(r"^\s*(?:[\w.\[\]'\", ]+=\s*)?(?:!|%)|\?\s*$")


@dataclass(frozen=True)
class Violation:
    """One rule a cell breaks, where it breaks it."""

    line: int
    rule: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule}"


@dataclass(frozen=True)
class CodeVerifier:
    """The verification rules of a project: which modules code may import, which names it may not use.

    `allowed_modules` None means any module; an empty tuple means no imports at all.
    """

    allowed_modules: tuple[str, ...] | None = DEFAULT_ALLOWED_MODULES
    blocked_functions: tuple[str, ...] = DEFAULT_BLOCKED_FUNCTIONS

    def check(self, code: str) -> list[Violation]:
        """Every rule `code` breaks, in line order (at most `MAX_REPORTED`); empty when it may run.

        First the compiled cell's names, strings and imports are matched against the rules (fast:
        no syntax tree is built); only a cell with something suspect is walked node by node, which
        finds each violation with its line.
        """
        try:
            compiled = compile(code, "<cell>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            # IPython syntax (`!ls`, `%system`) is a syntax error to Python; any other syntax error
            # breaks no rule, and the kernel reports it like any other error.
            return _shell_lines(code)
        if not self._suspect(compiled):
            return []
        found = sorted(set(self._walk(ast.parse(code))), key=lambda v: (v.line, v.rule))
        return found[:MAX_REPORTED]

    def _suspect(self, compiled: CodeType) -> bool:
        """Whether the compiled cell uses a name, a string or an import that some rule is about."""
        names, strings, imports = _contents(compiled)
        watched = self._watched()
        if names & watched or any(text in watched or "__" in text for text in strings):
            return True
        if any(name.startswith("_") and name.lstrip("_") in RISKY_MODULES for name in names):
            return True  # a private alias of a risky module (`random._os`)
        if any(_CODE_LIKE.search(text) and watched.intersection(_WORD.findall(text)) for text in strings if len(text) <= MAX_CODE_STRING):
            return True  # a string that reads as code naming something watched
        return self.allowed_modules is not None and not all(self._allowed(module) for module in imports)

    def _watched(self) -> frozenset[str]:
        return frozenset(self.blocked_functions) | _ALWAYS_WATCHED

    def _walk(self, tree: ast.AST, *, at: int | None = None, depth: int = 0) -> Iterator[Violation]:
        blocked = set(self.blocked_functions)
        called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        for node in ast.walk(tree):
            line = at if at is not None else getattr(node, "lineno", 0)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and depth < MAX_STRING_DEPTH:
                # Strings that read as code are checked as code: annotations that typing evaluates,
                # expressions pandas evaluates (`df.query("@pd.io.common.os.system(...)", engine="python")`).
                yield from self._walk_string(node.value, line, depth)
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield from self._module(alias.name, line)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    yield from self._relative(line)
                else:
                    yield from self._module(node.module or "", line)
                for alias in node.names:
                    if alias.name in blocked:
                        yield Violation(line, f"`{alias.name}` is a blocked function")
                    elif self._risky(alias.name):
                        module = alias.name.lstrip("_")
                        yield Violation(line, f"`from {node.module or '.'} import {alias.name}` imports the module `{module}`, which may not be imported")
                    elif alias.name in IMPORT_CALLS and self.allowed_modules is not None:
                        yield Violation(line, f"`{alias.name}` imports modules by name; import them directly")
            elif isinstance(node, ast.Name):
                if node.id in blocked:
                    yield Violation(line, f"`{node.id}` is a blocked function (called, passed or renamed alike)")
                elif node.id in ESCAPE_NAMES:
                    yield Violation(line, f"`{node.id}` reaches the interpreter's internals")
                elif id(node) not in called:
                    yield from self._passed(node.id, line)
            elif isinstance(node, ast.Attribute):
                yield from self._attribute(node.attr, line, blocked)
                if id(node) not in called:
                    yield from self._passed(node.attr, line)
            elif isinstance(node, ast.Call):
                yield from self._call(node, line, blocked)
            elif isinstance(node, ast.Subscript):
                key = _constant_text(node.slice)
                if key is not None and (key in blocked or key in ESCAPE_ATTRIBUTES or key in ESCAPE_NAMES):
                    yield Violation(line, f"looking up {key!r} by name reaches what the rules refuse")

    def _walk_string(self, text: str, line: int, depth: int) -> Iterator[Violation]:
        if len(text) > MAX_CODE_STRING or not _CODE_LIKE.search(text):
            return
        try:
            parsed = ast.parse(text.replace("@", " ").strip(), mode="eval")
        except (SyntaxError, ValueError):
            return
        yield from self._walk(parsed, at=line, depth=depth + 1)

    def _attribute(self, name: str, line: int, blocked: set[str]) -> Iterator[Violation]:
        if name in blocked:
            yield Violation(line, f"`.{name}` is a blocked function")
        elif name in ESCAPE_ATTRIBUTES:
            yield Violation(line, f"`.{name}` reaches the interpreter's internals")
        elif self._risky(name):
            yield Violation(line, f"`.{name}` reaches the module `{name.lstrip('_')}`, which may not be imported")

    def _risky(self, name: str) -> bool:
        """Whether `name` (or the module it is a private alias of: `_os`) is a risky module not allowed by name."""
        module = name.lstrip("_") if name.startswith("_") else name
        return module in RISKY_MODULES and not self._allowed(module)

    def _passed(self, name: str, line: int) -> Iterator[Violation]:
        """A function whose effect depends on a name it is given, used other than by a direct call (renamed, passed)."""
        if name in ATTRIBUTE_CALLS and name != "hasattr":
            yield Violation(line, f"`{name}` used other than in a direct call: what it looks up cannot be checked")
        elif name in IMPORT_CALLS and self.allowed_modules is not None:
            yield Violation(line, f"`{name}` used other than in a direct call: what it imports cannot be checked")

    def _call(self, node: ast.Call, line: int, blocked: set[str]) -> Iterator[Violation]:
        called = _called_name(node.func)
        if called in IMPORT_CALLS and self.allowed_modules is not None:
            module = _constant_text(node.args[0]) if node.args else None
            if module is None:
                yield Violation(line, f"`{called}(...)` imports a module whose name is computed; import it by name")
            else:
                yield from self._module(module, line)
        elif called in ATTRIBUTE_CALLS:
            for arg in node.args[1:2] if called in ("getattr", "setattr", "delattr", "hasattr") else node.args[:1]:
                text = _constant_text(arg)
                if text is not None and (text in blocked or text in ESCAPE_ATTRIBUTES or self._risky(text)):
                    yield Violation(line, f"`{called}(..., {text!r})` reaches what the rules refuse")
                elif text is None and called != "hasattr":
                    yield Violation(line, f"`{called}` with an attribute name computed at run time cannot be checked; write the attribute out")
        elif called in EVALUATING_CALLS and node.args and _constant_text(node.args[0]) is None:
            yield Violation(line, f"`{called}(...)` runs a string built at run time, which cannot be checked; write the expression out")
        elif called in ("format", "format_map") and isinstance(node.func, ast.Attribute):
            template = _constant_text(node.func.value)
            if template is not None and any(f".{attr}" in template for attr in ESCAPE_ATTRIBUTES):
                yield Violation(line, "a format string that reads the interpreter's internals")

    def _module(self, name: str, line: int) -> Iterator[Violation]:
        if self.allowed_modules is None or not name:
            return
        if not self._allowed(name):
            allowed = ", ".join(self.allowed_modules) or "none"
            yield Violation(line, f"importing `{name}` is not allowed (allowed modules: {allowed})")

    def _relative(self, line: int) -> Iterator[Violation]:
        if self.allowed_modules is not None:
            yield Violation(line, "relative imports are not allowed")

    def _allowed(self, name: str) -> bool:
        if self.allowed_modules is None:
            return True
        root = name.split(".", 1)[0]
        return root in self.allowed_modules or name in self.allowed_modules


def verifier_from(allowed_modules: Sequence[str] | None, blocked_functions: Sequence[str]) -> CodeVerifier:
    """A verifier for the configured lists (see `CodeInterpreterConfig`)."""
    return CodeVerifier(tuple(allowed_modules) if allowed_modules is not None else None, tuple(blocked_functions))


def refusal_text(violations: Sequence[Violation]) -> str:
    """What the CodeGenerator reads about a refused cell: every rule broken, with its line."""
    return "The code breaks the verification rules and was not run: " + "; ".join(str(v) for v in violations) + "."


def _shell_lines(code: str) -> list[Violation]:
    """Shell commands (`!ls`), magics (`%system`, `%%bash`) and help lines (`x?`): IPython syntax, not Python."""
    found = []
    for number, text in enumerate(code.splitlines(), start=1):
        if _SHELL_LINE.search(text):
            try:
                ast.parse(text.strip())
            except SyntaxError:
                found.append(Violation(number, "shell commands and magics (`!`, `%`, `?`) are not allowed"))
    return found[:MAX_REPORTED]


_IMPORT_NAME = dis.opmap["IMPORT_NAME"]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]


def _contents(code: CodeType) -> tuple[set[str], set[str], set[str]]:
    """Every name (globals, attributes, imports), string constant and imported module in `code` and the code inside it."""
    names: set[str] = set()
    strings: set[str] = set()
    imports: set[str] = set()
    pending = [code]
    while pending:
        current = pending.pop()
        names.update(current.co_names)
        raw, extended = current.co_code, 0
        for i in range(0, len(raw), 2):
            op, arg = raw[i], raw[i + 1] | extended
            extended = arg << 8 if op == _EXTENDED_ARG else 0
            if op == _IMPORT_NAME:
                imports.add(current.co_names[arg])
        for const in current.co_consts:
            if isinstance(const, CodeType):
                pending.append(const)
            elif isinstance(const, str):
                strings.add(const)
            elif isinstance(const, tuple):
                strings.update(item for item in const if isinstance(item, str))
    return names, strings, imports


def _called_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _constant_text(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
