"""Which llama-server build the tests run, and where it is cached: .ci/llama-server.sh and the tests agree (`pytest -m unit`).

The script builds ggml with AVX2, FMA, F16C and BMI2 on a CPU that has them, and the tests find that
binary through `taskweaver_lite.testing.llama_server`. Both name its folder by a hash of the CPU's
flags, so that a cache carried to another CPU is built again instead of dying of an illegal
instruction; a CPU without those flags gets the portable build. Each case runs the script's
`--where` (it prints the path and builds nothing) on a cpuinfo file written here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from taskweaver_lite.testing.llama_server import server_path

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "llama-server.sh"
AVX2_FLAGS = "flags\t\t: fpu sse2 avx avx2 fma f16c bmi2 avx512f\n"
AVX2_CPU = f"processor\t: 0\n{AVX2_FLAGS}bugs\t\t: spectre_v1\n\nprocessor\t: 1\n{AVX2_FLAGS}"
OTHER_AVX2_CPU = AVX2_CPU.replace(" avx512f", "")
OLD_CPU = "processor\t: 0\nflags\t\t: fpu sse2 sse4_2 avx\n"


def where(cpuinfo: Path, monkeypatch: pytest.MonkeyPatch, build: str = "") -> tuple[Path, Path]:
    """The script's `--where` and the tests' path for the CPU `cpuinfo` describes (LLAMA_SERVER_BUILD=`build` where given)."""
    monkeypatch.setenv("LLAMA_SERVER_CPUINFO", str(cpuinfo))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cpuinfo.parent / "cache"))
    if build:
        monkeypatch.setenv("LLAMA_SERVER_BUILD", build)
    else:
        monkeypatch.delenv("LLAMA_SERVER_BUILD", raising=False)
    printed = subprocess.run(["bash", str(SCRIPT), "--where"], capture_output=True, text=True, check=True, env=os.environ.copy()).stdout.strip()
    return Path(printed), server_path()


def cpu(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_script_and_the_tests_name_the_same_binary_for_each_cpu_and_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for text in (AVX2_CPU, OTHER_AVX2_CPU, OLD_CPU):
        for build in ("", "avx2", "portable"):
            script, tests = where(cpu(tmp_path, "cpuinfo", text), monkeypatch, build)
            assert script == tests, f"for build {build or 'default'}: the script builds {script}, the tests look at {tests}"


def test_a_cache_carried_to_another_cpu_is_not_found_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here, _ = where(cpu(tmp_path, "here", AVX2_CPU), monkeypatch)
    there, _ = where(cpu(tmp_path, "there", OTHER_AVX2_CPU), monkeypatch)
    assert here.parent.name.startswith("avx2-") and there.parent.name.startswith("avx2-")
    assert here != there, "two CPUs with different flags share one AVX2 build"


def test_a_cpu_without_avx2_gets_the_portable_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old, _ = where(cpu(tmp_path, "old", OLD_CPU), monkeypatch)
    portable, _ = where(cpu(tmp_path, "new", AVX2_CPU), monkeypatch, "portable")
    assert old == portable and old.parent.name == "portable-O1"
