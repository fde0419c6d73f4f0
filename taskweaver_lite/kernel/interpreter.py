"""The Python a local kernel runs on: this program's, an installed Jupyter kernelspec's, or an interpreter path.

`execution.kernel` points at the analyst's own environment (a conda env or a venv with ipykernel).
That interpreter is asked once per program, in a subprocess, where it lives (its prefixes and
`sys.path`) and whether it has ipykernel: the sandbox puts those folders back read-only, and a
missing ipykernel is one line naming the install command before any kernel starts.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from taskweaver_lite.errors import ConfigError

PROBE_TIMEOUT = 30.0
# Run by the interpreter itself: where it reads from, and whether ipykernel is importable there.
_PROBE = (
    "import importlib.util, json, sys; print(json.dumps({'folders': [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path], "
    "'ipykernel': importlib.util.find_spec('ipykernel') is not None, 'version': sys.version.split()[0]}))"
)


@dataclass(frozen=True)
class KernelPython:
    """An interpreter to run ipykernel on, and the folders it reads (for the sandbox to put back)."""

    executable: str
    folders: tuple[Path, ...] = ()
    version: str = ""
    source: str = ""  # how the setting named it: "", "kernelspec NAME", or the path given

    def describe(self) -> str:
        """One line for /info: the interpreter, its version, and where the setting found it."""
        if not self.source:
            return f"{self.executable} (this program's Python)"
        return f"{self.executable} (Python {self.version}, {self.source})"


def kernel_python(setting: str | None) -> KernelPython:
    """The interpreter `execution.kernel` names (None: this program's); ConfigError, in one line, if it cannot run a kernel."""
    if setting is None:
        return KernelPython(executable=sys.executable)
    path = os.path.expanduser(setting)
    if os.sep in path:
        return _probed(path, source=f"execution.kernel {setting}")
    spec_python = _kernelspec_python(setting)
    if spec_python is not None:
        return _probed(spec_python, source=f"kernelspec {setting}")
    on_path = shutil.which(path)
    if on_path is not None:
        return _probed(on_path, source=f"execution.kernel {setting}")
    raise ConfigError(
        f"execution.kernel: {setting!r} is neither an installed Jupyter kernelspec (installed: {', '.join(_kernelspec_names()) or 'none'}) "
        "nor a Python interpreter: give a kernelspec name from `jupyter kernelspec list`, or a path such as ~/miniconda3/envs/analysis/bin/python"
    )


def _kernelspec_names() -> list[str]:
    from jupyter_client.kernelspec import KernelSpecManager

    return sorted(KernelSpecManager().find_kernel_specs())


def _kernelspec_python(name: str) -> str | None:
    """The interpreter of the Python kernelspec `name` (None: no such kernelspec); ConfigError for another language's."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return None
    if spec.language.lower() != "python" or not spec.argv:
        raise ConfigError(f"execution.kernel: the kernelspec {name!r} runs {spec.language}, not Python; name a Python kernelspec or interpreter")
    first = spec.argv[0]
    return first if os.sep in first else (shutil.which(first) or first)


@functools.cache
def _probed(executable: str, *, source: str) -> KernelPython:
    """Ask the interpreter where it lives and whether it has ipykernel (once per program and interpreter)."""
    try:
        done = subprocess.run([executable, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT, cwd="/", check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{source}: {executable} cannot be run ({exc}); give the path of a Python interpreter, such as ~/venvs/analysis/bin/python") from None
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise ConfigError(f"{source}: {executable} did not answer as a Python interpreter does; give the path of one (a venv's bin/python)") from None
    if not found["ipykernel"]:
        raise ConfigError(f"{source}: {executable} has no ipykernel; install it there: {executable} -m pip install ipykernel (or conda install ipykernel)")
    folders = tuple(dict.fromkeys(Path(entry).resolve() for entry in found["folders"] if entry and Path(entry).exists()))
    return KernelPython(executable=executable, folders=folders, version=str(found["version"]), source=source)
