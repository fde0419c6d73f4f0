"""The README as written: its first-project lines run in a fresh folder, the demo runs, the exported
notebook re-runs from another folder, and its test commands are exactly those of `.ci/run`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbclient
import nbformat
import pytest
from helpers import REPO, cli_env

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

README = (REPO / "README.md").read_text(encoding="utf-8")
# The walkthrough talks to a local model at this address; the test puts the scripted server there.
LOCAL_MODEL = "http://localhost:11434/v1"
HEAD_CODE = "import pandas as pd\nsales = pd.read_csv('sales.csv')\nprint(sales.head(3).to_string())"


def walkthrough() -> str:
    """The bash block after the README's walkthrough marker."""
    match = re.search(r"<!-- walkthrough:.*?-->\n```bash\n(.*?)```", README, re.S)
    assert match, "the README lost its walkthrough block"
    return match.group(1)


def shell_env(tmp: Path) -> dict[str, str]:
    """As after `source .venv/bin/activate`: this interpreter's scripts first on PATH; temp files under `tmp`."""
    env = cli_env()
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", TMPDIR=str(tmp))
    return env


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv


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


def test_the_readme_test_commands_are_exactly_what_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    steps = [line for line in ci if line and not line.startswith(("#", "set ", "cd "))]
    block = re.search(r"`\.ci/run` does exactly this.*?```bash\n(.*?)```", README, re.S)
    assert block, "the README lost its test commands"
    commands = [part.strip() for line in block.group(1).splitlines() for part in line.split("&&")]
    assert commands == steps
