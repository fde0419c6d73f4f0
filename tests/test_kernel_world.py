"""The kernel's world: the user's folders mounted into the sandbox, their own Python, and
the libraries the CodeGenerator is told about. Real ipykernel, real bubblewrap, scripted model."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers import make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.interpreter import kernel_python
from taskweaver_lite.kernel.sandbox.bwrap import bwrap_path
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = [pytest.mark.kernel, pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder of the user's, outside the session (under /tmp: the sandbox hides it), with a CSV in it."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / "sales.csv").write_text("region,amount\nnorth,10\nsouth,32\n", encoding="utf-8")
    return folder


def sandboxed(tmp_path: Path, **settings: object) -> KernelExecutor:
    return KernelExecutor(tmp_path / "session", config=ExecutionConfig.model_validate({"sandbox": "bubblewrap", "timeout": 60, **settings}))


def test_a_mounted_folder_is_read_at_its_own_path_and_cannot_be_written(tmp_path: Path, outside: Path) -> None:
    with sandboxed(tmp_path, mounts=[str(outside)]) as executor:
        read = executor.run(f"import pandas as pd\npd.read_csv({str(outside / 'sales.csv')!r}).amount.sum().item()")
        assert read.success and read.result == "42", read.prompt_text()
        written = executor.run(f"open({str(outside / 'new.csv')!r}, 'w').write('x')")
        assert not written.success and not (outside / "new.csv").exists()
        assert any(f"in the read-only mount {outside}" in note and "mode: rw" in note for note in written.notices), written.notices
        assert executor.environment().mounts == (f"{outside} (read-only)",)


def test_a_rw_mount_takes_what_the_kernel_writes(tmp_path: Path, outside: Path) -> None:
    outside.chmod(0o777)  # as root the kernel runs as nobody, who must be able to write there
    with sandboxed(tmp_path, mounts=[{"path": str(outside), "mode": "rw"}]) as executor:
        result = executor.run(f"open({str(outside / 'report.txt')!r}, 'w').write('done')")
    assert result.success, result.prompt_text()
    assert (outside / "report.txt").read_text(encoding="utf-8") == "done"


def test_a_hidden_file_that_exists_gets_one_note_naming_load_and_the_mount_setting(tmp_path: Path, outside: Path) -> None:
    with sandboxed(tmp_path) as executor:
        hidden = executor.run(f"import pandas as pd\npd.read_csv({str(outside / 'sales.csv')!r})")
        missing = executor.run(f"open({str(outside / 'no-such-file.csv')!r})")
    assert hidden.error is not None and hidden.error.name == "FileNotFoundError"
    [note] = hidden.notices
    assert f"{outside / 'sales.csv'} exists on this machine, but the sandbox hides it" in note
    assert f"/load {outside / 'sales.csv'}" in note and f"execution.mounts: [{outside}]" in note
    assert f"Note: {note}" in hidden.prompt_text(), "the model reads it with the error"
    assert missing.notices == (), "a file that is nowhere gets no note"


def test_mounting_a_folder_that_holds_the_project_keeps_the_project_hidden(tmp_path: Path, outside: Path) -> None:
    project = outside / "project"
    project.mkdir()
    (project / "taskweaver_config.yaml").write_text("llm: {api_key: sk-secret}\n", encoding="utf-8")
    config = ExecutionConfig.model_validate({"sandbox": "bubblewrap", "mounts": [str(outside)]})
    with KernelExecutor(project / "sessions" / "one", config=config, hidden=(project,)) as executor:
        data = executor.run(f"len(open({str(outside / 'sales.csv')!r}).read())")
        secret = executor.run(f"open({str(project / 'taskweaver_config.yaml')!r}).read()")
        own = executor.run("import os\nos.getcwd()")
    assert data.success, data.prompt_text()
    assert not secret.success and "sk-secret" not in secret.prompt_text()
    assert own.success and own.result == repr(str(project / "sessions" / "one" / "cwd")), "the working folder is still there"


def make_env(root: Path, *, with_ipykernel: bool) -> Path:
    """A venv of its own (under /tmp, which the sandbox hides); with ipykernel through a .pth onto this program's packages."""
    env = root / "analysis-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = Path(subprocess.run([env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    if with_ipykernel:
        (site / "ours.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    # A library only this environment has: the probe must find it there.
    (site / "statsmodels").mkdir()
    (site / "statsmodels" / "__init__.py").write_text("", encoding="utf-8")
    return env / "bin" / "python"


def test_a_venv_interpreter_runs_the_sandboxed_kernel_and_its_libraries_are_listed(tmp_path: Path) -> None:
    python = make_env(tmp_path, with_ipykernel=True)
    with sandboxed(tmp_path, kernel=str(python)) as executor:
        result = executor.run("import sys, statsmodels\nsys.prefix")
        environment = executor.environment()
    assert result.success and result.result == repr(str(python.parent.parent)), result.prompt_text()
    assert "statsmodels" in environment.libraries and "pandas" in environment.libraries
    assert str(python) in environment.python


def test_an_installed_kernelspec_is_found_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = make_env(tmp_path, with_ipykernel=True)
    spec = tmp_path / "share" / "jupyter" / "kernels" / "analysis"
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Analysis", "language": "python"}), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    found = kernel_python("analysis")
    assert found.executable == str(python) and "kernelspec analysis" in found.describe()
    with pytest.raises(ConfigError, match=r"'nonesuch' is neither an installed Jupyter kernelspec \(installed: .*analysis"):
        kernel_python("nonesuch")


def test_an_interpreter_without_ipykernel_is_one_line_with_the_install_command(tmp_path: Path) -> None:
    python = make_env(tmp_path, with_ipykernel=False)
    with pytest.raises(ConfigError) as caught:
        KernelExecutor(tmp_path / "session", config=ExecutionConfig(kernel=str(python)))
    message = str(caught.value)
    assert "\n" not in message and f"{python} has no ipykernel; install it there: {python} -m pip install ipykernel" in message
    assert not (tmp_path / "session" / "kernel.log").exists() or (tmp_path / "session" / "kernel.log").stat().st_size == 0


def test_the_code_generator_is_told_the_kernels_libraries_and_mounts(tmp_path: Path, server: ScriptedServer, outside: Path) -> None:
    server.enqueue("planner", planner_reply("Sum the amounts."), planner_reply("42.", send_to="User"))
    server.enqueue("code_generator", code_reply(f"import pandas as pd\npd.read_csv({str(outside / 'sales.csv')!r}).amount.sum().item()"))
    project = make_project(tmp_path, server.url, execution={"sandbox": "bubblewrap", "timeout": 60, "mounts": [str(outside)]})
    with open_session(load_config(project)) as session:
        rnd = session.ask("What is the total in my downloads?")
    assert rnd.state == "finished"
    system = next(r.messages for r in server.requests if r.role == "code_generator")[0]["content"]
    assert "Analysis libraries installed in the kernel: pandas, numpy, matplotlib" in system
    assert "Use pandas, numpy and matplotlib" not in system
    assert f"The user's folders the kernel can also read, by absolute path: {outside} (read-only)" in system


def test_info_lists_the_kernels_python_libraries_and_mounts(tmp_path: Path, server: ScriptedServer, outside: Path) -> None:
    project = make_project(tmp_path, server.url, execution={"sandbox": "bubblewrap", "mounts": [str(outside)]})
    done = run_cli("chat", "-p", str(project), stdin="/info\n", timeout=60)
    assert done.returncode == 0, done.stderr
    shown = done.stderr  # piped, the chat's own lines go to stderr: stdout keeps only answers
    assert f"Mount:    {outside} (read-only)" in shown and "Libraries: pandas, numpy, matplotlib" in shown
    assert f"Kernel:   {sys.executable} (this program's Python)" in shown
