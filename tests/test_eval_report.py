"""The evaluation report a user can hand on: what it was made from, what each setting means, a readable plot, the documentation's table from a run."""

from __future__ import annotations

import importlib.util
import json
import time
from itertools import combinations
from pathlib import Path

import pytest
from helpers import REPO

from taskweaver_lite.eval.matrix import Setting
from taskweaver_lite.eval.outcome import Outcome
from taskweaver_lite.eval.report import REPORT_MD, REPORT_PLOT, ReportAbout, score_figure, summarize, write_report

pytestmark = pytest.mark.unit

SETTINGS = (
    Setting("off", ("planner.prompt_compression=false", "code_generator.prompt_compression=false")),
    Setting("(1,1)", ("round_compressor.rounds_to_compress=1", "round_compressor.rounds_to_retain=1")),
    Setting("project"),
)
# Uncached tokens spread as the shipped cases spread them: a one-request case and a fifty-round one.
RUNS = [
    Outcome(
        case=case,
        setting=setting.name,
        kind="taskweaver",
        status="scored",
        score=1.0,
        points=1,
        max_points=1,
        prompt_tokens=3 * tokens,
        cached_tokens=2 * tokens,
    )
    for setting, scale in zip(SETTINGS, (1.0, 1.2, 1.5), strict=True)
    for case, tokens in (("mean_units", int(2_015 * scale)), ("sales_basics", int(2_776 * scale)), ("running_sum", int(37_526 * scale)))
]
ABOUT = ReportAbout(
    started=time.mktime((2026, 11, 27, 3, 40, 0, 0, 0, -1)),
    command="taskweaver-lite eval project/eval_cases --scripted --matrix project/eval_cases/matrix.yaml",
    project=Path("/work/project"),
    models={"agent": "the scripted model", "examiner": "the scripted model", "judge": "the scripted model"},
    scripted=True,
)


def test_report_md_says_when_the_command_the_project_the_models_what_each_setting_means_and_links_the_plot(tmp_path: Path) -> None:
    not_played = Outcome(case="calc_median", setting="off", kind="taskweaver", status="not played", reason="the model could not play this case")
    write_report(tmp_path, [*RUNS, not_played], SETTINGS, about=ABOUT)
    text = (tmp_path / REPORT_MD).read_text(encoding="utf-8")
    assert "- **Ran:** 2026-11-27 03:40" in text
    assert f"- **Command:** `{ABOUT.command}`" in text and "- **Project:** `/work/project`" in text
    assert "- **Models:** agent, examiner and judge: the scripted model" in text
    assert "**These scores measure cost, not quality.**" in text
    assert "- **off**: `planner.prompt_compression: false` (fold this role's older rounds by its strategy" in text
    assert "`round_compressor.rounds_to_retain: 1` (the latest rounds kept as they were)" in text
    assert "- **project**: the project's settings as they are" in text
    assert f"]({REPORT_PLOT})" in text and (tmp_path / REPORT_PLOT).exists()
    assert "| calc_median | off | not played |" in text and "- calc_median @ off: **not played**: the model could not play this case" in text
    assert "| off | 1.00 | 3/4 |" in text, "a run not played counts in no mean score"


def test_with_real_models_there_is_no_cost_only_warning(tmp_path: Path) -> None:
    real = ReportAbout(started=ABOUT.started, command="taskweaver-lite eval cases", project=Path("/p"), models={"agent": "`gpt-4o`", "judge": "`o3`"})
    write_report(tmp_path, RUNS, SETTINGS, about=real, plot=False)
    text = (tmp_path / REPORT_MD).read_text(encoding="utf-8")
    assert "- **Models:** agent `gpt-4o`, judge `o3`" in text and "measure cost" not in text


def test_the_plot_has_a_title_tick_labels_that_do_not_overlap_and_every_mark_in_its_legend() -> None:
    figure = score_figure(RUNS, summarize(RUNS, SETTINGS), scripted=True)
    [axes] = figure.axes
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    assert axes.get_title().startswith("Score against uncached prompt tokens: 3 case(s), 3 setting(s)")
    for axis in (axes.xaxis, axes.yaxis):
        labels = [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text() and _inside(t, axes, renderer)]
        assert len(labels) >= 2, "the axis is labelled"
        boxes = [t.get_window_extent(renderer) for t in labels]
        overlapping = [(a.get_text(), b.get_text()) for (a, p), (b, q) in combinations(zip(labels, boxes, strict=True), 2) if p.overlaps(q)]
        assert overlapping == [], overlapping
    legend = axes.get_legend()
    assert legend is not None
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["off (mean of its runs)", "(1,1) (mean of its runs)", "project (mean of its runs)", "one run (faint, its setting's colour)"]


def _inside(label: object, axes: object, renderer: object) -> bool:
    """Whether a tick label sits along the axes (matplotlib keeps labels for ticks outside the view, unseen)."""
    box = label.get_window_extent(renderer)  # type: ignore[attr-defined]
    area = axes.get_window_extent(renderer)  # type: ignore[attr-defined]
    return bool(area.x0 - 1 <= (box.x0 + box.x1) / 2 <= area.x1 + 1 or area.y0 - 1 <= (box.y0 + box.y1) / 2 <= area.y1 + 1)


def test_the_readme_eval_table_is_the_one_the_saved_run_renders() -> None:
    spec = importlib.util.spec_from_file_location("eval_table", REPO / "bench" / "eval_table.py")
    assert spec is not None and spec.loader is not None
    eval_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_table)
    report = json.loads((REPO / "docs" / "eval-report.json").read_text(encoding="utf-8"))
    readme = (REPO / "docs" / "eval.md").read_text(encoding="utf-8")
    assert eval_table.replaced(readme, eval_table.tables(report)) == readme, "docs/eval.md's table differs from docs/eval-report.json: run bench/eval_table.py"
    assert all(run["status"] == "scored" for run in report["runs"]), "the shipped cases are all played by the scripted model"
