"""`taskweaver-lite eval CASE...`: run evaluation cases under one setting or a matrix, and write the report.

Progress goes to stderr as each run ends; the Markdown report is printed at the end and written,
with report.json and the plot, to the report folder (default PROJECT_DIR/eval/<timestamp>/).
The exit code is 0 when every run was scored, 1 when some were skipped or failed (the report says why).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from taskweaver_lite.errors import ConfigError

if TYPE_CHECKING:
    from taskweaver_lite.eval.report import ReportAbout
    from taskweaver_lite.eval.runner import EvalPlan


def add_eval_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `eval` sub-command's arguments."""
    parser = commands.add_parser("eval", help="score TaskWeaver auto_eval cases and DSEval problem sets: score, tokens and cache per setting")
    parser.add_argument("cases", nargs="+", metavar="CASE", help="a case YAML, a case folder, a DSEval .py problem set, or a folder of them")
    parser.add_argument("-p", "--project", dest="project", default=None, metavar="PROJECT_DIR", help="project folder (default: ./project)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key for every run (value parsed as YAML); repeatable",
    )
    parser.add_argument("--matrix", metavar="FILE", help="YAML: setting name -> config keys; every case runs under every setting")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="runs (sessions) at once (default 1)")
    parser.add_argument("--resume", action="store_true", help="continue the report folder (-o, else the newest in PROJECT_DIR/eval/): skip runs already scored")
    parser.add_argument("-o", "--output", metavar="REPORT_DIR", help="report folder (default: PROJECT_DIR/eval/<timestamp>/)")
    parser.add_argument("--scripted", action="store_true", help="answer every model call with the scripted model of the shipped cases (offline, no key)")


def run_eval_command(args: argparse.Namespace) -> int:
    """Run the cases, print the report, and say where it was written."""
    from taskweaver_lite.cli.project import project_dir
    from taskweaver_lite.eval.cases import load_cases
    from taskweaver_lite.eval.matrix import DEFAULT_SETTING, Setting, load_matrix
    from taskweaver_lite.eval.report import REPORT_MD, write_report
    from taskweaver_lite.eval.runner import EvalPlan, run_eval

    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: give at least 1")
    project = project_dir(args)
    settings = load_matrix(Path(args.matrix)) if args.matrix else (Setting(DEFAULT_SETTING),)
    report_dir = report_folder(project, output=args.output, resume=args.resume)
    cases = load_cases(args.cases)
    started = time.time()
    with _models(args.scripted) as overrides:
        plan = EvalPlan(project, report_dir, settings, overrides=(*overrides, *args.overrides), jobs=args.jobs, resume=args.resume)
        about = report_about(plan, started=started, scripted=args.scripted)
        outcomes = run_eval(cases, plan, progress=lambda line: print(line, file=sys.stderr, flush=True))
    written = write_report(report_dir, outcomes, settings, about=about)
    print((report_dir / REPORT_MD).read_text(encoding="utf-8"), end="")
    print(f"eval: report written: {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0 if all(o.status == "scored" for o in outcomes) else 1


def report_about(plan: EvalPlan, *, started: float, scripted: bool) -> ReportAbout:
    """What the report says it was made from: the command as typed, the project, and the agent's, examiner's and judge's models."""
    from taskweaver_lite.config.file import load_config
    from taskweaver_lite.eval.report import ReportAbout
    from taskweaver_lite.eval.runner import eval_llm

    config = load_config(plan.project, list(plan.overrides))
    if scripted:
        models = dict.fromkeys(("agent", "examiner", "judge"), "the scripted model (taskweaver_lite/testing/eval_script.py)")
    else:
        parts = {"agent": config.llm, "examiner": eval_llm(config, "examiner"), "judge": eval_llm(config, "judge")}
        models = {part: f"`{llm.model}` at {llm.api_base or 'the OpenAI API'}" for part, llm in parts.items()}
    command = shlex.join(["taskweaver-lite", *sys.argv[1:]])
    return ReportAbout(started=started, command=command, project=plan.project.resolve(), models=models, scripted=scripted)


def report_folder(project: Path, *, output: str | None, resume: bool) -> Path:
    """-o's folder; with --resume and no -o, the newest report under PROJECT_DIR/eval/; else a new timestamped one."""
    if output is not None:
        return Path(output)
    reports = project / "eval"
    if resume:
        earlier = sorted(p for p in reports.glob("*") if (p / "results.jsonl").exists()) if reports.is_dir() else []
        if not earlier:
            raise ConfigError(f"--resume: no earlier report with results.jsonl in {reports}; pass -o REPORT_DIR")
        return earlier[-1]
    return reports / time.strftime("%Y%m%d-%H%M%S")


@contextlib.contextmanager
def _models(scripted: bool) -> Iterator[tuple[str, ...]]:
    """With --scripted, a scripted server for every model call (its address as overrides); else nothing."""
    if not scripted:
        yield ()
        return
    from taskweaver_lite.testing.eval_script import scripted_eval_server

    server = scripted_eval_server()
    try:
        yield (f"llm.api_base={server.url}", "llm.api_key=scripted", "llm.model=scripted")
    finally:
        server.stop()
