"""The Jupyter executor against a real ipykernel: outputs, bounds, timeouts, death, secrets, orphans."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Literal

import psutil
import pytest
from helpers import outliving

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import KernelError
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.sandbox.bwrap import bwrap_path
from taskweaver_lite.records.execution import CellCancelled, ExecutionResult

pytestmark = pytest.mark.kernel

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def process_gone(pid: int, *, within: float = 5.0) -> bool:
    """True once `pid` has exited (a zombie waiting for its reaper counts as exited)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            process = psutil.Process(pid)
            # A multithreaded process's main thread turns zombie before its other threads end, and
            # its parent cannot reap it (nor see it dead) until they have: wait for the last one.
            if process.status() == psutil.STATUS_ZOMBIE and process.num_threads() <= 1:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def by_name(result: ExecutionResult) -> dict[str, str]:
    return {v.name: v.description for v in result.variables}


def test_cell_returns_stdout_stderr_last_value_with_html_and_displays(kernel_executor: KernelExecutor) -> None:
    result = kernel_executor.run(
        "import sys, pandas as pd\nfrom IPython.display import display\n"
        "print('to stdout')\nprint('to stderr', file=sys.stderr)\ndisplay('shown')\n"
        "pd.DataFrame({'a': [1, 2]})"
    )
    assert result.success and result.error is None
    assert result.stdout == "to stdout\n"
    assert result.stderr == "to stderr\n"
    assert result.displays == ("'shown'",)
    assert result.result == "   a\n0  1\n1  2"
    assert result.result_html is not None and "<table" in result.result_html
    assert result.execution_count is not None and result.elapsed > 0
    assert result.full_output_path is None


def test_plot_shown_with_plt_show_becomes_png_artifact(kernel_executor: KernelExecutor) -> None:
    result = kernel_executor.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()")
    assert result.success, result.prompt_text()
    assert len(result.artifacts) == 1
    artifact = Path(result.artifacts[0])
    assert artifact.is_absolute() and artifact.parent == kernel_executor.artifacts_dir
    assert artifact.suffix == ".png" and artifact.read_bytes().startswith(PNG_MAGIC)
    assert result.displays == ()  # the figure's "<Figure size ...>" text is not worth prompt space


def test_error_gives_name_value_and_traceback_without_ansi_codes(kernel_executor: KernelExecutor) -> None:
    result = kernel_executor.run("def explode():\n    raise ValueError('bad input')\nexplode()")
    assert not result.success and result.error is not None
    assert (result.error.name, result.error.value) == ("ValueError", "bad input")
    assert "explode()" in result.error.traceback and "ValueError: bad input" in result.error.traceback
    assert "\x1b" not in result.error.traceback
    assert "explode" in by_name(result)  # the snapshot is current even after an error


def test_ten_megabyte_print_is_cut_with_marker_and_saved_in_full(kernel_executor: KernelExecutor) -> None:
    from taskweaver_lite.llm.tokens import get_tokenizer

    result = kernel_executor.run("print('HEAD' + 'x' * 10_000_000 + 'TAIL')")
    assert result.success
    assert result.stdout.startswith("HEAD") and result.stdout.rstrip().endswith("TAIL")
    assert get_tokenizer().count(result.stdout) <= kernel_executor.output_tokens
    assert "tokens left out here" in result.stdout
    assert result.full_output_path is not None and f"(Full output saved to {result.full_output_path})" in result.prompt_text()
    saved = Path(result.full_output_path).read_text(encoding="utf-8")
    assert saved == "HEAD" + "x" * 10_000_000 + "TAIL\n"


def test_endless_loop_times_out_and_next_cell_sees_earlier_variables(kernel_executor: KernelExecutor) -> None:
    kernel_executor.run("kept = 41")
    result = kernel_executor.run("while True:\n    pass", timeout=1)
    assert result.timed_out and not result.kernel_died and not result.success
    assert 1 <= result.elapsed < 4
    assert "timed out" in result.prompt_text()
    assert kernel_executor.run("kept + 1").result == "42"


def test_killed_kernel_is_reported_with_lost_variables_and_next_cell_runs(kernel_executor: KernelExecutor) -> None:
    kernel_executor.run("doomed = [1, 2, 3]\nalso_doomed = 'x'")
    old_pid = kernel_executor.pid
    result = kernel_executor.run("import os\nos._exit(1)", timeout=60)
    assert result.kernel_died and not result.success
    assert {"doomed", "also_doomed"} <= set(result.lost_variables)
    assert "doomed" in result.changes.deleted and result.variables == ()
    assert result.elapsed < 3  # noticed by polling the process, not at the 60 s timeout
    assert kernel_executor.pid != old_pid
    after = kernel_executor.run("doomed")
    assert after.error is not None and after.error.name == "NameError"
    assert kernel_executor.run("1 + 1").result == "2"


def test_kernel_killed_between_cells_starts_afresh_and_reports_what_was_lost(kernel_executor: KernelExecutor) -> None:
    kernel_executor.run("x = 5")
    pid = kernel_executor.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # as the OOM killer would, while no cell runs
    assert process_gone(pid)
    result = kernel_executor.run("x = 5")
    assert result.success and result.kernel_died
    assert "x" in result.lost_variables
    assert "kernel died before this cell" in result.outcome() and f"Variables lost: {', '.join(result.lost_variables)}." in result.outcome()
    # A new kernel has no `x` to change: the one this cell made is new.
    assert "x" in result.changes.created and "x" not in result.changes.changed
    assert by_name(result)["x"] == "5" and kernel_executor.pid not in (None, pid)


def test_a_kernel_with_no_variables_killed_between_cells_is_still_named_on_the_next_cell(tmp_path: Path) -> None:
    with KernelExecutor(tmp_path / "sessions" / "s", config=ExecutionConfig(timeout=60)) as executor:  # its own: it must hold no variables
        executor.run("print('nothing kept')")
        assert executor.variables() == (), "precondition: the kernel holds no variables"
        pid = executor.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert process_gone(pid)
        result = executor.run("1 + 1")
    assert result.success and result.kernel_died, "a kernel that died holding no variables went unreported"
    assert result.lost_variables == () and "kernel died before this cell" in result.outcome() and "Variables lost: none." in result.outcome()


def test_a_cancelled_cell_whose_kernel_dies_of_the_interrupt_says_what_was_lost(tmp_path: Path) -> None:
    with KernelExecutor(tmp_path / "sessions" / "s", config=ExecutionConfig(timeout=60)) as executor:
        executor.run("kept = 3")
        timer = threading.Timer(0.3, _thread.interrupt_main)

        def on_output(stream: str, text: str) -> None:
            if "deaf" in text and not timer.is_alive():
                timer.start()

        deaf = "import os, signal, time\nsignal.signal(signal.SIGINT, lambda *_: os._exit(1))\nprint('deaf', flush=True)\ntime.sleep(60)"
        with pytest.raises(CellCancelled) as cancelled:
            executor.run(deaf, on_output=on_output)
        timer.join()
        result = cancelled.value.result
        assert result.cancelled and result.kernel_died, "the kernel died of the Ctrl-C and was replaced, but the result did not say so"
        assert result.lost_variables == ("kept",) and "Variables lost: kept." in result.outcome() and "earlier variables are kept" not in result.outcome()
        assert executor.run("'kept' in globals()").result == "False"


def test_kernel_environment_has_no_secret_from_the_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_API_KEY", "sk-parent-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-secret")
    monkeypatch.setenv("DB_PASSWORD", "hunter2")
    monkeypatch.setenv("SHARED_TOKEN", "allowed-by-config")
    monkeypatch.setenv("PLAIN_SETTING", "visible")
    config = ExecutionConfig(allowed_env=["SHARED_TOKEN"])
    with KernelExecutor(tmp_path, config=config) as executor:
        result = executor.run("import os\nseen = dict(os.environ)\nsorted(seen)")
        values = executor.run("'|'.join(seen.values())").result or ""
        cwd = executor.run("os.getcwd()").result
    names = result.result or ""
    for secret in ("MY_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL", "GITHUB_TOKEN", "DB_PASSWORD"):
        assert f"'{secret}'" not in names
    for value in ("sk-parent-secret", "sk-openai-secret", "ghp-secret", "hunter2"):
        assert value not in values
    assert "'SHARED_TOKEN'" in names and "'PLAIN_SETTING'" in names
    assert cwd == repr(str(tmp_path.resolve() / "cwd"))


def test_interrupt_from_another_thread_stops_a_long_sleep_quickly(kernel_executor: KernelExecutor) -> None:
    kernel_executor.run("survivor = 'still here'")
    # Interrupted once the sleep has begun (the cell says so), however slow a loaded machine is to get there.
    timer = threading.Timer(0.3, kernel_executor.interrupt)

    def on_output(stream: str, text: str) -> None:
        if "sleeping" in text and not timer.is_alive():
            timer.start()

    result = kernel_executor.run("import time\nprint('sleeping', flush=True)\ntime.sleep(100)", on_output=on_output)
    timer.join()
    assert result.interrupted and not result.timed_out and not result.kernel_died
    assert result.error is not None and result.error.name == "KeyboardInterrupt"
    assert result.elapsed < 3
    assert kernel_executor.run("survivor").result == "'still here'"


def test_ctrl_c_while_waiting_interrupts_the_cell_and_reraises(kernel_executor: KernelExecutor) -> None:
    kernel_executor.run("before_ctrl_c = 1")
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        kernel_executor.run("import time\nduring_ctrl_c = 2\ntime.sleep(100)")
    timer.join()
    assert time.monotonic() - started < 3
    assert {"before_ctrl_c", "during_ctrl_c"} <= {v.name for v in kernel_executor.variables()}
    assert kernel_executor.run("before_ctrl_c + during_ctrl_c").result == "3"


def test_snapshot_describes_user_variables_and_the_diff_names_created_changed_deleted(
    kernel_executor: KernelExecutor,
) -> None:
    first = kernel_executor.run(
        "import numpy as np, pandas as pd\nfrom math import sqrt\n"
        "frame = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})\n"
        "series = frame['a']\nmatrix = np.zeros((4, 2))\ncount = 1\ngone = 'bye'\n_private = 5\n"
        "wide = pd.DataFrame({f'c{i}': [i] for i in range(30)})\n"
        "def helper(a, b=2):\n    return a"
    )
    described = by_name(first)
    # pandas 3 names text columns `str`; pandas 2 calls them `object`.
    assert described["frame"] in ("shape (3, 2); columns: a int64, b str", "shape (3, 2); columns: a int64, b object")
    assert described["series"] == "length 3, dtype int64, name 'a'"
    assert described["matrix"] == "shape (4, 2), dtype float64"
    assert described["count"] == "1" and described["gone"] == "'bye'"
    assert described["helper"] == "function helper(a, b=2)"
    assert described["wide"].endswith("c19 int64, ... (10 more)")
    assert {v.name: v.type for v in first.variables}["frame"] == "pandas.DataFrame"
    for skipped in ("np", "pd", "sqrt", "_private", "In", "Out", "get_ipython", "exit", "quit"):
        assert skipped not in described
    assert {"frame", "count", "gone", "helper"} <= set(first.changes.created)

    second = kernel_executor.run("count = 2\ndel gone\nnew_list = ['a', 'b']\nframe['c'] = 1.5")
    assert "new_list" in second.changes.created and "frame" not in second.changes.created
    assert {"count", "frame"} <= set(second.changes.changed) and "matrix" not in second.changes.changed
    assert "gone" in second.changes.deleted
    assert by_name(second)["new_list"] == "length 2: ['a', 'b']"
    assert kernel_executor.variables() == second.variables


def test_restart_returns_the_names_of_lost_variables(kernel_executor: KernelExecutor) -> None:
    kernel_executor.run("lost_on_restart = 1")
    lost = kernel_executor.restart()
    assert "lost_on_restart" in lost and kernel_executor.variables() == ()
    assert kernel_executor.run("'lost_on_restart' in globals()").result == "False"


def host_process(pid_inside: int, *, among: list[psutil.Process]) -> psutil.Process:
    """The process of `among` that the kernel's PID namespace (the sandbox's, or the host's) calls `pid_inside`.

    /proc/<pid>/status lists a process's id in each namespace it is in, the innermost last (NSpid).
    """
    for process in among:
        with contextlib.suppress(psutil.NoSuchProcess, FileNotFoundError):
            status = Path(f"/proc/{process.pid}/status").read_text(encoding="utf-8")
            ids = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
            if int(ids[-1]) == pid_inside:
                return process
    raise AssertionError(f"no process of the kernel is {pid_inside} in its namespace: {among}")


def gone(process: psutil.Process, *, within: float = 5.0) -> bool:
    """True once `process` has exited; a process object knows its start time, so a reused PID is not mistaken for it."""
    deadline = time.monotonic() + within
    while True:
        try:
            if not process.is_running() or (process.status() == psutil.STATUS_ZOMBIE and process.num_threads() <= 1):
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


@pytest.mark.parametrize(
    "sandbox",
    ["none", pytest.param("bubblewrap", marks=pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed"))],
)
def test_no_kernel_or_kernel_child_outlives_shutdown(tmp_path: Path, sandbox: Literal["none", "bubblewrap"]) -> None:
    executor = KernelExecutor(tmp_path, config=ExecutionConfig(sandbox=sandbox))
    # The PID the kernel sees is in its own namespace when it is sandboxed: the host's list is searched by it.
    child = executor.run("import subprocess\nchild = subprocess.Popen(['sleep', '60'])\nchild.pid").result
    assert executor.pid is not None and child is not None
    kernel = psutil.Process(executor.pid)
    descendants = kernel.children(recursive=True)
    sleeper = host_process(int(child), among=descendants)
    assert sleeper.cmdline() == ["sleep", "60"]
    executor.shutdown()
    executor.shutdown()  # idempotent
    assert executor.pid is None
    assert gone(kernel) and gone(sleeper)
    assert [p for p in descendants if not gone(p, within=0)] == [], "nothing the kernel started is left"
    with pytest.raises(KernelError):
        executor.run("1")


def test_sigterm_to_the_owning_process_ends_its_kernel(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from taskweaver_lite.config.settings import ExecutionConfig
        from taskweaver_lite.kernel.executor import KernelExecutor
        executor = KernelExecutor(Path({str(tmp_path)!r}), config=ExecutionConfig())
        executor.wait_ready()
        print(executor.pid, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as owner:
        assert owner.stdout is not None
        kernel_pid = int(owner.stdout.readline())
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=10) == -signal.SIGTERM
    # Already gone when the owner is: its SIGTERM handler shut the kernel down (the kernel's own
    # parent poller would only notice a second or so later).
    assert process_gone(kernel_pid, within=0.5)


@pytest.mark.parametrize(
    "sandbox",
    ["none", pytest.param("bubblewrap", marks=pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed"))],
)
def test_a_program_killed_while_its_kernel_starts_leaves_no_kernel_running(tmp_path: Path, sandbox: Literal["none", "bubblewrap"]) -> None:
    # The launch's first process (bubblewrap, or the limits launcher) is held still from its first moment until the
    # program is dead: bubblewrap's own --die-with-parent, asked for only after its set-up, never hears of that death.
    for attempt in range(5):
        folder = tmp_path / f"attempt-{attempt}"
        script = textwrap.dedent(
            f"""
            import time
            from pathlib import Path
            from taskweaver_lite.config.settings import ExecutionConfig
            from taskweaver_lite.kernel.executor import KernelExecutor
            KernelExecutor(Path({str(folder)!r}), config=ExecutionConfig(sandbox={sandbox!r})).start()
            time.sleep(60)
            """
        )
        with subprocess.Popen([sys.executable, "-c", script]) as owner:
            program = psutil.Process(owner.pid)
            deadline = time.monotonic() + 60
            while (first := kernel_launch(program)) is None and time.monotonic() < deadline and owner.poll() is None:
                time.sleep(0.001)
            assert first is not None, f"the program never launched its kernel (it exited with {owner.returncode})"
            first.suspend()
            # Caught before it made its namespace (bubblewrap) or became the kernel (the limits launcher).
            caught = not first.children() and "ipykernel_launcher" not in first.cmdline()[1:3]
            owner.kill()
            owner.wait(10)
            first.resume()
        left = outliving(folder)
        for pid in (int(line.split(":")[0]) for line in left):
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        assert left == [], f"a kernel started for a program already dead runs on: {left}"
        if caught:
            return
    pytest.skip("the launch was never caught before its set-up: the machine is too slow to test this here")


def kernel_launch(program: psutil.Process) -> psutil.Process | None:
    """The child of `program` launching its kernel; not a probe run before it (bubblewrap's trials, the interpreter's), which may be gone at once."""
    for child in program.children():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            if "ipykernel_launcher" in child.cmdline():
                return child
    return None


def test_kernel_that_cannot_start_raises_kernel_error_naming_its_log(tmp_path: Path) -> None:
    # `python -m` puts the working folder first on sys.path, so this file replaces the launcher.
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "ipykernel_launcher.py").write_text("import sys\nsys.exit('broken launcher')\n")
    with (
        KernelExecutor(tmp_path, config=ExecutionConfig()) as executor,
        pytest.raises(KernelError, match="could not start") as raised,
    ):
        executor.run("1")
    assert str(tmp_path / "kernel.log") in str(raised.value)
    assert "broken launcher" in (tmp_path / "kernel.log").read_text()


def test_the_kernel_starts_without_the_debugger_and_a_cell_can_still_import_it(kernel_executor: KernelExecutor) -> None:
    # ipykernel imports debugpy at every start wherever it is installed (0.08 s of CPU of 0.28): ours start without it.
    import importlib.util

    assert importlib.util.find_spec("debugpy") is not None, "precondition: debugpy is installed (ipykernel depends on it)"
    result = kernel_executor.run("import sys\nprint('debugpy' in sys.modules)\nimport debugpy\nprint(debugpy.__name__)")
    assert result.success, result.error
    assert result.stdout.split() == ["False", "debugpy"], result.stdout


def test_pandas_prints_as_wide_as_the_display_width_the_chat_passes(tmp_path: Path) -> None:
    with KernelExecutor(tmp_path, config=ExecutionConfig(timeout=60, display_width=150)) as executor:
        wide = "pd.DataFrame({f'column_{i}': range(2) for i in range(14)})"
        result = executor.run(f"import pandas as pd\nprint(pd.get_option('display.width'))\nprint({wide})")
    assert result.success, result.error
    width, *table = result.stdout.splitlines()
    assert width == "150"
    assert len(table) == 3 and max(map(len, table)) > 80, "the frame is printed in one block, not wrapped at 80 columns"
