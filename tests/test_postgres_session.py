"""A real session on a PostgreSQL store (`store.url`): asked, listed, resumed, exported from another machine's view.

The scripted model and a real kernel; the store is a fresh database on the run's private PostgreSQL.
No SQLite store may appear in the project, and the password may appear in no output or file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import make_project

from taskweaver_lite.cli.main import main
from taskweaver_lite.config.file import load_config
from taskweaver_lite.session.assembly import open_session, resume_session
from taskweaver_lite.testing.postgres_cluster import PostgresCluster
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.postgres

PLOT = "import matplotlib.pyplot as plt\nnumbers = [1, 3, 2]\nplt.plot(numbers)\nplt.show()"


def test_a_session_on_postgresql_is_kept_listed_resumed_and_exported_without_its_folder(
    postgres_cluster: PostgresCluster, postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url, store={"url": postgres_url})
        config = load_config(project)
        server.enqueue("planner", planner_reply("Plot the numbers."), planner_reply("Plotted.", send_to="User"))
        server.enqueue("code_generator", code_reply(PLOT))
        with open_session(config) as session:
            session.ask("plot 1, 3, 2")
            session_id = session.id
        assert not list(project.rglob("*.db")) and not (project / "sessions.db.locks").exists(), "no SQLite store in the project"

        assert main(["sessions", "--json", "-p", str(project)]) == 0
        assert [row["id"] for row in json.loads(capsys.readouterr().out)] == [session_id]

        resumed, report = resume_session(config, session_id)
        with resumed:
            assert report.rounds == 1 and report.replayed == 1 and report.replay_failures == 0
            assert resumed.executor.run("print(sum(numbers))").stdout.strip() == "6", "the replay rebuilt the variables"

        shutil.rmtree(config.sessions_dir)  # another server's view: the store is all there is
        target = tmp_path / "out.ipynb"
        assert main(["export", session_id, "-p", str(project), "-o", str(target)]) == 0
        outputs = [o for cell in json.loads(target.read_text(encoding="utf-8"))["cells"] for o in cell.get("outputs", [])]
        assert any("image/png" in o.get("data", {}) for o in outputs), "the plot comes from the store"
    said = capsys.readouterr()
    files = "".join(p.read_text(encoding="utf-8", errors="replace") for p in [*tmp_path.rglob("*")] if p.is_file() and p.name != "taskweaver_config.yaml")
    assert postgres_cluster.password not in said.out + said.err + files
