"""What the sandbox lets a kernel see, worked out without starting one, and the note a hidden path gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskweaver_lite.kernel.sandbox.bwrap import Mount, SandboxPlan, sees
from taskweaver_lite.kernel.sandbox.hidden_paths import hidden_path_notes
from taskweaver_lite.records.execution import CellError

pytestmark = pytest.mark.unit


def plan(tmp_path: Path, *mounts: Mount) -> SandboxPlan:
    project = tmp_path / "home" / "project"
    cwd = project / "sessions" / "one" / "cwd"
    cwd.mkdir(parents=True)
    return SandboxPlan(cwd=cwd, socket_dir=project / "sessions" / "one" / "kernel", hidden=(tmp_path / "home", project), mounts=mounts)


def test_what_a_kernel_sees_follows_the_order_of_the_mounts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    world = plan(tmp_path, Mount(home))
    assert sees(Path("/usr/lib"), world), "the machine's own folders, read-only"
    assert sees(home / "Downloads" / "sales.csv", world), "inside the mounted home"
    assert not sees(home / "project" / "taskweaver_config.yaml", world), "the project stays hidden inside a mounted home"
    assert sees(home / "project" / "sessions" / "one" / "cwd" / "data.csv", world), "the working folder is always there"
    assert not sees(Path("/run/user/0/bus"), world) and not sees(tmp_path / "elsewhere", world), "/run and /tmp are private"
    assert not sees(home / "Downloads", plan(tmp_path / "other")), "without the mount, home is hidden"


def error(name: str, path: Path, errno: str = "[Errno 2] No such file or directory") -> CellError:
    return CellError(name=name, value=f"{errno}: '{path}'", traceback="")


def test_a_hidden_file_that_exists_gets_the_load_command_and_the_mount_setting(tmp_path: Path) -> None:
    world = plan(tmp_path)
    hidden = tmp_path / "home" / "Downloads" / "sales.csv"
    hidden.parent.mkdir(parents=True)
    hidden.write_text("a\n1\n", encoding="utf-8")
    [note] = hidden_path_notes(error("FileNotFoundError", hidden), world)
    assert f"/load {hidden}" in note and f"execution.mounts: [{hidden.parent}]" in note
    assert f"--set 'execution.mounts=[\"{hidden.parent}\"]'" in note


@pytest.mark.parametrize(
    ("name", "where", "sandboxed"),
    [
        ("FileNotFoundError", "nowhere", True),  # missing here too: a plain mistake, nothing to add
        ("ValueError", "hidden", True),  # not an error about a path
        ("FileNotFoundError", "hidden", False),  # no sandbox: it cannot be the sandbox's doing
    ],
)
def test_no_note_when_the_sandbox_is_not_the_reason(tmp_path: Path, name: str, where: str, sandboxed: bool) -> None:
    path = tmp_path / "home" / "file.csv"
    if where == "hidden":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x", encoding="utf-8")
    assert hidden_path_notes(error(name, path), plan(tmp_path) if sandboxed else None) == ()


def test_writing_into_a_read_only_mount_names_the_setting_that_makes_it_writable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    [note] = hidden_path_notes(error("OSError", data / "out.csv", "[Errno 30] Read-only file system"), plan(tmp_path, Mount(data)))
    assert f"read-only mount {data}" in note and f"execution.mounts: [{{path: {data}, mode: rw}}]" in note
    assert hidden_path_notes(error("OSError", data / "out.csv", "[Errno 30] Read-only file system"), plan(tmp_path / "b", Mount(data, writable=True))) == ()
