"""The documentation's evaluation table (docs/eval.md), regenerated from a run of the shipped cases rather than typed.

Runs `taskweaver-lite eval project/eval_cases --scripted --matrix project/eval_cases/matrix.yaml
--jobs 2` on a copy of the project (or reads an earlier report folder with `--from`), then writes:

- the run's two tables, rendered by the report's own code, between the `eval-table` marker
  comments in docs/eval.md (nothing else in the file changes);
- its `report.json` to docs/eval-report.json (the test that the page and the run agree reads it);
- its plot to docs/eval-score-vs-tokens.png.

    python bench/eval_table.py [--from REPORT_DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from taskweaver_lite.eval.outcome import Outcome
from taskweaver_lite.eval.report import REPORT_JSON, REPORT_PLOT, SettingSummary, run_table, setting_table

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "eval.md"
SAVED_REPORT = REPO / "docs" / "eval-report.json"
SAVED_PLOT = REPO / "docs" / "eval-score-vs-tokens.png"
BEGIN, END = "<!-- eval-table:begin (bench/eval_table.py writes this table) -->", "<!-- eval-table:end -->"
COMMAND = ["eval", "project/eval_cases", "--scripted", "--matrix", "project/eval_cases/matrix.yaml", "--jobs", "2"]


def tables(report: dict[str, object]) -> str:
    """The runs and per-setting tables of a report.json, as report.md shows them."""
    runs = [Outcome.from_dict(run) for run in report["runs"]]  # type: ignore[attr-defined]
    summaries = [SettingSummary(**summary) for summary in report["summary"]]  # type: ignore[attr-defined]
    return "\n".join([*run_table(runs), "", *setting_table(summaries)])


def replaced(text: str, table: str) -> str:
    """`text` with the block between the markers replaced by `table`; ValueError when the markers are missing."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"docs/eval.md has no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def run_eval(folder: Path) -> Path:
    """Run the shipped cases on a copy of the project; the report folder."""
    project = Path(shutil.copytree(REPO / "project", folder / "project", ignore=shutil.ignore_patterns("sessions", "eval", "*.db*")))
    command = [sys.executable, "-m", "taskweaver_lite", *COMMAND, "-p", str(project), "-o", str(folder / "report")]
    subprocess.run(command, cwd=folder, check=True, stdout=subprocess.DEVNULL)
    return folder / "report"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", metavar="REPORT_DIR", help="an earlier `eval` report folder of the same command, instead of a new run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        report_dir = Path(args.source) if args.source else run_eval(Path(folder))
        report = json.loads((report_dir / REPORT_JSON).read_text(encoding="utf-8"))
        report["about"] = None  # the run's machine paths and time are not the page's
        for run in report["runs"]:  # nor its files: the sessions and transcripts stay in the run's folder
            run["session_file"] = run["transcript"] = ""
        SAVED_REPORT.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        shutil.copyfile(report_dir / REPORT_PLOT, SAVED_PLOT)
    PAGE.write_text(replaced(PAGE.read_text(encoding="utf-8"), tables(report)), encoding="utf-8")
    print(tables(report))
    print(f"written: docs/{PAGE.name} (between the eval-table markers), {SAVED_REPORT.relative_to(REPO)}, {SAVED_PLOT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
