"""The Python API page runs as written: its examples, in order, against a scripted model and a real kernel."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, make_project

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply

pytestmark = pytest.mark.kernel

PAGE = REPO / "docs" / "python-api.md"
CELL = (
    "import pandas as pd\nimport matplotlib.pyplot as plt\nsales = pd.read_csv('sales.csv')\n"
    "sales.groupby('region')['revenue'].sum().plot.bar()\nplt.show()\nprint(len(sales), 'rows')"
)


def planner(messages: list[dict[str, Any]]) -> str:
    text = last_user_text(messages)
    if "Execution result" in text or "The code" in text:
        return planner_reply("North sold the most.", send_to="User")
    return planner_reply("Load sales.csv, plot revenue by region and print the row count.")


def test_the_python_api_page_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) >= 3, "the page shows a session, its files and variables, listeners and a resume"
    shown = "\n".join(blocks)
    for name in ("load_file", "artifacts", "live_variables", "add_listener", "resume_session", "working_dir"):
        assert name in shown, f"the page's examples show {name}"
    with ScriptedServer() as server:
        server.set_default("planner", planner)
        server.set_default("code_generator", lambda messages: code_reply(CELL))
        make_project(tmp_path, server.url)
        monkeypatch.chdir(tmp_path)
        printed = io.StringIO()
        names: dict[str, Any] = {}
        with contextlib.redirect_stdout(printed):
            for block in blocks:
                exec(compile(block, str(PAGE), "exec"), names)  # the page's own examples, run as a reader would
    said = printed.getvalue()
    assert "North sold the most." in said and "finished" in said, said
    assert re.search(r"\.png", said) and " rows" in said, said
    assert "sales: pandas.DataFrame shape (288, 8)" in said and "files: ['sales.csv']" in said, said
    assert "Running code\n288 rows\na cell ran: The execution succeeded." in said and "request 1 finished" in said, said
    assert "1 requests; 1 cells re-run to rebuild the variables" in said, said
