"""The code we send to a kernel on a gateway: its start-up, and the pieces of a file upload.

A remote kernel cannot load our in-kernel helpers by path as a local one does (`process.py`), so
their source travels as code: `snapshot.py`, `guard.py` and `display.py` are standalone for that.
An upload is a file opened in the kernel, base64 chunks written to it, and a rename at the end.
"""

from __future__ import annotations

import base64
from pathlib import Path

from taskweaver_lite.kernel import display as kernel_display
from taskweaver_lite.kernel import plugin_runtime
from taskweaver_lite.kernel import snapshot as kernel_snapshot
from taskweaver_lite.kernel.sandbox import guard as kernel_guard

# Asked for with the start-up code: the kernel's working folder, made absolute.
HOME_EXPRESSION = "__import__('os').getcwd()"
# The expression key of each upload chunk, and the kernel-side name of the file being written.
WRITE = "write"
_UPLOAD = "_twl_upload"


def start_up(home: str, display_width: int | None, *, plugins: bool = False) -> str:
    """What a fresh remote kernel runs first: our helpers (sent as source), the plot backend, the session's folder."""
    width = {kernel_display.WIDTH_VARIABLE: str(display_width)} if display_width else {}
    runtime = (
        _module_code(plugin_runtime.MODULE_NAME, plugin_runtime.__file__) + f"_twl_s.modules[{plugin_runtime.MODULE_NAME!r}].register_shims()\n"
        if plugins
        else ""
    )
    return (
        "import os as _twl_o, sys as _twl_s, types as _twl_t\n"
        # Figures must come back as images whatever the gateway's environment prefers.
        "_twl_o.environ['MPLBACKEND'] = 'module://matplotlib_inline.backend_inline'\n"
        + _module_code(kernel_snapshot.MODULE_NAME, kernel_snapshot.__file__)
        + _module_code(kernel_guard.MODULE_NAME, kernel_guard.__file__)
        + runtime
        + _module_code("_taskweaver_display", kernel_display.__file__)
        + f"_twl_m.install({width!r})\n"
        f"_twl_s.modules[{kernel_guard.MODULE_NAME!r}].install()\n"
        f"_twl_o.makedirs({home!r}, exist_ok=True); _twl_o.chdir({home!r})\n"
        "del _twl_o, _twl_s, _twl_t, _twl_m\n"
    )


def _module_code(name: str, source_path: str) -> str:
    """Code that creates our standalone module `name` from its source, registered before it runs."""
    source = Path(source_path).read_text(encoding="utf-8")
    return (
        f"_twl_m = _twl_t.ModuleType({name!r}); _twl_s.modules[{name!r}] = _twl_m\nexec(compile({source!r}, {'<' + name + '>'!r}, 'exec'), _twl_m.__dict__)\n"
    )


def upload_open(partial: str) -> str:
    """The cell that starts an upload: `partial` opened for writing in the kernel's folder."""
    return f"{_UPLOAD} = open({partial!r}, 'wb')"


def upload_write(chunk: bytes) -> str:
    """The expression that writes one chunk (evaluated as `user_expressions`, it skips IPython's cell transforms)."""
    return f"{_UPLOAD}.write(__import__('base64').b64decode({base64.b64encode(chunk).decode('ascii')!r}))"


def upload_finish(partial: str, target: str) -> str:
    """The cell that ends an upload: the file closed and renamed to its name."""
    return f"{_UPLOAD}.close(); del {_UPLOAD}; __import__('os').replace({partial!r}, {target!r})"
