"""`execution.disk_limit`: what a session's cells keep in its working folder, in total.

Real kernels, with and without the sandbox: a cell writing many files past the limit is stopped
near it with an error naming the setting and the size, the kernel keeps its variables and the
session goes on; the CodeGenerator reads why. How the folder is measured is checked on its own.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_project

from taskweaver_lite.cli.chat import _kernel_lines
from taskweaver_lite.cli.init import init_project
from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.sandbox.bwrap import bwrap_path
from taskweaver_lite.kernel.sandbox.disk_limit import FAST, MAX_DEPTH, SLOW, DiskWatch, Pace, Reached, Unmeasurable, human, next_look, used
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

MB = 1024 * 1024
FORTY_FILES = "block = b'x' * (10 * 1024 * 1024)\nfor i in range(40):\n    with open(f'part-{i}.bin', 'wb') as f:\n        f.write(block)"
SANDBOXES = ["none", pytest.param("bubblewrap", marks=pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed"))]


@pytest.fixture(params=SANDBOXES)
def limited(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KernelExecutor]:
    config = ExecutionConfig(sandbox=request.param, disk_limit="100MB", memory_limit="2GB", timeout=120)
    with KernelExecutor(tmp_path / "sessions" / "s", config=config, hidden=(tmp_path,)) as executor:
        executor.wait_ready()
        yield executor


def test_forty_files_of_ten_megabytes_stop_near_a_hundred_and_the_kernel_goes_on(limited: KernelExecutor) -> None:
    assert limited.run("kept = 'before'").success
    result = limited.run(FORTY_FILES)
    assert not result.success
    assert "execution.disk_limit (100.0 MB)" in result.limit_reached and "MB" in result.limit_reached.split("at ", 1)[1]
    assert result.outcome().startswith("The cell was stopped with the working folder at ")
    written = sorted(limited.working_dir.glob("part-*.bin"))
    assert 10 <= len(written) < 20, f"{len(written)} files of 10 MB were written under a 100 MB limit"
    use = limited.disk_use()
    assert use is not None and use[0] is not None and use[0] < 200 * MB
    after = limited.run("print(kept)")
    assert after.success and after.stdout.strip() == "before"


def test_many_small_files_count_as_much_as_one_large_one(tmp_path: Path) -> None:
    config = ExecutionConfig(sandbox="none", disk_limit="4MB", timeout=120)
    with KernelExecutor(tmp_path / "sessions" / "s", config=config) as executor:
        # 60 MB in 100,000 files: the watcher measures less often as the files pile up (its walk grows), so the
        # loop must outlast several of its measures; 20,000 files were all written before one on a quick machine.
        result = executor.run("import os\nos.mkdir('many')\nfor i in range(100000):\n    open(f'many/{i}.txt', 'w').write('x' * 600)")
        assert not result.success and "execution.disk_limit (4.0 MB)" in result.limit_reached
        assert len(os.listdir(executor.working_dir / "many")) < 100000, "the cell was not stopped once its files passed the limit"


def _first_seen_past(limit: int, *, pace: int, walked: float, cpu: float, base: float, starts: float = 0.0) -> int:
    """The size at which the watcher's pacing first looks at a folder growing `pace` bytes a second from `starts` seconds
    after its first look past `limit`, each walk taking `walked` seconds (`cpu` of them on a core): its loop on a simulated clock."""
    watch, now, chunk = Pace(), 0.0, MB // 2
    while True:
        size = int(pace * max(0.0, now - starts)) // chunk * chunk  # what the walk finds (written in half megabytes); noted when it ends
        now += walked
        watch.note(now, size, 1)
        if size > limit:
            return size
        until, room = watch.until(limit, None), watch.room(limit, None)
        now += next_look(base=base, walked=walked, cpu=cpu, until=until, room=room)


@pytest.mark.unit
@pytest.mark.parametrize("starts", [0.0, 0.75])
def test_a_busy_machine_does_not_push_back_the_first_look_at_a_folder_growing_toward_the_limit(starts: float) -> None:
    """16 MB/s toward a 20 MB limit (a kernel's thread between cells, a gateway's kernel) while a walk of one file takes
    0.11 s waiting for a core (CI under load): pausing twenty times that wall time, the watcher first saw the folder at
    37 MB. Begun 0.75 s after a look, the writer's mean pace over the next second is a quarter of its own: paced by
    that, the look after saw 33 MB. Both are seen within two megabytes of the limit (a walk of 0.11 s apart)."""
    for walked, base in ((0.001, SLOW), (0.11, SLOW), (0.11, FAST)):
        seen = _first_seen_past(20 * MB, pace=16 * MB, walked=walked, cpu=0.0005, base=base, starts=starts)
        assert seen <= 22 * MB, f"first seen at {seen / MB:.1f} MB (walks of {walked} s, looks every {base} s)"


@pytest.mark.unit
def test_the_watcher_spends_a_twentieth_of_a_core_at_most_and_looks_before_the_growth_seen_passes_a_limit() -> None:
    assert next_look(base=FAST, walked=0.001, cpu=0.001) == FAST
    assert next_look(base=SLOW, walked=0.001, cpu=0.001) == SLOW
    assert next_look(base=FAST, walked=0.5, cpu=0.2) == pytest.approx(4.0), "a walk's CPU (a huge folder) spaces the looks out"
    assert next_look(base=FAST, walked=0.03, cpu=0.001) == pytest.approx(0.6), "a slow walk (a busy machine, a slow disk) too"
    assert next_look(base=FAST, walked=5.0, cpu=0.001) == SLOW, "but a second at most when the room left is small"
    assert next_look(base=FAST, walked=0.2, cpu=0.001, room=10.0) == pytest.approx(4.0), "and further only when it is large"
    assert next_look(base=SLOW, walked=0.001, cpu=0.001, until=0.5) == pytest.approx(0.25)
    assert next_look(base=SLOW, walked=0.001, cpu=0.001, until=0.0) == FAST
    assert next_look(base=SLOW, walked=1.0, cpu=1.0, near=True) == FAST
    growing = Pace()
    growing.note(9.0, 2 * MB, 10)
    growing.note(10.0, 4 * MB, 10)
    assert growing.until(10 * MB, None) == 0.0, "growth just begun, near the limit: its pace is measured at once"
    assert growing.until(1000 * MB, None) == pytest.approx(498.0), "far from it: paced by what was seen"
    assert growing.room(10 * MB, None) == pytest.approx(6 / 64)
    growing.note(11.0, 6 * MB, 1010)
    assert growing.until(10 * MB, None) == pytest.approx(2.0)
    assert growing.until(10 * MB, 1510) == pytest.approx(0.5), "the files limit is passed first"
    growing.note(11.1, 6 * MB, 1010)
    assert growing.until(10 * MB, 1510) == pytest.approx(0.5), "between two writes: still the pace seen"
    growing.note(12.0, 6 * MB, 1010)
    assert growing.until(10 * MB, 1510) == float("inf"), "a quiet spell: no pace to pass a limit at"


def test_a_folder_growing_toward_the_limit_is_looked_at_before_the_pace_it_grows_at_could_pass_it(tmp_path: Path) -> None:
    """A writer at 16 MB/s toward a 20 MB limit, between cells (a kernel's thread, a gateway's kernel): the watcher's
    second-long pause would see it first near 32 MB; looking again within half the time the growth seen would take to
    reach the limit, it sees it within a few hundredths of a second of passing it, on a busy machine too (where its
    first pause, twenty times a slow walk's wall time, let it first see 36 MB in 2 of 4 CI runs)."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    first: list[Reached] = []
    passed = threading.Event()

    def told(reached: Reached, in_cell: bool) -> None:
        first.append(reached)
        passed.set()

    watch = DiskWatch((folder,), limit=20 * MB, on_reached=told)
    try:
        chunk, pace = b"x" * (MB // 2), 16 * MB  # bytes per second at most: late on a busy machine, it never catches up in a burst
        due, written = time.monotonic(), 0
        with (folder / "growing.bin").open("wb") as out:
            while not passed.is_set() and written < 60 * MB:
                out.write(chunk)
                out.flush()
                written += len(chunk)
                due = max(due + len(chunk) / pace, time.monotonic())
                passed.wait(max(0.0, due - time.monotonic()))
        assert passed.wait(10), f"the watcher never saw {written / MB:.0f} MB pass the 20 MB limit"
    finally:
        watch.close()
    size = first[0].size
    # 24 MB: a look or two late on a busy machine (a walk that waits for a core), well short of the 32-36 MB a second's pause lets through.
    assert size is not None and size <= 24 * MB, f"the watcher first saw the folder at {human(size) if size else size}, well past the 20 MB limit"


def test_a_cell_that_begins_past_the_limit_may_delete_and_only_writing_more_stops_it(tmp_path: Path) -> None:
    config = ExecutionConfig(sandbox="none", disk_limit="2MB", timeout=60)
    with KernelExecutor(tmp_path / "sessions" / "s", config=config) as executor:
        (executor.working_dir / "big.bin").write_bytes(b"x" * 3 * MB)  # loaded by the user: past the limit
        cleaning = executor.run("import os, time\ntime.sleep(0.3)\nos.remove('big.bin')\nopen('small.txt', 'w').write('ok')")
        assert cleaning.success and not cleaning.limit_reached
        growing = executor.run("open('again.bin', 'wb').write(b'y' * (3 * 1024 * 1024))")
        assert not growing.success
        # Stopped by the watcher, or by the cap on every file (RLIMIT_FSIZE) if that came first: either way the setting is named.
        assert "execution.disk_limit" in growing.limit_reached or any("execution.disk_limit" in notice for notice in growing.notices)
        assert (executor.working_dir / "again.bin").stat().st_size <= 2 * MB


def test_a_child_process_writing_past_the_limit_is_ended(tmp_path: Path) -> None:
    config = ExecutionConfig(sandbox="none", disk_limit="20MB", timeout=120)
    with KernelExecutor(tmp_path / "sessions" / "s", config=config) as executor:
        code = "import subprocess\nsubprocess.run(['sh', '-c', 'i=0; while true; do i=$((i+1)); head -c 1048576 /dev/zero > w-$i; done'])"
        result = executor.run(code)
        assert not result.success and "execution.disk_limit" in result.limit_reached
        assert result.elapsed < 60
        count = len(list(executor.working_dir.glob("w-*")))
        assert executor.run("x = 1").success
        assert len(list(executor.working_dir.glob("w-*"))) == count, "the writer went on after the cell"


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_cell_whose_child_process_passes_the_limit_stops_without_waiting_for_a_lost_reply(tmp_path: Path, sandbox: str) -> None:
    """A cell waiting on its writer (`subprocess.run`) ends on its own once the writer is ended. An interrupt sent to it (a
    message, to a sandboxed kernel) landed after it: in the kernel's own code, which dropped the cell's reply (5 s more
    waiting for it, in 3 of 6 such cells under load), or in the next cell, which it failed. Four cells, each stopped well
    within those 5 s, and the cell after each runs."""
    config = ExecutionConfig(sandbox=sandbox, disk_limit="20MB", timeout=120)
    writer = "import subprocess\nsubprocess.run(['sh', '-c', 'i=0; while true; do i=$((i+1)); head -c 1048576 /dev/zero > w-$i; done'])"
    with KernelExecutor(tmp_path / "sessions" / "s", config=config) as executor:
        for _ in range(4):
            result = executor.run(writer)
            assert not result.success and "execution.disk_limit" in result.limit_reached, result
            assert result.elapsed < 4.0, f"the cell stopped {result.elapsed:.1f} s after it began"
            assert executor.run("import glob, os\nfor name in glob.glob('w-*'): os.remove(name)").success


def test_a_kernel_thread_writing_between_cells_ends_the_kernel_and_the_next_cell_says_why(tmp_path: Path) -> None:
    config = ExecutionConfig(sandbox="none", disk_limit="20MB", timeout=60)
    with KernelExecutor(tmp_path / "sessions" / "s", config=config) as executor:
        code = (
            "import threading, time\n"
            "def _fill():\n    for i in range(10_000):\n        open(f'bg-{i}', 'wb').write(b'x' * 1024 * 1024); time.sleep(0.02)\n"
            "threading.Thread(target=_fill, daemon=True).start()\n"
            "kept = 1"
        )
        assert executor.run(code).success
        kernel = executor.pid
        assert kernel is not None
        deadline = time.monotonic() + 30  # the watcher looks every second between cells: its second strike ends the kernel
        while _running(kernel):
            assert time.monotonic() < deadline, "the kernel whose thread kept writing was never ended"
            time.sleep(0.1)
        count = len(list(executor.working_dir.glob("bg-*")))
        after = executor.run("print('fresh')")
        assert after.kernel_died and after.lost_variables == ("kept",) and after.stdout.strip() == "fresh"
        assert any(notice.startswith("Between cells the kernel kept writing") for notice in after.notices), after.notices
        assert count < 200 and len(list(executor.working_dir.glob("bg-*"))) == count, "the kernel's thread went on writing"


def _running(pid: int) -> bool:
    """Whether the process runs (ended and not yet reaped counts as ended)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_code_generator_is_told_and_the_session_goes_on(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        folder = make_project(tmp_path / "p", server.url, execution={"sandbox": "none", "disk_limit": "100MB"})
        server.enqueue("planner", planner_reply("Write the files."), planner_reply("The disk limit stopped it.", send_to="User"))
        server.enqueue("code_generator", *[code_reply(FORTY_FILES) for _ in range(4)])
        server.enqueue("planner", planner_reply("Compute 6 * 7."), planner_reply("42.", send_to="User"))
        server.enqueue("code_generator", code_reply("print(6 * 7)"))
        with open_session(load_config(folder)) as session:
            first = session.ask("Write forty files of ten megabytes.")
            second = session.ask("What is six times seven?")
    assert first.state == "finished" and second.state == "finished"
    revision = [r.messages for r in server.requests if r.role == "code_generator"][1][-1]["content"]
    assert "execution.disk_limit" in revision and "The cell was stopped" in revision


def test_info_shows_the_use_against_the_limit_and_what_the_filter_refuses(limited: KernelExecutor) -> None:
    assert limited.run("open('one.bin', 'wb').write(b'x' * (3 * 1024 * 1024))").success
    lines = _kernel_lines(limited.environment())
    disk = next(line for line in lines if line.startswith("Disk:"))
    assert disk.startswith("Disk:     3.0 MB of 100.0 MB kept (execution.disk_limit)"), disk
    if limited.sandbox is not None:
        assert any(line.startswith("Syscalls: filtered: refuses new namespaces") for line in lines), lines
    else:
        assert any(line.startswith("Sandbox:  none") for line in lines), lines


@pytest.mark.unit
def test_init_writes_a_commented_disk_limit_the_config_reads(tmp_path: Path) -> None:
    project = init_project(tmp_path / "new")
    line = next(line for line in (project / "taskweaver_config.yaml").read_text().splitlines() if "disk_limit:" in line)
    assert line.split("#", 1)[0].split() == ["disk_limit:", "2GB"] and "/load" in line.split("#", 1)[1]
    assert load_config(project).execution.disk_limit_bytes() == 2 * 1024 * MB


@pytest.mark.unit
def test_the_measure_counts_links_once_sparse_files_at_their_length_and_folders(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 100_000)
    os.link(tmp_path / "a.bin", tmp_path / "b.bin")
    with open(tmp_path / "sparse.bin", "wb") as sparse:
        sparse.truncate(50 * MB)
    (tmp_path / "link").symlink_to("/usr")  # a link is not followed
    total = used((tmp_path,))
    assert 50 * MB + 100_000 <= total < 50 * MB + 200_000


@pytest.mark.unit
def test_a_folder_made_unreadable_is_opened_again_and_one_nested_too_deep_is_past_the_limit(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "data.bin").write_bytes(b"x" * 300_000)
    hidden.chmod(0)
    assert used((tmp_path,)) >= 300_000
    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(MAX_DEPTH + 2):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    with pytest.raises(Unmeasurable, match="nested"):
        used((tmp_path,))
