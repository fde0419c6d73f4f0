"""The variable snapshot as taken inside the kernel: what each user variable is, in a few words.

This file runs in the ipykernel process, not in ours. `process.py` loads it by path at kernel start
(as the module `_taskweaver_snapshot`, so `%reset` cannot remove it) and asks for `snapshot()` in
the `user_expressions` of every execute request, which keeps the snapshot inside the cell's own
round trip. It must stay standalone (no taskweaver_lite imports, which would pull in the whole
agent) and cheap: only O(1) facts are read (shape, dtypes, len), never the data itself.
"""

from __future__ import annotations

import datetime
import decimal
import fractions
import inspect
import itertools
import json
import sys
import types
from typing import Any

MODULE_NAME = "_taskweaver_snapshot"
# Wide frames would otherwise put thousands of column names into every prompt.
MAX_COLUMNS = 20
MAX_VALUE_CHARS = 80
MAX_INLINE_ITEMS = 8

_SCALARS = (bool, int, float, complex, decimal.Decimal, fractions.Fraction, type(None))
_TIMES = (datetime.date, datetime.time, datetime.timedelta)
_CONTAINERS = (list, tuple, dict, set, frozenset)


class _Json:
    """A value whose repr is its JSON text, so the kernel's text/plain formatting is the payload."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def snapshot() -> _Json:
    """Describe every user variable as JSON rows `[name, type, description, identity]`."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return _Json("[]")
    hidden = shell.user_ns_hidden
    rows: list[list[str]] = []
    for name, value in list(shell.user_ns.items()):
        if name.startswith("_") or (name in hidden and hidden[name] is value) or _is_plumbing(value):
            continue
        try:
            rows.append([name, _type_name(value), _describe(value), str(id(value))])
        except Exception as exc:  # noqa: BLE001 - a broken __len__ or property must not hide the other variables
            rows.append([name, _type_name(value), f"(not describable: {type(exc).__name__})", str(id(value))])
    return _Json(json.dumps(rows))


def _is_plumbing(value: Any) -> bool:
    """Modules, imported functions and classes, and typing constructs are not the user's data."""
    if isinstance(value, types.ModuleType):
        return True
    if inspect.isroutine(value) or isinstance(value, type):
        return getattr(value, "__module__", None) != "__main__"
    return type(value).__module__ == "typing"


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    if module in ("builtins", "__main__"):
        return kind.__qualname__
    return f"{module.split('.')[0]}.{kind.__qualname__}"


def _describe(value: Any) -> str:
    pandas = sys.modules.get("pandas")
    numpy = sys.modules.get("numpy")
    if pandas is not None and isinstance(value, pandas.DataFrame):
        return _describe_frame(value)
    if pandas is not None and isinstance(value, pandas.Series):
        named = f", name {value.name!r}" if value.name is not None else ""
        return f"length {len(value)}, dtype {value.dtype}{named}"
    if numpy is not None and isinstance(value, numpy.ndarray):
        return f"shape {value.shape}, dtype {value.dtype}"
    if numpy is not None and isinstance(value, numpy.generic):
        return _short(repr(value.item()))
    if isinstance(value, (str, bytes)):
        shown = _short(repr(value))
        return shown if len(value) <= MAX_VALUE_CHARS else f"{shown} (length {len(value)})"
    if isinstance(value, _SCALARS + _TIMES):
        return _short(repr(value))
    if isinstance(value, _CONTAINERS):
        return _describe_container(value)
    if inspect.isroutine(value):
        return f"function {value.__name__}{_signature(value)}"
    if isinstance(value, type):
        return f"class {value.__name__}"
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        return f"shape {shape}"
    return f"{type(value).__qualname__} object"


def _describe_frame(frame: Any) -> str:
    count = frame.shape[1]
    shown = ", ".join(f"{col} {dtype}" for col, dtype in itertools.islice(frame.dtypes.items(), MAX_COLUMNS))
    more = f", ... ({count - MAX_COLUMNS} more)" if count > MAX_COLUMNS else ""
    return f"shape {frame.shape}; columns: {shown}{more}"


def _describe_container(value: Any) -> str:
    size = f"length {len(value)}"
    # Short collections of plain values are worth showing (a list of column names, a few labels);
    # anything else could be arbitrarily expensive to repr.
    plain = (str, bool, int, float, type(None))
    if 0 < len(value) <= MAX_INLINE_ITEMS and not isinstance(value, dict) and all(isinstance(v, plain) for v in value):
        return f"{size}: {_short(repr(value))}"
    return size


def _signature(func: Any) -> str:
    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        return "(...)"


def _short(text: str) -> str:
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."
