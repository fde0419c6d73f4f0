"""The evaluation report: a Markdown table and JSON per case and setting, and one plot of score against uncached tokens.

Written to the report folder as `report.md`, `report.json` and `score_vs_tokens.png` once every
run has finished (the runs themselves are in `results.jsonl` as they end). The Markdown opens with
what a reader needs to trust it (`ReportAbout`): when it ran, the program's version, the command,
the project, the models that played the agent, the examiner and the judge, and what each setting
changes; with the scripted model it says that its scores measure cost, not quality. Its headline
keeps the runs that were played and scored apart from those that were not played, per setting and
per case, with the reasons once each: a mean counts only runs that were played and scored. Each run
links its stored session (written out as Markdown) and its transcript.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskweaver_lite import __version__
from taskweaver_lite.config.file import key_description
from taskweaver_lite.eval.matrix import Setting
from taskweaver_lite.eval.outcome import Outcome

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REPORT_MD, REPORT_JSON, REPORT_PLOT = "report.md", "report.json", "score_vs_tokens.png"
SCRIPTED_NOTE = (
    "**These scores measure cost, not quality.** The scripted model played every part (agent, examiner and judge): "
    "its answers come from code that really ran and its judge only checks that the numbers, quoted phrases or names of a "
    "statement were said, so a score shows that the code ran, not how well a model reasons. Compare the settings' tokens, cache and folds; point `llm`, "
    "`eval.examiner.llm` and `eval.judge.llm` at real models for scores that mean something."
)


@dataclass(frozen=True)
class ReportAbout:
    """What the report was made from: when, the command, the project, the three models, and whether they were scripted."""

    started: float
    command: str
    project: Path
    models: Mapping[str, str] = field(default_factory=dict)  # agent, examiner, judge -> "model at address"
    scripted: bool = False
    version: str = __version__  # the program's, so a report says what made it

    def to_dict(self) -> dict[str, Any]:
        """JSON shape in report.json."""
        return {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "version": self.version,
            "command": self.command,
            "project": str(self.project),
            "models": dict(self.models),
            "scripted": self.scripted,
        }


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
    not_played: int = 0  # runs with no score because they could not be played (a role left out, a model that could not play)
    failed: int = 0  # runs that failed or were skipped

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
                not_played=sum(o.status == "not played" for o in runs),
                failed=sum(o.status in ("failed", "skipped") for o in runs),
            )
        )
    return summaries


def write_report(folder: Path, outcomes: Sequence[Outcome], settings: Sequence[Setting], *, plot: bool = True, about: ReportAbout | None = None) -> list[Path]:
    """Write report.md, report.json and (with `plot`, when a run was scored) the PNG; the paths written."""
    summaries = summarize(outcomes, settings)
    markdown, data = folder / REPORT_MD, folder / REPORT_JSON
    plotted = plot and any(o.status == "scored" for o in outcomes)
    markdown.write_text(render_markdown(outcomes, summaries, settings=settings, about=about, plot=REPORT_PLOT if plotted else None), encoding="utf-8")
    payload = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "about": about.to_dict() if about else None,
        "settings": [{"name": s.name, "overrides": list(s.overrides)} for s in settings],
        "summary": [s.to_dict() for s in summaries],
        "runs": [o.to_dict() for o in outcomes],
    }
    data.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    written = [markdown, data]
    if plotted:
        written.append(plot_scores(folder / REPORT_PLOT, outcomes, summaries, scripted=bool(about and about.scripted)))
    return written


def render_markdown(
    outcomes: Sequence[Outcome],
    summaries: Sequence[SettingSummary],
    *,
    settings: Sequence[Setting] = (),
    about: ReportAbout | None = None,
    plot: str | None = None,
) -> str:
    """The report as Markdown: what it was made from, the headline (played and scored apart from not played), the runs, and why."""
    lines = ["# Evaluation report", "", *header_lines(about)]
    lines += ["## Headline", "", *setting_table(summaries), "", MEAN_NOTE, ""]
    lines += not_played_lines(outcomes)
    lines += ["## Per case", "", *case_table(outcomes, [s.setting for s in summaries]), ""]
    if settings:
        lines += ["## Settings", "", *(setting_line(s) for s in settings), ""]
    if plot:
        lines += [f"![Score against uncached prompt tokens per run, per setting]({plot})", ""]
    lines += ["## Runs", "", *run_table(outcomes)]
    unscored = [o for o in outcomes if o.status != "scored"]
    if unscored:
        lines += ["", "## Not scored", ""]
        lines += [f"- {o.case} @ {o.setting}: **{o.status}**: {_cell(o.reason)}" for o in unscored]
    return "\n".join(lines + note_lines(outcomes)) + "\n"


MEAN_NOTE = "A mean score counts only the runs that were played and scored; a run not played has no score and is in no mean."


def not_played_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """Each reason runs were not played, once, with the runs it kept from being played."""
    reasons: dict[str, list[str]] = {}
    for o in outcomes:
        if o.status == "not played":
            reasons.setdefault(_cell(o.reason), []).append(f"{o.case} @ {o.setting}")
    if not reasons:
        return []
    lines = ["### Not played, and why", ""]
    lines += [f"- {reason} ({len(runs)} run{'' if len(runs) == 1 else 's'}: {', '.join(runs)})" for reason, runs in reasons.items()]
    return [*lines, ""]


def case_table(outcomes: Sequence[Outcome], settings: Sequence[str]) -> list[str]:
    """One row per case, one column per setting: its score when played and scored, else what happened."""
    cases = list(dict.fromkeys(o.case for o in outcomes))
    by_run = {o.key: o for o in outcomes}
    lines = ["| case | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
    for case in cases:
        cells = [_verdict(by_run.get((case, setting))) for setting in settings]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return lines


def _verdict(outcome: Outcome | None) -> str:
    if outcome is None:
        return "-"
    return f"{outcome.score:.2f}" if outcome.status == "scored" and outcome.score is not None else outcome.status


def note_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """Each note once, with the cases it was said for (a note every case shares is not repeated per case)."""
    cases: dict[str, list[str]] = {}
    for o in outcomes:
        for note in o.notes:
            listed = cases.setdefault(_cell(note), [])
            if o.case not in listed:
                listed.append(o.case)
    if not cases:
        return []
    return ["", "## Notes", "", *(f"- {note} (case{'' if len(names) == 1 else 's'} {', '.join(names)})" for note, names in cases.items())]


def header_lines(about: ReportAbout | None) -> list[str]:
    """When it ran, the command, the project and the models; the scripted model's warning."""
    if about is None:
        return []
    named = set(about.models.values())
    if len(named) == 1 and len(about.models) > 1:
        models = f"{', '.join(list(about.models)[:-1])} and {list(about.models)[-1]}: {_cell(named.pop())}"
    else:
        models = ", ".join(f"{part} {_cell(model)}" for part, model in about.models.items()) or "-"
    lines = [
        f"- **Ran:** {time.strftime('%Y-%m-%d %H:%M %Z', time.localtime(about.started))}",
        f"- **Program:** taskweaver-lite {about.version}",
        f"- **Command:** `{about.command}`",
        f"- **Project:** `{about.project}`",
        f"- **Models:** {models}",
        "",
    ]
    return [*lines, SCRIPTED_NOTE, ""] if about.scripted else lines


def setting_line(setting: Setting) -> str:
    """One setting: each key it sets, with what that key means."""
    if not setting.overrides:
        return f"- **{setting.name}**: the project's settings as they are"
    keys = []
    for item in setting.overrides:
        key, _, value = item.partition("=")
        meaning = key_description(key.strip())
        keys.append(f"`{key.strip()}: {value}`" + (f" ({_cell(meaning)})" if meaning else ""))
    return f"- **{setting.name}**: " + "; ".join(keys)


def run_table(outcomes: Sequence[Outcome]) -> list[str]:
    """One row per run, with links to its stored session and its transcript (in the report folder)."""
    head = "| case | setting | score | rounds | prompt tokens | completion tokens | cached | uncached | fold calls | wall s | record |"
    return [head, "|---|---|---|---|---|---|---|---|---|---|---|", *(_row(o) for o in outcomes)]


def setting_table(summaries: Sequence[SettingSummary]) -> list[str]:
    """One row per setting: the mean over its played and scored runs, how many were, how many were not played or failed, its tokens."""
    lines = [
        "| setting | mean score | played and scored | not played | failed or skipped | prompt tokens | cached | uncached | fold calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        mean = "-" if s.mean_score is None else f"{s.mean_score:.2f}"
        lines.append(
            f"| {s.setting} | {mean} | {s.scored}/{s.runs} | {s.not_played} | {s.failed} | {s.prompt_tokens:,} | {s.cached_tokens:,} | "
            f"{s.uncached_tokens:,} | {s.fold_calls} |"
        )
    return lines


def _row(o: Outcome) -> str:
    if o.status == "scored":
        score = f"{o.score:.2f} ({o.points:g}/{o.max_points:g})"
    else:
        score = o.status
    links = [f"[{label}]({path})" for label, path in (("session", o.session_file), ("transcript", o.transcript)) if path]
    return (
        f"| {o.case} | {o.setting} | {score} | {o.rounds} | {o.prompt_tokens:,} | {o.completion_tokens:,} | "
        f"{o.cached_tokens:,} | {o.uncached_tokens:,} | {o.fold_calls} | {o.seconds:.1f} | {', '.join(links) or '-'} |"
    )


def _cell(text: str) -> str:
    """Text safe inside a Markdown line: one line, no table separators."""
    return " ".join(text.split()).replace("|", "\\|")


def plot_scores(path: Path, outcomes: Sequence[Outcome], summaries: Sequence[SettingSummary], *, scripted: bool = False) -> Path:
    """One PNG of `score_figure`."""
    score_figure(outcomes, summaries, scripted=scripted).savefig(path)
    return path


def score_figure(outcomes: Sequence[Outcome], summaries: Sequence[SettingSummary], *, scripted: bool = False) -> Figure:
    """Each setting's mean score against its mean uncached tokens per run, its runs drawn faintly behind; titled, every mark in the legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    figure = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    scored = [o for o in outcomes if o.status == "scored"]
    for number, summary in enumerate(summaries):
        runs = [o for o in scored if o.setting == summary.setting]
        if not runs or summary.mean_score is None:
            continue
        colour = f"C{number % 10}"
        axes.scatter([o.uncached_tokens for o in runs], [o.score or 0.0 for o in runs], color=colour, alpha=0.3, s=18)
        mean_tokens = sum(o.uncached_tokens for o in runs) / len(runs)
        axes.scatter([mean_tokens], [summary.mean_score], color=colour, s=70, label=f"{summary.setting} (mean of its runs)", edgecolors="black")
    _token_axis(axes, [o.uncached_tokens for o in scored])
    axes.set_xlabel("uncached prompt tokens per run")
    axes.set_ylabel("score (share of the points hit)")
    axes.set_ylim(-0.05, 1.05)
    axes.grid(alpha=0.3)
    runs_mark = Line2D([], [], marker="o", linestyle="", color="grey", alpha=0.3, markersize=5, label="one run (faint, its setting's colour)")
    handles, _ = axes.get_legend_handles_labels()
    axes.legend(handles=[*handles, runs_mark], title="setting", fontsize="small")
    cases = len({o.case for o in scored})
    title = f"Score against uncached prompt tokens: {cases} case(s), {len(summaries)} setting(s)"
    axes.set_title(title + ("\nscripted model: the scores measure cost, not quality" if scripted else ""), fontsize="medium")
    figure.tight_layout()
    return figure


def _token_axis(axes: Any, tokens: Sequence[int]) -> None:
    """A log axis when every run used tokens (a short case and a 50-round one differ a hundredfold), labelled 1,000 / 2,000 / 5,000 ...

    Minor ticks carry no label, and over more than two decades only the powers of ten do, so labels never overlap.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if not tokens or min(tokens) <= 0:
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        return
    axes.set_xscale("log")
    decades = math.log10(max(tokens) / min(tokens)) if max(tokens) > min(tokens) else 0.0
    axes.set_xlim(min(tokens) / 1.5, max(tokens) * 1.5)
    axes.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 2 else (1.0,)))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axes.xaxis.set_minor_formatter(NullFormatter())
