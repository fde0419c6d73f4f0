"""The evaluation report: a Markdown table and JSON per case and setting, and one plot of score against uncached tokens.

Written to the report folder as `report.md`, `report.json` and `score_vs_tokens.png` once every
run has finished (the runs themselves are in `results.jsonl` as they end).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskweaver_lite.eval.matrix import Setting
from taskweaver_lite.eval.outcome import Outcome

REPORT_MD, REPORT_JSON, REPORT_PLOT = "report.md", "report.json", "score_vs_tokens.png"


@dataclass(frozen=True)
class SettingSummary:
    """One setting over all its runs: mean score of the scored ones, and the tokens they used."""

    setting: str
    scored: int
    runs: int
    mean_score: float | None
    prompt_tokens: int
    uncached_tokens: int
    cached_tokens: int
    fold_calls: int

    def to_dict(self) -> dict[str, Any]:
        """JSON shape in report.json."""
        return dict(self.__dict__)


def summarize(outcomes: Sequence[Outcome], settings: Sequence[Setting]) -> list[SettingSummary]:
    """Per setting, in the order given."""
    summaries = []
    for setting in settings:
        runs = [o for o in outcomes if o.setting == setting.name]
        scored = [o for o in runs if o.status == "scored" and o.score is not None]
        summaries.append(
            SettingSummary(
                setting=setting.name,
                scored=len(scored),
                runs=len(runs),
                mean_score=round(sum(o.score or 0.0 for o in scored) / len(scored), 4) if scored else None,
                prompt_tokens=sum(o.prompt_tokens for o in runs),
                uncached_tokens=sum(o.uncached_tokens for o in runs),
                cached_tokens=sum(o.cached_tokens for o in runs),
                fold_calls=sum(o.fold_calls for o in runs),
            )
        )
    return summaries


def write_report(folder: Path, outcomes: Sequence[Outcome], settings: Sequence[Setting], *, plot: bool = True) -> list[Path]:
    """Write report.md, report.json and (with `plot`) the PNG; the paths written."""
    summaries = summarize(outcomes, settings)
    markdown, data = folder / REPORT_MD, folder / REPORT_JSON
    markdown.write_text(render_markdown(outcomes, summaries), encoding="utf-8")
    payload = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": [{"name": s.name, "overrides": list(s.overrides)} for s in settings],
        "summary": [s.to_dict() for s in summaries],
        "runs": [o.to_dict() for o in outcomes],
    }
    data.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    written = [markdown, data]
    if plot and any(o.status == "scored" for o in outcomes):
        written.append(plot_scores(folder / REPORT_PLOT, outcomes, summaries))
    return written


def render_markdown(outcomes: Sequence[Outcome], summaries: Sequence[SettingSummary]) -> str:
    """The report as Markdown: the runs, the settings, and what was skipped or failed and why."""
    lines = [
        "# Evaluation report",
        "",
        "| case | setting | score | rounds | prompt tokens | completion tokens | cached | uncached | fold calls | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(o) for o in outcomes]
    lines += ["", "## Per setting", "", "| setting | mean score | scored runs | prompt tokens | cached | uncached | fold calls |"]
    lines.append("|---|---|---|---|---|---|---|")
    for s in summaries:
        mean = "-" if s.mean_score is None else f"{s.mean_score:.2f}"
        lines.append(f"| {s.setting} | {mean} | {s.scored}/{s.runs} | {s.prompt_tokens:,} | {s.cached_tokens:,} | {s.uncached_tokens:,} | {s.fold_calls} |")
    unscored = [o for o in outcomes if o.status != "scored"]
    if unscored:
        lines += ["", "## Skipped or failed", ""]
        lines += [f"- {o.case} @ {o.setting}: **{o.status}**: {_cell(o.reason)}" for o in unscored]
    noted = [(o, note) for o in outcomes for note in o.notes]
    if noted:
        lines += ["", "## Notes", ""]
        lines += sorted({f"- {o.case}: {_cell(note)}" for o, note in noted})
    return "\n".join(lines) + "\n"


def _row(o: Outcome) -> str:
    if o.status == "scored":
        score = f"{o.score:.2f} ({o.points:g}/{o.max_points:g})"
    else:
        score = o.status
    return (
        f"| {o.case} | {o.setting} | {score} | {o.rounds} | {o.prompt_tokens:,} | {o.completion_tokens:,} | "
        f"{o.cached_tokens:,} | {o.uncached_tokens:,} | {o.fold_calls} | {o.seconds:.1f} |"
    )


def _cell(text: str) -> str:
    """Text safe inside a Markdown line: one line, no table separators."""
    return " ".join(text.split()).replace("|", "\\|")


def plot_scores(path: Path, outcomes: Sequence[Outcome], summaries: Sequence[SettingSummary]) -> Path:
    """One PNG: each setting's mean score against its mean uncached tokens per run, its runs drawn faintly behind."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for number, summary in enumerate(summaries):
        runs = [o for o in outcomes if o.setting == summary.setting and o.status == "scored"]
        if not runs or summary.mean_score is None:
            continue
        colour = f"C{number % 10}"
        axes.scatter([o.uncached_tokens for o in runs], [o.score or 0.0 for o in runs], color=colour, alpha=0.3, s=18)
        mean_tokens = sum(o.uncached_tokens for o in runs) / len(runs)
        axes.scatter([mean_tokens], [summary.mean_score], color=colour, s=70, label=summary.setting, edgecolors="black")
    if all(o.uncached_tokens > 0 for o in outcomes if o.status == "scored"):
        axes.set_xscale("log")  # a short case and a 50-round one differ a hundredfold
    axes.set_xlabel("uncached prompt tokens per run")
    axes.set_ylabel("score")
    axes.set_ylim(-0.05, 1.05)
    axes.grid(alpha=0.3)
    axes.legend(title="setting", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    return path
