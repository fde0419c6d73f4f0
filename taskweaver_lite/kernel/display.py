"""How wide the kernel prints: pandas' display width set from the terminal the chat runs on.

This file runs in the ipykernel process, not in ours, loaded by path at kernel start like
`snapshot.py`, so it must stay standalone. In a kernel pandas cannot see a terminal and wraps
DataFrames at 80 columns; the parent passes its width in `TASKWEAVER_DISPLAY_WIDTH`. pandas is not
imported here (that would cost every kernel half a second at start): the width is set the moment
user code imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

WIDTH_VARIABLE = "TASKWEAVER_DISPLAY_WIDTH"


def install(environ: Mapping[str, str] = os.environ) -> None:
    """Apply the width from the environment to pandas now, or when it is first imported."""
    width = environ.get(WIDTH_VARIABLE, "")
    if not width.isdigit():
        return
    if "pandas" in sys.modules:
        _apply(sys.modules["pandas"], int(width))
    else:
        sys.meta_path.insert(0, _WhenPandasLoads(int(width)))


def _apply(pandas: ModuleType, width: int) -> None:
    pandas.set_option("display.width", width)


class _WhenPandasLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps pandas' own loader so the option is set right after pandas loads."""

    def __init__(self, width: int) -> None:
        self.width = width

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pandas":
            return None
        sys.meta_path.remove(self)  # once: the real finders answer from now on
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, width = spec.loader, self.width
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            _apply(module, width)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
