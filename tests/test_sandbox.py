"""The kernel's sandbox: what a hostile cell tries inside bubblewrap fails, and the session goes on.

Each attack is a cell in a real sandboxed kernel; the test checks the host afterwards
(the file is still there, nothing was written, the socket saw no connection). Skipped where
bubblewrap is not installed (`.ci/run` installs it).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.sandbox.bwrap import bwrap_path, uses_sandbox
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")

SECRET = "s3cr3t-value-that-must-not-leak"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with a store and a config, and a home folder holding a private key."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TWL_TEST_API_KEY", SECRET)  # secret-looking: never passed to the kernel
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "sessions.db").write_text(SECRET)
    (folder / "taskweaver_config.yaml").write_text(f"llm:\n  api_key: {SECRET}\n")
    return folder


@pytest.fixture
def sandboxed(project: Path) -> Iterator[KernelExecutor]:
    config = ExecutionConfig(sandbox="bubblewrap", max_processes=48, memory_limit="1GB", timeout=30)
    with KernelExecutor(project / "sessions" / "s1", config=config, hidden=(project,)) as executor:
        executor.wait_ready()
        yield executor


def denied(executor: KernelExecutor, code: str) -> str:
    """Run `code`, which must fail; the error's name and message."""
    result = executor.run(code)
    assert not result.success, f"the sandbox let this through: {code!r} printed {result.stdout!r}"
    assert result.error is not None
    return f"{result.error.name}: {result.error.value}"


@needs_bwrap
def test_the_store_config_and_home_are_invisible_and_the_project_cannot_be_written(sandboxed: KernelExecutor, project: Path) -> None:
    denied(sandboxed, f"print(open({str(project / 'sessions.db')!r}).read())")
    denied(sandboxed, f"print(open({str(project / 'taskweaver_config.yaml')!r}).read())")
    denied(sandboxed, f"open({str(project / 'pwned.txt')!r}, 'w').write('x')")
    denied(sandboxed, f"import os\nos.remove({str(project / 'sessions.db')!r})")
    denied(sandboxed, f"print(open({str(Path(os.environ['HOME']) / '.ssh' / 'id_rsa')!r}).read())")
    assert (project / "sessions.db").read_text() == SECRET and not (project / "pwned.txt").exists()
    assert sandboxed.run("open('mine.txt', 'w').write('ok')").success, "the working folder must stay writable"
    assert (sandboxed.working_dir / "mine.txt").read_text() == "ok"


@needs_bwrap
def test_the_programs_process_and_secrets_are_out_of_reach(sandboxed: KernelExecutor) -> None:
    scan = (
        "import glob\nfound = []\n"
        "for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n        found.append(open(path, 'rb').read())\n    except OSError:\n        pass\n"
        f"print(any({SECRET.encode()!r} in blob for blob in found), len(found))"
    )
    result = sandboxed.run(scan)
    assert result.success and result.stdout.startswith("False"), "a secret of the program was readable from the sandbox's /proc"
    denied(sandboxed, f"open('/proc/{os.getpid()}/environ', 'rb').read()")


@needs_bwrap
def test_no_network_not_even_a_port_on_this_machines_loopback(sandboxed: KernelExecutor) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        error = denied(sandboxed, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)")
        assert "refused" in error.lower() or "unreachable" in error.lower()
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


@needs_bwrap
def test_forking_many_processes_hits_the_cap_and_the_session_goes_on(sandboxed: KernelExecutor) -> None:
    code = (
        "import os, time\nchildren, refused = [], None\n"
        "for _ in range(400):\n"
        "    try:\n        pid = os.fork()\n    except OSError as exc:\n        refused = exc\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    children.append(pid)\n"
        "for pid in children:\n    os.kill(pid, 9)\n    os.waitpid(pid, 0)\n"
        "print(len(children), type(refused).__name__)"
    )
    result = sandboxed.run(code)
    started, error = result.stdout.split()
    # The cap is 48 on top of what the kernel's user ran at its start (other tests' sandboxes, still ending,
    # may have counted then): far below the 400 the cell tried.
    assert error == "BlockingIOError" and int(started) < 120, f"the process cap did not hold: {result.stdout}"
    assert sandboxed.run("x = 1\nprint(x)").stdout.strip() == "1"


@needs_bwrap
def test_tmp_is_capped_run_is_empty_and_automagic_is_off(sandboxed: KernelExecutor) -> None:
    # /tmp and /dev/shm are capped at the memory limit; in the kernel's cgroup their pages count against it too.
    filled = sandboxed.run("with open('/tmp/fill', 'wb') as f:\n    for _ in range(1500):\n        f.write(b'x' * 2**20)")
    assert not filled.success, "1.5 GB in a /tmp of 1 GB"
    said = f"{filled.error.name}: {filled.error.value}" if filled.error is not None else " ".join(filled.notices)
    assert "No space left" in said or (filled.kernel_died and "execution.memory_limit" in said), filled
    emptied = sandboxed.run("import os\nif os.path.exists('/tmp/fill'):\n    os.remove('/tmp/fill')\nprint(os.listdir('/run'))")
    assert emptied.stdout.strip() == "[]", "/run's sockets lead out"
    assert not sandboxed.run("ls = None\ndel ls\nls -la").success, "a bare `ls -la` must not run the shell (automagic)"


@needs_bwrap
def test_a_cell_over_the_memory_limit_fails_and_the_kernel_keeps_its_variables(sandboxed: KernelExecutor) -> None:
    assert sandboxed.run("kept = 42").success
    error = denied(sandboxed, "hog = bytearray(2 * 1024**3)")
    assert "MemoryError" in error
    assert sandboxed.run("print(kept)").stdout.strip() == "42"


@needs_bwrap
def test_a_detached_child_ends_with_the_sandbox(project: Path) -> None:
    marker = f"{time.time() % 1000:.3f}"
    config = ExecutionConfig(sandbox="bubblewrap")
    with KernelExecutor(project / "sessions" / "s2", config=config, hidden=(project,)) as executor:
        assert executor.run(f"import subprocess\nsubprocess.Popen(['sleep', '{marker}9'], start_new_session=True)\nprint('started')").success
    assert not _running(f"sleep {marker}9"), "a setsid child outlived the sandbox"


def test_without_the_sandbox_a_detached_child_ends_with_the_kernel(project: Path) -> None:
    marker = f"{time.time() % 1000:.3f}"
    with KernelExecutor(project / "sessions" / "s3", config=ExecutionConfig(sandbox="none")) as executor:
        assert executor.run(f"import subprocess\nsubprocess.Popen(['sleep', '{marker}8'], start_new_session=True)\nprint('started')").success
        assert _running(f"sleep {marker}8")
    assert not _running(f"sleep {marker}8"), "a setsid child outlived the kernel"


@needs_bwrap
def test_interrupts_restarts_and_plots_work_inside(sandboxed: KernelExecutor) -> None:
    threading.Timer(1.0, sandboxed.interrupt).start()
    assert sandboxed.run("import time\ntime.sleep(20)").interrupted
    plot = sandboxed.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert plot.success and plot.artifacts and Path(plot.artifacts[0]).stat().st_size > 0
    assert sandboxed.run("y = 5").success
    assert sandboxed.restart() == ("y",)
    assert sandboxed.run("print('fresh')").stdout.strip() == "fresh"


def test_bubblewrap_asked_for_but_missing_is_an_error_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="bubblewrap"):
        uses_sandbox(ExecutionConfig(sandbox="bubblewrap"))
    assert uses_sandbox(ExecutionConfig(sandbox="auto")) is False


def test_auto_runs_without_a_bwrap_that_cannot_build_a_sandbox_here_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Some containers forbid the namespaces bwrap needs: every kernel start would fail with `auto`.
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert uses_sandbox(ExecutionConfig(sandbox="auto")) is False
    assert uses_sandbox(ExecutionConfig(sandbox="bubblewrap")) is True, "asked for by name, its failure is the kernel start's error"
    with KernelExecutor(tmp_path / "sessions" / "s1", config=ExecutionConfig(sandbox="auto", timeout=30)) as executor:
        first, second = executor.run("x = 1"), executor.run("y = 2")
    assert first.success and any("without the sandbox" in n and "No permissions to create new namespace" in n for n in first.notices)
    assert not any("sandbox" in n for n in second.notices), "said once"


@needs_bwrap
def test_a_sessions_hostile_cell_fails_and_the_session_goes_on(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        folder = make_project(tmp_path / "p2", server.url, execution={"sandbox": "bubblewrap"})
        store = folder / "sessions.db"
        server.enqueue("planner", planner_reply("Read the store."), planner_reply("I could not.", send_to="User"))
        server.enqueue("code_generator", *[code_reply(f"import os\nos.remove({str(store)!r})") for _ in range(4)])
        server.enqueue("planner", planner_reply("Compute 6 * 7."), planner_reply("42.", send_to="User"))
        server.enqueue("code_generator", code_reply("print(6 * 7)"))
        with open_session(load_config(folder)) as session:
            first = session.ask("Delete the store.")
            second = session.ask("What is six times seven?")
    assert first.state == "finished" and second.state == "finished"
    assert store.exists(), "the sandboxed kernel deleted the session store"
    report = [r.messages for r in server.requests if r.role == "planner"][1][-1]["content"]
    assert "FileNotFoundError" in report or "Read-only" in report


def _running(command_line: str) -> bool:
    """Whether a process of this machine runs exactly `command_line` (after a moment to settle)."""
    time.sleep(0.3)
    wanted = command_line.replace(" ", "\0").encode() + b"\0"
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if (entry / "cmdline").read_bytes() == wanted:
                return True
        except OSError:
            continue
    return False
