"""`taskweaver-lite demo`: a real analysis of bundled sales data, with a scripted model.

Everything but the model is real: the openai SDK talks HTTP to a scripted OpenAI-compatible
server on 127.0.0.1, the code runs in a real Jupyter kernel, and the Planner's answers are built
from what that code actually printed. No network and no key are needed.
"""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskweaver_lite.cli.console import PlainConsole, RichConsole
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.records.execution import DATA_CLOSE, DATA_OPEN
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply, summary_reply

Answer = Callable[[str], str]  # from the CodeInterpreter's reports in this round to the Planner's answer


@dataclass
class Step:
    """One request of the demo: the Planner's steps, the code for each, and how to answer."""

    request: str
    plan: str
    hops: list[tuple[str, list[str]]] = field(default_factory=list)  # (instruction, code attempts)
    answer: Answer = lambda report: report


def _output(report: str) -> str:
    """The 'Output:' section of a CodeInterpreter report."""
    match = re.search(r"Output:\n(.*?)(?:\n(?:Result value:|Artifacts saved:|Variables |Error:|Stderr:|\(Full output)|\Z)", report, re.S)
    text = match.group(1).strip() if match else report.strip()
    # The report fences what code printed as data for the model; the user's answer shows it bare.
    return text.removeprefix(DATA_OPEN).removesuffix(DATA_CLOSE).strip()


def _line(report: str, label: str) -> str:
    match = re.search(rf"^{re.escape(label)}:\s*(.+)$", report, re.M)
    return match.group(1).strip() if match else "(not found)"


def _artifacts(report: str) -> str:
    match = re.search(r"Artifacts saved: (.+)", report)
    return match.group(1).strip() if match else "(no file)"


STEPS: list[Step] = [
    Step(
        request="Load sales.csv and give me a quick overview of what's in it.",
        plan="1. Load sales.csv and describe its shape, columns and coverage\n2. Report the overview",
        hops=[
            (
                "Load sales.csv into a DataFrame named sales. Print its shape, the columns with dtypes, the date range, and the regions and categories.",
                [
                    'import pandas as pd\nsales = pd.read_csv("sales.csv", parse_dates=["date"])\nprint("rows:", len(sales))\n'
                    'print("columns:", ", ".join(f"{c} ({t})" for c, t in sales.dtypes.astype(str).items()))\n'
                    'print("dates:", sales.date.min().date(), "to", sales.date.max().date())\n'
                    'print("regions:", ", ".join(sorted(sales.region.unique())))\nprint("categories:", ", ".join(sorted(sales.category.unique())))'
                ],
            )
        ],
        answer=lambda r: (
            f"**sales.csv** holds {_line(r, 'rows')} rows of monthly sales from {_line(r, 'dates')}.\n\n"
            f"- Regions: {_line(r, 'regions')}\n- Categories: {_line(r, 'categories')}\n- Columns: {_line(r, 'columns')}"
        ),
    ),
    Step(
        request="Which region grew its revenue fastest from 2023 to 2024?",
        plan="1. Compute revenue per region per year\n2. Compute the growth and rank the regions\n3. Report the fastest",
        hops=[
            (
                "Using sales, compute total revenue per region for 2023 and 2024, the growth in percent, sorted descending. "
                "Print the table and the fastest region.",
                [
                    'by_year = sales.groupby(["region", sales.date.dt.year])["Revenue"].sum().unstack()',
                    'by_year = sales.groupby(["region", sales.date.dt.year])["revenue"].sum().unstack()\n'
                    'by_year["growth_pct"] = (by_year[2024] / by_year[2023] - 1) * 100\n'
                    'by_year = by_year.sort_values("growth_pct", ascending=False)\nprint(by_year.round(1).to_string())\n'
                    'print("fastest:", by_year.index[0], f"{by_year.growth_pct.iloc[0]:+.1f}%")',
                ],
            )
        ],
        answer=lambda r: f"**{_line(r, 'fastest')}** is the fastest-growing region (revenue 2024 vs 2023).\n\n```\n{_output(r)}\n```",
    ),
    Step(
        request="Plot monthly revenue by region and save the chart.",
        plan="1. Aggregate revenue by month and region\n2. Draw and save a line chart\n3. Tell the user where it is",
        hops=[
            (
                "Plot monthly revenue per region from sales as a line chart, save it as monthly_revenue.png, and show it.",
                [
                    'import matplotlib.pyplot as plt\nmonthly = sales.pivot_table(index="date", columns="region", values="revenue", aggfunc="sum")\n'
                    'ax = monthly.plot(figsize=(9, 4.5), title="Monthly revenue by region")\nax.set_ylabel("revenue")\nplt.tight_layout()\n'
                    'plt.savefig("monthly_revenue.png", dpi=110)\nplt.show()\nprint("saved: monthly_revenue.png")'
                ],
            )
        ],
        answer=lambda r: f"The chart is saved as `monthly_revenue.png` in the working folder.\n\nImage captured: {_artifacts(r)}",
    ),
    Step(
        request="Which product category has the best profit margin?",
        plan="1. Compute profit margin per category\n2. Report the best",
        hops=[
            (
                "Compute the profit margin (total profit / total revenue) per category from sales, sorted descending; print it and the best category.",
                [
                    'margin = (sales.groupby("category").profit.sum() / sales.groupby("category").revenue.sum()).sort_values(ascending=False)\n'
                    'print((margin * 100).round(1).to_string())\nprint("best:", margin.index[0], f"{margin.iloc[0]:.1%}")'
                ],
            )
        ],
        answer=lambda r: f"**{_line(r, 'best')}** has the best profit margin.\n\n```\n{_output(r)}\n```",
    ),
    Step(
        request="Do discounts drive more units sold?",
        plan="1. Compare units sold across discount levels\n2. Report the relationship",
        hops=[
            (
                "From sales, print the mean units per discount level and the correlation between discount and units overall.",
                [
                    'by_discount = sales.groupby("discount").units.mean().round(1)\nprint(by_discount.to_string())\n'
                    'print("correlation:", round(sales.discount.corr(sales.units), 2))'
                ],
            )
        ],
        answer=lambda r: (
            f"Yes, somewhat: the correlation between discount and units sold is **{_line(r, 'correlation')}**.\n\n"
            f"```\n{_output(r)}\n```\nDiscounts also lower the margin, so check both before widening them."
        ),
    ),
    Step(
        request="What was the best month overall, and how much of it came from Software?",
        plan="1. Find the month with the highest total revenue\n2. Compute Software's share of that month\n3. Report both",
        hops=[
            (
                "Find the month with the highest total revenue in sales; store it in best_month and print it with its revenue.",
                [
                    'totals = sales.groupby("date").revenue.sum()\nbest_month = totals.idxmax()\n'
                    'print("best month:", best_month.strftime("%B %Y"))\nprint("revenue:", f"{totals.max():,.0f}")'
                ],
            ),
            (
                "For best_month, compute the Software category's revenue and its share of that month's revenue; print both.",
                [
                    'month = sales[sales.date == best_month]\nsoftware = month.loc[month.category == "Software", "revenue"].sum()\n'
                    'print("software:", f"{software:,.0f}", f"({software / month.revenue.sum():.1%} of the month)")'
                ],
            ),
        ],
        answer=lambda r: (
            f"The best month was **{_line(r, 'best month')}** with revenue of {_line(r, 'revenue')}; Software brought in **{_line(r, 'software')}**."
        ),
    ),
    Step(
        request="Were there unusual months for any region?",
        plan="1. Total revenue per region and month\n2. Flag anomalies with the anomaly_detection plugin\n3. Report them",
        hops=[
            (
                "Total the revenue per region and month from sales into region_months, then call the anomaly_detection plugin "
                "on its revenue column (method iqr) and print the flagged rows.",
                [
                    'region_months = sales.groupby(["region", "date"], as_index=False).revenue.sum()\n'
                    'unusual = anomaly_detection(region_months, "revenue", method="iqr")\n'
                    'print("flagged:", len(unusual), "of", len(region_months))\nprint(unusual.head(5).to_string(index=False, float_format="{:.1f}".format))'
                ],
            )
        ],
        answer=lambda r: (
            f"The anomaly_detection plugin flagged **{_line(r, 'flagged')}** region-months as unusual (beyond 1.5 IQR).\n\n"
            f"```\n{_output(r)}\n```\nThe full list is saved as {_artifacts(r)}."
        ),
    ),
    Step(
        request="Summarize the key findings in three bullet points.",
        plan="1. Summarize the findings so far for the user",
        answer=lambda r: "",
    ),
]


class _Script:
    """Feeds the scripted server: the Planner's and the CodeGenerator's replies, step by step."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server
        self.findings: list[str] = []

    def queue(self, step: Step) -> None:
        for instruction, attempts in step.hops:
            self.server.enqueue("planner", planner_reply(instruction, plan=step.plan, current_plan_step=step.plan.splitlines()[0]))
            self.server.enqueue("code_generator", *(code_reply(code, thought="Use the sales DataFrame from the kernel.") for code in attempts))
        self.server.enqueue("planner", lambda messages: self._answer(step, messages))

    def _answer(self, step: Step, messages: list[dict[str, Any]]) -> str:
        if step.hops:
            reports = [m["content"] for m in messages if m["role"] == "user" and m["content"].startswith("CodeInterpreter:")]
            text = step.answer("\n".join(reports[-len(step.hops) :]))
            self.findings.append(text.split("\n")[0])
        else:
            # The growth, margin and discount findings (requests 2, 4 and 5) make the summary.
            text = "\n".join(f"- {self.findings[i]}" for i in (1, 3, 4) if i < len(self.findings)) or "- No findings yet."
        last = step.plan.splitlines()[-1]
        return planner_reply(text, send_to="User", plan=step.plan, current_plan_step=last)


def _summarize(messages: list[dict[str, Any]]) -> str:
    requests = re.findall(r"^User: (.+)$", last_user_text(messages), re.M)
    return summary_reply("Earlier the user asked: " + "; ".join(requests) if requests else "Earlier rounds analysed sales.csv.", [])


def bundled_project() -> Path:
    """The default project folder (from the checkout, or the installed package)."""
    # The checkout's project/ folder, or its copy inside an installed package (a data folder, not a
    # package: a user's copy of it should hold no __init__.py).
    checkout = Path(__file__).resolve().parents[2] / "project"
    installed = Path(__file__).resolve().parents[1] / "default_project"
    return checkout if (checkout / "taskweaver_config.yaml").is_file() else installed


def run_demo(*, project: str | None, plain: bool) -> int:
    """Run the scripted analysis end to end and print it like a chat."""
    target = Path(project) if project else Path(tempfile.mkdtemp(prefix="taskweaver-demo-"))
    if target.exists() and any(target.iterdir()) and project:
        raise TaskWeaverError(f"{target} is not empty; the demo writes a fresh project there, so name a new or empty folder")
    source = bundled_project()
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("sessions", "*.db*", ".chat_history"))
    rich = None if plain else RichConsole()
    renderer = rich or PlainConsole()
    say: Callable[[str], None] = rich.console.print if rich else functools.partial(print, flush=True)
    with ScriptedServer() as server:
        script = _Script(server)
        server.set_default("compression", _summarize)
        config = load_config(target, [f"llm.api_base={server.url}", "llm.api_key=demo-key", "llm.model=scripted-demo"])
        with Workspace(config) as workspace, workspace.new_session(listeners=[renderer]) as session:
            session.load_file(target / "sample_data" / "sales.csv")
            say(f"Demo project: {target}\nLoaded sales.csv into {session.working_dir}\n")
            for step in STEPS:
                script.queue(step)
                say(f"\nyou> {step.request}")
                session.ask(step.request)
            for context in session.contexts().values():
                context.wait_idle(timeout=10)
            usage = session.usage()
            say(
                f"\nDone: {len(session.conversation.rounds)} requests, {usage.calls} model calls. "
                f"Files are in {session.working_dir}; plots captured in {session.working_dir.parent / 'artifacts'}."
            )
    return 0
