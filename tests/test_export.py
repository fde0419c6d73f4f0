"""Export: a recorded session as a notebook that validates and re-runs in a kernel, and as Markdown."""

from __future__ import annotations

import base64
import os
import re
import shutil
import time
from pathlib import Path

import nbclient
import nbformat
import pytest
from recorded_session import (
    BROKEN_CODE,
    FIRST_ANSWER,
    FIRST_REQUEST,
    PLOT_CODE,
    SECOND_ANSWER,
    SECOND_REQUEST,
    WRITE_CODE,
    RecordedSession,
    record_session,
)

from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import FileLoaded, PostAdded, RoundStarted
from taskweaver_lite.records.execution import ExecutionResult
from taskweaver_lite.session.export import export_markdown, export_notebook
from taskweaver_lite.store.database import SessionStore, StoredSession

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> RecordedSession:
    return record_session(tmp_path_factory.mktemp("export"))


def load(recorded: RecordedSession) -> StoredSession:
    store = SessionStore(recorded.store_path)
    try:
        return store.load(recorded.session_id)
    finally:
        store.close()


def code_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in notebook.cells if c.cell_type == "code"]


def test_the_notebook_has_requests_code_with_outputs_and_answers_and_validates(recorded: RecordedSession, tmp_path: Path) -> None:
    path = export_notebook(load(recorded), tmp_path / "session.ipynb")
    notebook = nbformat.read(str(path), as_version=4)
    nbformat.validate(notebook)
    markdown = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    for text in (FIRST_REQUEST, SECOND_REQUEST, f"**Answer:** {FIRST_ANSWER}", f"**Answer:** {SECOND_ANSWER}", "This attempt failed and was revised"):
        assert text in markdown
    write, broken, plot = code_cells(notebook)
    assert [c.source for c in (write, broken, plot)] == [WRITE_CODE, BROKEN_CODE, PLOT_CODE]
    assert [c.execution_count for c in (write, broken, plot)] == [1, 2, 3]
    assert write.outputs[0].output_type == "stream" and write.outputs[0].text == "rows: 3\n"
    assert broken.metadata.tags == ["raises-exception"] and broken.outputs[0].ename == "NameError"
    image = next(o for o in plot.outputs if o.output_type == "display_data")
    assert base64.b64decode(image.data["image/png"]).startswith(b"\x89PNG")
    result = next(o for o in plot.outputs if o.output_type == "execute_result")
    assert "text/html" in result.data and result.execution_count == 3


def test_the_notebook_reruns_top_to_bottom_in_a_real_kernel_past_the_failed_attempt(recorded: RecordedSession, tmp_path: Path) -> None:
    path = export_notebook(load(recorded), tmp_path / "session.ipynb", working_dir=recorded.working_dir)
    notebook = nbformat.read(str(path), as_version=4)
    nbclient.NotebookClient(notebook, timeout=60, resources={"metadata": {"path": str(tmp_path)}}).execute()
    setup, write, broken, plot = code_cells(notebook)
    assert setup.source.startswith("import os\nfolder = ") and "os.chdir(folder)" in setup.source
    assert write.outputs[0].text == "rows: 3\n"
    assert broken.outputs[0].ename == "NameError"
    assert any("image/png" in o.get("data", {}) for o in plot.outputs), "the plot cell, after the failure, ran and read numbers.csv"


def test_an_image_whose_file_is_gone_is_named_instead_of_embedded(recorded: RecordedSession, tmp_path: Path) -> None:
    stored = load(recorded)
    [artifact] = [a for r in stored.rounds for p in r.posts for a in p.artifacts]
    moved = tmp_path / "kept.png"
    Path(artifact).rename(moved)
    try:
        notebook = nbformat.read(str(export_notebook(stored, tmp_path / "s.ipynb")), as_version=4)
    finally:
        moved.rename(artifact)
    image = next(o for o in code_cells(notebook)[-1].outputs if o.output_type == "display_data")
    assert "image/png" not in image.data and "no longer on disk" in image.data["text/plain"]


def test_the_markdown_transcript_has_requests_plans_code_outputs_errors_artifacts_and_answers(recorded: RecordedSession, tmp_path: Path) -> None:
    text = export_markdown(load(recorded), tmp_path / "session.md").read_text(encoding="utf-8")
    assert text.startswith("# Make a small table")
    for part in (
        f"## 1. {FIRST_REQUEST}",
        f"## 2. {SECOND_REQUEST}",
        "**Plan**",
        "**Planner → CodeInterpreter:** Plot numbers.csv",
        f"```python\n{WRITE_CODE}\n```",
        "```text\nrows: 3\n```",
        "Error: `NameError: name 'dff' is not defined`",
        "*This attempt failed and was revised.*",
        f"```python\n{PLOT_CODE}\n```",
        f"**Answer:** {FIRST_ANSWER}",
        f"**Answer:** {SECOND_ANSWER}",
    ):
        assert part in text
    assert text.index(FIRST_REQUEST) < text.index(WRITE_CODE) < text.index(FIRST_ANSWER) < text.index(SECOND_REQUEST)
    assert "![cell-" in text and ".png](" in text


def test_cut_off_rounds_and_code_that_killed_the_kernel_are_marked_and_never_rerun(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions.db")
    store.create_session("s", started=time.time())
    rnd = Round(index=1, user_query="crash the kernel")
    store.record("s", RoundStarted(rnd))
    fatal = "import os\nos._exit(1)  # ```fenced```"
    post = Post("CodeInterpreter", "Planner", "it died", code=fatal, execution=ExecutionResult(code=fatal, success=False, kernel_died=True))
    rnd.posts.append(post)
    store.record("s", PostAdded(rnd, post))
    store.mark_interrupted("s")
    stored = store.load("s")
    store.close()
    notebook = nbformat.read(str(export_notebook(stored, tmp_path / "s.ipynb")), as_version=4)
    assert code_cells(notebook) == []
    markdown = "\n".join(c.source for c in notebook.cells)
    assert "This request failed:** Cut off: the program stopped during this request." in markdown
    assert "This code crashed the kernel" in markdown and f"````python\n{fatal}\n````" in markdown
    text = export_markdown(stored, tmp_path / "s.md").read_text(encoding="utf-8")
    assert "> **This request failed:** Cut off" in text and "*The kernel died while running this code and was restarted.*" in text


def test_a_notebook_exported_with_a_relative_project_path_runs_after_it_is_moved(
    recorded: RecordedSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(recorded.working_dir.parents[2])  # as `taskweaver-lite export -p project` would run
    relative = Path(os.path.relpath(recorded.working_dir))
    written = export_notebook(load(recorded), Path("moved-later.ipynb"), working_dir=relative)
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    moved = Path(shutil.move(str(written), elsewhere / "analysis.ipynb"))
    notebook = nbformat.read(str(moved), as_version=4)
    nbclient.NotebookClient(notebook, timeout=60, resources={"metadata": {"path": str(elsewhere)}}).execute()
    setup, write, _broken, plot = code_cells(notebook)
    assert str(recorded.working_dir.resolve()) in setup.source
    assert write.outputs[0].text == "rows: 3\n"
    assert any("image/png" in o.get("data", {}) for o in plot.outputs), "numbers.csv was read from the session folder"


def test_loaded_files_appear_where_they_were_loaded_in_both_exports(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions.db")
    store.create_session("s", started=time.time())
    store.record("s", FileLoaded(name="sales.csv", source="/data/sales.csv", after_round=0, at=1.0))
    rnd = Round(index=1, user_query="how many rows?")
    store.record("s", RoundStarted(rnd))
    store.record("s", FileLoaded(name="costs.csv", source="/data/costs.csv", after_round=1, at=2.0))
    stored = store.load("s")
    store.close()
    assert [load.name for load in stored.loads] == ["sales.csv", "costs.csv"]
    text = export_markdown(stored, tmp_path / "s.md").read_text(encoding="utf-8")
    first, second = "Loaded `sales.csv` into the working folder (from /data/sales.csv).", "Loaded `costs.csv`"
    assert text.index(first) < text.index("## 1. how many rows?") < text.index(second)
    notebook = nbformat.read(str(export_notebook(stored, tmp_path / "s.ipynb")), as_version=4)
    markdown = [c.source for c in notebook.cells if c.cell_type == "markdown"]
    assert f"*{first}*" in markdown and markdown.index(f"*{first}*") < next(i for i, m in enumerate(markdown) if m.startswith("## Request 1"))


def test_the_markdown_export_copies_its_images_beside_it_and_links_them_relatively_so_it_moves(recorded: RecordedSession, tmp_path: Path) -> None:
    written = export_markdown(load(recorded), tmp_path / "out" / "report.md")
    text = written.read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links and all(link.startswith("report_files/") for link in links), links
    moved = tmp_path / "elsewhere"
    shutil.move(str(written.parent), moved)
    for link in links:
        image = moved / link
        assert image.is_file() and image.read_bytes().startswith(b"\x89PNG"), f"{link} resolves next to the moved file"


@pytest.mark.cli
def test_an_exported_demo_session_runs_top_to_bottom_in_a_fresh_folder_with_its_plugin_and_data(tmp_path: Path) -> None:
    from helpers import run_cli

    project = tmp_path / "demo"
    done = run_cli("demo", "-p", str(project), "--plain", timeout=240)
    assert done.returncode == 0, done.stderr
    notebook_path = tmp_path / "analysis.ipynb"
    exported = run_cli("export", "last", "-p", str(project), "-o", str(notebook_path))
    assert exported.returncode == 0, exported.stderr
    notebook = nbformat.read(str(notebook_path), as_version=4)
    assert any("anomaly_detection(" in c.source for c in code_cells(notebook)), "the demo calls its plugin"
    # Another machine: the session's folder is not there, only the notebook in a fresh folder.
    shutil.rmtree(project)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    nbclient.NotebookClient(notebook, timeout=120, resources={"metadata": {"path": str(fresh)}}).execute()  # raises on an untagged error
    errors = [o for c in code_cells(notebook) if "raises-exception" not in c.metadata.get("tags", []) for o in c.outputs if o.output_type == "error"]
    assert errors == []
    plugin_call = next(c for c in code_cells(notebook) if "anomaly_detection(" in c.source and "_twl_runtime" not in c.source)
    assert not any(o.output_type == "error" for o in plugin_call.outputs)
    assert (fresh / "sales.csv").is_file(), "the loaded data file was carried in the notebook"
