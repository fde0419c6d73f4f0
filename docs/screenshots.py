"""Render the README's terminal screenshots: a normal step and a failing step, as SVG.

    .venv/bin/python docs/screenshots.py

A real session (real kernel, the openai SDK over HTTP) against the scripted model, rendered by the
chat's own `RichConsole` into a recording console, saved with rich's `save_svg`.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path

from rich.console import Console

from taskweaver_lite.cli.console import RichConsole
from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.config.file import load_config
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.session.session import Session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

HERE = Path(__file__).resolve().parent
WIDTH = 100
STEP = "Which region had the most revenue?"
FAILING = "And the best month for Software?"
GOOD_CODE = "by_region = sales.groupby('region').revenue.sum().sort_values(ascending=False)\nprint(by_region.round(0).to_string())"
BROKEN_CODE = "software = sales[sales.category == 'Software']\nsoftware.groupby('month')['revenue'].sum().idxmax()"
FIXED_CODE = "software = sales[sales.category == 'Software']\nprint(software.groupby('date').revenue.sum().idxmax().strftime('%B %Y'))"


def main() -> None:
    """Run the two requests and save one SVG for each."""
    project = Path(tempfile.mkdtemp(prefix="twl-screens-")) / "project"
    shutil.copytree(bundled_project(), project, ignore=shutil.ignore_patterns("sessions", "*.db*", ".chat_history"))
    console = Console(record=True, file=io.StringIO(), width=WIDTH, highlight=False)
    renderer = RichConsole(console)
    with ScriptedServer() as server:
        config = load_config(project, [f"llm.api_base={server.url}", "llm.model=gpt-4o-mini"])
        with open_session(config, listeners=[renderer]) as session:
            session.load_file(project / "sample_data" / "sales.csv")
            session.executor.run("import pandas as pd\nsales = pd.read_csv('sales.csv', parse_dates=['date'])")
            server.enqueue("planner", planner_reply("Sum revenue per region from sales, largest first, and print it."))
            server.enqueue("code_generator", code_reply(GOOD_CODE))
            server.enqueue("planner", planner_reply("**South** had the most revenue: 398,358.", send_to="User"))
            ask(session, console, STEP, HERE / "screenshot-step.svg", "taskweaver-lite: a step")
            server.enqueue("planner", planner_reply("Find the month in which Software sold the most and print it."))
            server.enqueue("code_generator", code_reply(BROKEN_CODE), code_reply(FIXED_CODE))
            server.enqueue("planner", planner_reply("Software sold the most in **May 2024**.", send_to="User"))
            ask(session, console, FAILING, HERE / "screenshot-failing-step.svg", "taskweaver-lite: a failing step, revised")
    shutil.rmtree(project.parent, ignore_errors=True)


def ask(session: Session, console: Console, request: str, target: Path, title: str) -> None:
    """One request, rendered from the prompt line on, saved as `target`."""
    console.print(f"[bold]you>[/bold] {request}")
    session.ask(request)
    console.save_svg(str(target), title=title)  # clears the record, so each image holds one step
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
