"""The README and the getting-started page as written: the first-project lines run in a fresh folder,
the demo runs, the exported notebook re-runs from another folder, and the README's test command is
what CI runs: `.ci/run`, which installs from scratch and then runs every check."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest
from helpers import REPO, cli_env

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.cli

README = (REPO / "README.md").read_text(encoding="utf-8")
GETTING_STARTED = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
# The walkthrough talks to a local model at this address; the test puts the scripted server there.
LOCAL_MODEL = "http://localhost:11434/v1"
HEAD_CODE = "import pandas as pd\nsales = pd.read_csv('sales.csv')\nprint(sales.head(3).to_string())"


def walkthrough() -> str:
    """The bash block after the getting-started page's walkthrough marker."""
    match = re.search(r"<!-- walkthrough:.*?-->\n```bash\n(.*?)```", GETTING_STARTED, re.S)
    assert match, "docs/getting-started.md lost its walkthrough block"
    return match.group(1)


def shell_env(tmp: Path) -> dict[str, str]:
    """As after `source .venv/bin/activate`: this interpreter's scripts first on PATH; temp files under `tmp`."""
    env = cli_env()
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", TMPDIR=str(tmp))
    return env


def test_the_first_project_walkthrough_runs_as_written_and_its_notebook_runs_elsewhere(tmp_path: Path, server: ScriptedServer) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    server.enqueue("planner", planner_reply("Read sales.csv into sales and print its first 3 rows."), planner_reply("Here are the first rows.", send_to="User"))
    server.enqueue("code_generator", code_reply(HEAD_CODE))
    script = walkthrough().replace(LOCAL_MODEL, server.url)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=fresh, env=shell_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Here are the first rows.\n" in done.stdout
    assert "region" in done.stderr, "the code read the loaded sales.csv"
    assert "--resume" in done.stderr and "Wrote analysis.ipynb" in done.stderr

    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    moved = shutil.move(str(fresh / "analysis.ipynb"), elsewhere / "analysis.ipynb")
    notebook = nbformat.read(str(moved), as_version=4)
    assert any("Loaded `sales.csv`" in c.source for c in notebook.cells if c.cell_type == "markdown"), "the /load is in the notebook"
    nbclient.NotebookClient(notebook, timeout=60, resources={"metadata": {"path": str(elsewhere)}}).execute()
    head = next(c for c in notebook.cells if c.cell_type == "code" and c.source == HEAD_CODE)
    assert "region" in head.outputs[0].text


def test_the_demo_runs_from_a_fresh_folder(tmp_path: Path) -> None:
    done = subprocess.run(["taskweaver-lite", "demo"], cwd=tmp_path, env=shell_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Done: 8 requests" in done.stdout
    assert "The anomaly_detection plugin flagged" in done.stdout, "the demo calls a shipped plugin"
    assert "Warning" not in done.stdout + done.stderr, "the demo's own code raises no warning"


def bash_blocks(text: str, heading: str) -> list[str]:
    """The bash blocks of the section under `heading`."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_the_readme_set_up_commands_are_one_line_each_and_its_test_line_is_what_ci_runs() -> None:
    demo, tests = bash_blocks(README, "Two commands")
    assert demo.count("\n") == 1 and demo.strip().endswith("taskweaver-lite demo"), "the demo is one line"
    assert tests.strip() == "bash .ci/run", "the test line is CI's own script"
    ci = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    install = ci.index(".venv/bin/pip install --quiet --no-compile -e '.[test]'")
    assert ci.index("rm -rf .venv") < ci.index("python3 -m venv .venv") < install, "a fresh environment, then a clean install"
    # Left out: the servers some tiers use (llama.cpp, Phoenix), set up before them, the wait for the installs begun in
    # the background, and the package's bytecode, compiled once for every test process.
    checks = [line for line in ci[install + 1 :] if ".ci/" not in line and not line.startswith(("settle ", ".venv/bin/python -m compileall"))]
    quick = [".venv/bin/ruff check .", ".venv/bin/ruff format --check .", ".venv/bin/mypy taskweaver_lite tests bench", ".venv/bin/python -m pytest -q -m unit"]
    assert checks[:4] == quick, "the quick checks first: lint, format, types, the unit tier"
    # Then every other tier: the tiers that run a model server, started in the background, and beside them all the
    # rest on workers; the run waits for both. With the unit run, the three runs are the whole suite: no tier left
    # out, none run twice.
    runs = [line for line in checks[4:] if " -m pytest " in line]
    assert runs == [
        'setsid nice -n 10 .venv/bin/python -m pytest -q -m "llama or real" >build/ci/models.log 2>&1 &',
        '.venv/bin/python -m pytest -q -m "not unit and not llama and not real" -n 4 --dist loadfile',
    ], "then every other tier: the runs together are the whole suite"
    assert 'wait "$MODELS" || { cat build/ci/models.log; exit 1; }' in checks, "a failure of the model server's tiers fails the run"
    assert any(".venv/bin/mkdocs build --strict" in line for line in checks[6:]), "and the documentation, warnings as errors"
    hooks = (REPO / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    assert all(check.removeprefix(".venv/bin/").split(" .")[0].split(" -q")[0] in hooks for check in quick), "pre-commit runs the same quick checks"


def test_the_readme_is_short_and_says_how_long_the_tests_take() -> None:
    assert len(README.splitlines()) < 300
    timings = " ".join(README.split("<!-- timings:", 1)[1].split("\n\n", 1)[0].split())
    assert re.search(r"whole run takes about \d+ minutes", timings) and re.search(r"unit` runs the quick tier in about \d+ seconds", timings)
