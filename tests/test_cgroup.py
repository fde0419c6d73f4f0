"""A kernel's own cgroup, made in a cgroup file system laid out as cgroup v1 or v2 (a folder standing in for /sys/fs/cgroup)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.sandbox import cgroup, limits
from taskweaver_lite.kernel.sandbox.bwrap import bwrap_path, kernel_command, plan_for

pytestmark = pytest.mark.unit


def _v2(root: Path, own: str) -> Path:
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n", encoding="ascii")
    mine = root / own.lstrip("/")
    mine.mkdir(parents=True)
    (mine / "cgroup.subtree_control").write_text("", encoding="ascii")
    return mine


def test_on_cgroup_v2_a_kernel_gets_memory_cpu_and_processes_capped_below_this_programs_cgroup(tmp_path: Path) -> None:
    mine = _v2(tmp_path / "cg", "/user.slice/app.scope")
    made = cgroup.make(cgroup.Caps(memory=2**30, cpu=1.5, processes=64), root=tmp_path / "cg", own={"": "/user.slice/app.scope"})
    (folder,) = made.folders
    assert folder.parent == mine and folder.name.startswith(cgroup.PREFIX) and made.version == 2
    assert (folder / "memory.max").read_text() == str(2**30)
    assert (folder / "cpu.max").read_text() == "150000 100000" and (folder / "pids.max").read_text() == "64"
    assert set((mine / "cgroup.subtree_control").read_text().split()) == {"+memory", "+cpu", "+pids"}
    assert made.join_files() == [str(folder / "cgroup.procs")]
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n", encoding="ascii")
    assert made.oom_kills() == 2


def test_on_cgroup_v1_each_controller_gets_its_own_folder_and_no_cpu_limit_means_no_quota(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    for controller in ("memory", "cpu", "pids"):
        (root / controller).mkdir(parents=True)
        (root / controller / "cgroup.procs").write_text("", encoding="ascii")
    (root / "memory" / "process_api" / "abc").mkdir(parents=True)
    own = {"memory": "/process_api/abc", "cpu": "/", "pids": "/"}
    made = cgroup.make(cgroup.Caps(memory=2**30, processes=32), root=root, own=own)
    memory, cpu, pids = made.folders
    assert memory.parent == root / "memory" / "process_api" / "abc" and cpu.parent == root / "cpu"
    assert (memory / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (cpu / "cpu.cfs_quota_us").read_text() == "-1" and (pids / "pids.max").read_text() == "32"
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", encoding="ascii")
    assert made.oom_kills() == 3


def test_where_none_can_be_made_one_line_says_why_and_which_settings_it_costs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(cgroup.NoCgroup) as none:
        cgroup.make(cgroup.Caps(memory=2**30), root=tmp_path / "empty", own={"": "/"})
    line = cgroup.unavailable_notice(str(none.value))
    assert "\n" not in line and "execution.memory_limit" in line and "execution.cgroup: off" in line
    root = tmp_path / "few"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu io\n", encoding="ascii")
    (root / "user.slice").mkdir()
    with pytest.raises(cgroup.NoCgroup, match="no memory, pids controller"):
        cgroup.make(cgroup.Caps(), root=root, own={"": "/user.slice"})


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_the_cgroup_is_joined_outside_bubblewrap_before_it_starts(tmp_path: Path) -> None:
    made = cgroup.KernelCgroup(folders=(tmp_path / "k",), version=2)
    plan = plan_for(cwd=tmp_path, socket_dir=tmp_path, hidden=(), network=False)
    command = kernel_command(["python", "-m", "ipykernel_launcher"], config=ExecutionConfig(), plan=plan, cgroup=made)
    joined = command.index("--join")
    assert command[joined + 1] == str(tmp_path / "k" / "cgroup.procs") and command[2:4] == ["-S", limits.__file__]
    assert joined < command.index(command[command.index("--") + 1]), "the joiner runs first, then becomes bubblewrap"
    assert command[command.index("--") + 1].endswith("bwrap")


def test_execution_cgroup_off_makes_none_and_says_nothing() -> None:
    assert cgroup.for_kernel(ExecutionConfig(cgroup="off")) == (None, None)
