"""The sandbox's syscall filter: what a cell asks of the Linux kernel that a container runtime would refuse.

Each refusal is tried from a cell in a real sandboxed kernel (a forked child where the attack
forks first); the same kernel then runs what analysis needs: scikit-learn on joblib's process
pool, multiprocessing, threads, subprocess, a plot, an interrupt and a restart. With
`execution.syscall_filter: off` the same calls reach the kernel again. Skipped where bubblewrap
is not installed (`.ci/run` installs it).
"""

from __future__ import annotations

import errno
import json
import platform
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.sandbox import syscall_filter
from taskweaver_lite.kernel.sandbox.bwrap import SandboxPlan, bwrap_arguments, bwrap_path

pytestmark = pytest.mark.kernel

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")

# Run in a cell: each call by number through libc's syscall(), its errno name printed as JSON.
PROBE = """
import ctypes, errno, json, os
_libc = ctypes.CDLL(None, use_errno=True)
def _errno_of(number, *args):
    ctypes.set_errno(0)
    done = _libc.syscall(number, *[ctypes.c_ulong(a) for a in args])
    return "ok" if done >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def _in_child(number, *args):
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _errno_of(number, *args) == "ok" else ctypes.get_errno())
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return "ok" if code == 0 else errno.errorcode.get(code, str(code))
"""
# x86-64 syscall numbers.
UNSHARE, CLONE, KEYCTL, ADD_KEY, BPF, PERF_EVENT_OPEN, PTRACE, MOUNT, PERSONALITY, USERFAULTFD = 272, 56, 250, 248, 321, 298, 101, 165, 135, 323
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x20000
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="the probes use x86-64 syscall numbers")


def _config(**execution: object) -> ExecutionConfig:
    return ExecutionConfig(sandbox="bubblewrap", max_processes=64, memory_limit="2GB", timeout=180, **execution)


@pytest.fixture(scope="module")
def filtered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    """One sandboxed kernel under the default filter, shared by the tests that only run cells in it."""
    if bwrap_path() is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    root = tmp_path_factory.mktemp("filtered")
    with KernelExecutor(root / "sessions" / "s", config=_config(), hidden=(root,)) as executor:
        executor.wait_ready()
        assert executor.run(PROBE).success
        yield executor


def probe(executor: KernelExecutor, expression: str) -> object:
    """The JSON value a cell prints for `expression` (in the PROBE's namespace)."""
    result = executor.run(f"print(json.dumps({expression}))")
    assert result.success, result.error
    return json.loads(result.stdout.strip().splitlines()[-1])


@x86_64
@needs_bwrap
def test_a_cells_forked_child_cannot_create_a_user_namespace(filtered: KernelExecutor) -> None:
    assert probe(filtered, f"_in_child({UNSHARE}, {CLONE_NEWUSER})") == "EPERM"
    assert probe(filtered, f"_in_child({UNSHARE}, {CLONE_NEWNS})") == "EPERM"
    assert probe(filtered, f"_errno_of({CLONE}, {CLONE_NEWUSER | 17}, 0, 0, 0, 0)") == "EPERM"  # clone with the flag, SIGCHLD
    shell = filtered.run("import subprocess\nprint(subprocess.run(['unshare', '--user', 'true'], capture_output=True).returncode)")
    assert shell.success and shell.stdout.strip() != "0", "unshare(1) made a user namespace inside the sandbox"
    assert probe(filtered, f"_errno_of({UNSHARE}, 0x400)") == "ok", "unshare(CLONE_FILES) creates no namespace: it is allowed"


@x86_64
@needs_bwrap
def test_keyring_bpf_perf_and_the_rest_are_refused(filtered: KernelExecutor) -> None:
    refused = {
        "keyctl": f"_errno_of({KEYCTL}, 0, 0)",
        "add_key": f"_errno_of({ADD_KEY}, 0, 0, 0, 0, 0)",
        "bpf": f"_errno_of({BPF}, 0, 0, 0)",
        "perf_event_open": f"_errno_of({PERF_EVENT_OPEN}, 0, 0, 0, 0, 0)",
        "ptrace": f"_errno_of({PTRACE}, 16, 1, 0, 0)",  # PTRACE_ATTACH to the sandbox's pid 1
        "mount": f"_errno_of({MOUNT}, 0, 0, 0, 0, 0)",
        "userfaultfd": f"_errno_of({USERFAULTFD}, 0)",
        "personality(ADDR_NO_RANDOMIZE)": f"_errno_of({PERSONALITY}, 0x40000)",
    }
    got = {name: probe(filtered, expression) for name, expression in refused.items()}
    assert got == dict.fromkeys(refused, "EPERM")
    assert probe(filtered, f"_errno_of({PERSONALITY}, 0xFFFFFFFF)") == "ok", "the personality query Docker allows"


@x86_64
@needs_bwrap
def test_a_32_bit_system_call_gets_enosys(filtered: KernelExecutor) -> None:
    # mov eax, 20 (i386 getpid); int 0x80; ret: what a 64-bit process reaches the 32-bit table with.
    code = (
        "import mmap, ctypes\n"
        "_page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "_page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))\n"
        "_call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(_page)))\n"
        "print(_call())"
    )
    result = filtered.run(code)
    assert result.success, result.error
    assert int(result.stdout.strip()) == -errno.ENOSYS


@needs_bwrap
def test_scikit_learn_pools_threads_subprocess_and_plots_still_run_under_the_filter(filtered: KernelExecutor) -> None:
    pytest.importorskip("sklearn", reason="scikit-learn is in the test extra: pip install -e '.[test]'")
    fit = filtered.run(
        "import numpy as np\n"
        "from sklearn.ensemble import RandomForestClassifier\n"
        "from sklearn.model_selection import cross_val_score\n"
        "X = np.random.default_rng(0).random((300, 4)); y = (X[:, 0] > 0.5).astype(int)\n"
        "scores = cross_val_score(RandomForestClassifier(n_estimators=20, n_jobs=2), X, y, cv=3, n_jobs=2)\n"
        "print(len(scores), bool(scores.mean() > 0.8))"
    )
    assert fit.success, fit.error
    assert fit.stdout.split() == ["3", "True"]
    pool = filtered.run(
        "import multiprocessing, subprocess, threading\n"
        "with multiprocessing.Pool(2) as p:\n    print(sum(p.map(abs, range(-10, 0))))\n"
        "seen = []\nt = threading.Thread(target=seen.append, args=('thread',)); t.start(); t.join(); print(*seen)\n"
        "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())"
    )
    assert pool.success, pool.error
    assert pool.stdout.split() == ["55", "thread", "child"]
    plot = filtered.run("import matplotlib.pyplot as plt\nimport pandas as pd\npd.Series([1, 3, 2]).plot()\nplt.show()")
    assert plot.success and plot.artifacts and Path(plot.artifacts[0]).stat().st_size > 0


@needs_bwrap
def test_interrupts_and_restarts_under_the_filter(tmp_path: Path) -> None:
    with KernelExecutor(tmp_path / "sessions" / "s", config=_config(), hidden=(tmp_path,)) as executor:
        executor.wait_ready()
        threading.Timer(2.0, executor.interrupt).start()
        assert executor.run("import time\ntime.sleep(60)").interrupted
        assert executor.run("y = 1").success
        assert executor.restart() == ("y",)  # bubblewrap reads the filter again from its start
        assert executor.run("import ctypes\nprint(ctypes.CDLL(None, use_errno=True).syscall(250, 0, 0), ctypes.get_errno())").stdout.split() == [
            "-1",
            str(errno.EPERM),
        ]


@x86_64
@needs_bwrap
def test_the_filter_off_gives_back_the_old_behaviour_and_says_what_is_lost(tmp_path: Path) -> None:
    with KernelExecutor(tmp_path / "sessions" / "s", config=_config(syscall_filter="off"), hidden=(tmp_path,)) as executor:
        executor.wait_ready()
        first = executor.run(PROBE)
        assert first.success
        assert any("execution.syscall_filter is off" in notice and "user namespaces" in notice for notice in first.notices)
        assert probe(executor, f"_errno_of({KEYCTL}, 0, 0)") != "EPERM"  # the keyring answers (EINVAL for a bad command)
        assert probe(executor, f"_errno_of({PERSONALITY}, 0x40000)") == "ok"
        if _host_allows_user_namespaces():
            assert probe(executor, f"_in_child({UNSHARE}, {CLONE_NEWUSER})") == "ok"


def _host_allows_user_namespaces() -> bool:
    return subprocess.run(["unshare", "--user", "true"], capture_output=True, check=False).returncode == 0


@x86_64
def test_personality_allows_exactly_dockers_values() -> None:
    """The filter loaded in a child process (no sandbox needed) against personality values around the allowed ones."""
    values = [0, 8, 0x20000, 0x20008, 0xFFFFFFFF, 1, 7, 9, 0x40000, 0x20009, 0x40008, 0x0400000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFF]
    values += [1 << bit for bit in range(32)]
    script = (
        "import ctypes, json, sys\n"
        "data = sys.stdin.buffer.read()\n"
        "class Prog(ctypes.Structure):\n    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]\n"
        "buf = ctypes.create_string_buffer(data)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.prctl(38, 1, 0, 0, 0) == 0\n"  # PR_SET_NO_NEW_PRIVS
        "assert libc.prctl(22, 2, ctypes.byref(Prog(len(data) // 8, ctypes.addressof(buf))), 0, 0) == 0\n"  # PR_SET_SECCOMP, FILTER
        "allowed = []\n"
        f"for value in {values!r}:\n"
        "    if libc.syscall(135, ctypes.c_ulong(value)) >= 0:\n"
        "        allowed.append(value); libc.syscall(135, ctypes.c_ulong(0))\n"
        "print(json.dumps(sorted(set(allowed))))"
    )
    done = subprocess.run([sys.executable, "-c", script], input=syscall_filter.compiled(), capture_output=True, check=True, timeout=60)
    assert json.loads(done.stdout) == sorted(syscall_filter.ALLOWED_PERSONALITIES)


@pytest.mark.unit
def test_every_refused_call_is_known_to_libseccomp_here() -> None:
    pytest.importorskip("pyseccomp")
    assert syscall_filter.unknown_calls() == ()
    assert len(syscall_filter.compiled()) % 8 == 0  # whole BPF instructions


@pytest.mark.unit
def test_bubblewrap_gets_the_filter_last_and_disable_userns_only_with_it(tmp_path: Path) -> None:
    plan = SandboxPlan(cwd=tmp_path, socket_dir=tmp_path, hidden=(), seccomp_fd=7, disable_userns=True)
    args = bwrap_arguments(plan)
    assert args[args.index("--seccomp") + 1] == "7"
    assert "--disable-userns" in args and args[args.index("--disable-userns") - 1] == "--unshare-user"
    off = bwrap_arguments(SandboxPlan(cwd=tmp_path, socket_dir=tmp_path, hidden=()))
    assert "--seccomp" not in off and "--disable-userns" not in off


@pytest.mark.unit
def test_security_md_lists_every_call_the_filter_refuses() -> None:
    text = (Path(__file__).parent.parent / "SECURITY.md").read_text(encoding="utf-8")
    calls = [call for refusal in syscall_filter.REFUSED for call in refusal.calls if " " not in call]
    assert calls and [call for call in calls if f"`{call}`" not in text] == []
