"""Benchmark of plugins: what they cost a session's start, and what selection saves in the prompt.

    .venv/bin/python bench/plugin_bench.py [--starts 5]

Measures, side by side in one run: the time from opening a session's executor to the end of its
first cell (`x = 1`) with 0 and with 20 plugins (the 0-plugin run is the baseline; the target is
at most 50 ms more), and the tokens of the CodeGenerator's plugin block with 100 plugins, all of
them vs the top 3 chosen for a step (`code_generator.auto_plugin_selection`). Medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.plugins.catalog import discover
from taskweaver_lite.plugins.prompt import render_block, select
from taskweaver_lite.records.plugin_spec import PluginSpec

TOPICS = [
    ("warehouse", "Pull rows from the team's warehouse table for a date range"),
    ("forecast", "Forecast a numeric series a number of periods ahead with exponential smoothing"),
    ("anomaly", "Flag anomalies in a numeric column by z-score"),
    ("churn", "Score customer churn risk from activity columns"),
    ("chart", "Draw a chart in the company style and save it as PNG"),
    ("geocode", "Turn addresses into latitude and longitude"),
    ("currency", "Convert amounts between currencies at a given date's rate"),
    ("holiday", "Mark public holidays in a date column for a country"),
    ("sentiment", "Score the sentiment of free-text survey answers"),
    ("dedupe", "Remove near-duplicate rows by fuzzy matching of names"),
]
# Each step with the topic of the plugins that fit it, to count how many picks are relevant.
STEPS = [
    ("Forecast monthly revenue for the next 6 periods", "forecast"),
    ("Find anomalies in the revenue column of sales", "anomaly"),
    ("Convert the EUR amounts to USD at each order's date", "currency"),
    ("Score the sentiment of the survey comments and plot it", "sentiment"),
]
TOP_K = 3


def write_plugins(folder: Path, count: int) -> None:
    """`count` plugins in TaskWeaver's format, each with three parameters, a return and an example."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        topic, description = TOPICS[i % len(TOPICS)]
        name = f"{topic}_{i}"
        (folder / f"{name}.yaml").write_text(
            textwrap.dedent(f"""\
                name: {name}
                description: {description} (variant {i}).
                examples: result = {name}(df, "value")
                parameters:
                  - {{name: df, type: pandas.DataFrame, required: true, description: the input rows}}
                  - {{name: column, type: str, required: true, description: the {topic} column to use}}
                  - {{name: limit, type: int, required: false, default: 10, description: at most this many results}}
                returns:
                  - {{name: result, type: pandas.DataFrame, description: the {topic} result}}
                """),
            encoding="utf-8",
        )
        (folder / f"{name}.py").write_text(
            "from taskweaver.plugin import Plugin, register_plugin\n\n\n@register_plugin\nclass P(Plugin):\n"
            "    def __call__(self, df, column, limit=10):\n        return df.head(limit)\n",
            encoding="utf-8",
        )


def first_cell_seconds(root: Path, plugins: tuple[PluginSpec, ...], run: int) -> tuple[float, float]:
    """(kernel ready, first cell done) in seconds from creating the executor."""
    started = time.perf_counter()
    with KernelExecutor(root / f"s-{len(plugins)}-{run}", config=ExecutionConfig(timeout=60), plugins=plugins) as executor:
        executor.wait_ready()
        ready = time.perf_counter() - started
        result = executor.run("x = 1")
        done = time.perf_counter() - started
    assert result.success, result.prompt_text()
    return ready, done


def start_costs(starts: int) -> None:
    """Ready and first-cell times with 0 and 20 plugins, interleaved so drift hits both alike."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_plugins(root / "project" / "plugins", 20)
        twenty = discover(root / "project").enabled
        assert len(twenty) == 20
        times: dict[int, list[tuple[float, float]]] = {0: [], 20: []}
        first_cell_seconds(root, (), -1)  # warm the file cache for both
        for run in range(starts):
            times[0].append(first_cell_seconds(root, (), run))
            times[20].append(first_cell_seconds(root, twenty, run))
    ready = {n: statistics.median(t[0] for t in values) * 1000 for n, values in times.items()}
    done = {n: statistics.median(t[1] for t in values) * 1000 for n, values in times.items()}
    print(f"kernel ready:          0 plugins {ready[0]:7.1f} ms   20 plugins {ready[20]:7.1f} ms   ratio {ready[20] / ready[0]:.3f}x")
    print(f"first cell done:       0 plugins {done[0]:7.1f} ms   20 plugins {done[20]:7.1f} ms   ratio {done[20] / done[0]:.3f}x")
    print(f"delay of the first cell by 20 plugins: {done[20] - done[0]:+.1f} ms (target <= 50 ms)")


def prompt_tokens() -> None:
    """Tokens of the plugin block with 100 plugins: all of them vs the top 3 for each step."""
    with tempfile.TemporaryDirectory() as tmp:
        write_plugins(Path(tmp) / "plugins", 100)
        specs = discover(Path(tmp)).enabled
    tokenizer = get_tokenizer()
    everything = tokenizer.count(render_block(specs))
    picks = {step: select(specs, step, top_k=TOP_K) for step, _ in STEPS}
    chosen = [tokenizer.count(render_block(picked)) for picked in picks.values()]
    relevant = sum(p.name.startswith(topic) for step, topic in STEPS for p in picks[step])
    started = time.perf_counter()
    for step, _ in STEPS * 25:
        select(specs, step, top_k=TOP_K)
    per_selection = (time.perf_counter() - started) / (len(STEPS) * 25) * 1000
    median = statistics.median(chosen)
    print(f"plugin block, 100 plugins: all {everything:,} tokens; top {TOP_K} per step {median:,.0f} tokens (median of {len(STEPS)} steps)")
    print(f"ratio selected / all: {median / everything:.3f}; selection itself {per_selection:.2f} ms per call, offline")
    print(f"picks of the step's own topic: {relevant} of {TOP_K * len(STEPS)}")


def main() -> None:
    """Run both measures and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--starts", type=int, default=5, help="kernel starts per plugin count")
    args = parser.parse_args()
    prompt_tokens()
    start_costs(args.starts)


if __name__ == "__main__":
    main()
