"""Store bench: write latency per event (synchronous=NORMAL vs FULL), loading a 500-round session, size per round.

Each figure is printed beside a baseline measured in the same run: a bare SQLite insert of the
same JSON (one row, one transaction, same journal settings) for writes, reading and parsing the raw
post JSON for the load, and the JSON of the rounds themselves for the size.

    .venv/bin/python bench/store_bench.py [--rounds 500] [--write-rounds 100]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from taskweaver_lite.records.conversation import Plan, Post, Round
from taskweaver_lite.records.events import Event, ModelCalled, PostAdded, RoundEnded, RoundStarted
from taskweaver_lite.records.execution import ExecutionResult, Variable, VariableChanges
from taskweaver_lite.store.database import SessionStore, Synchronous

PLAN = Plan(init_plan="1. load the data\n2. compute the growth per region\n3. report", plan="1. load\n2. compute\n3. report", current_plan_step="2. compute")
CODE = "import pandas as pd\ndf = pd.read_csv('sales.csv')\ngrowth = df.groupby('region')['revenue'].pct_change()\n" * 3
VARIABLES = tuple(Variable(f"var_{n}", "pandas.DataFrame", f"shape ({n * 10}, 4); columns: region, month, revenue, units") for n in range(8))


def round_events(index: int) -> Iterator[Event]:
    """One realistic round: request, a delegated step, a cell with output, the answer, three model calls."""
    rnd = Round(index=index, user_query=f"Request {index}: which region grew fastest last quarter, and by how much?")
    yield RoundStarted(rnd)
    result = ExecutionResult(
        code=CODE,
        success=True,
        stdout="region  growth\n" + "north   0.12\n" * 30,
        result="<DataFrame 4 rows>",
        variables=VARIABLES,
        changes=VariableChanges(created=("growth",)),
        execution_count=index,
        elapsed=0.05,
    )
    posts = [
        Post("User", "Planner", rnd.user_query),
        Post(
            "Planner",
            "CodeInterpreter",
            "Compute revenue growth per region for the last quarter.",
            plan=PLAN,
            reply_json=json.dumps({"response": PLAN.to_dict()}),
        ),
        Post(
            "CodeInterpreter",
            "Planner",
            "The code ran successfully.\n```python\n" + CODE + "```",
            thought="Group by region.",
            code=CODE,
            execution=result,
            reply_json=json.dumps({"code": CODE}),
        ),
        Post("Planner", "User", "North grew fastest: +12% over the quarter.", plan=PLAN, reply_json=json.dumps({"response": PLAN.to_dict()})),
    ]
    for number, post in enumerate(posts):
        rnd.posts.append(post)
        yield PostAdded(rnd, post)
        if number < 3:
            yield ModelCalled("planner" if number % 2 == 0 else "code_generator", 2_400, 180, 1.2, ok=True)
    rnd.state = "finished"
    yield RoundEnded(rnd)


def event_json(event: Event) -> str:
    """What the baseline writes for an event: the same JSON the store keeps."""
    if isinstance(event, PostAdded):
        return json.dumps(event.post.to_dict())
    if isinstance(event, (RoundStarted, RoundEnded)):
        return json.dumps({k: v for k, v in event.round.to_dict().items() if k != "posts"})
    return json.dumps(vars(event), default=str)


def time_store_writes(folder: Path, synchronous: Synchronous, rounds: int) -> list[float]:
    store = SessionStore(folder / f"store-{synchronous}.db", synchronous=synchronous)
    store.create_session("bench", started=time.time())
    latencies = []
    for index in range(1, rounds + 1):
        for event in round_events(index):
            started = time.perf_counter()
            store.record("bench", event)
            latencies.append(time.perf_counter() - started)
    store.close()
    return latencies


def time_bare_writes(folder: Path, synchronous: str, rounds: int) -> list[float]:
    db = sqlite3.connect(folder / f"bare-{synchronous}.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, data TEXT NOT NULL)")
    latencies = []
    for index in range(1, rounds + 1):
        for event in round_events(index):
            started = time.perf_counter()
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO events (data) VALUES (?)", (event_json(event),))
            db.execute("COMMIT")
            latencies.append(time.perf_counter() - started)
    db.close()
    return latencies


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.3f} ms"


def main() -> None:
    """Run the measurements and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500, help="rounds in the session that is loaded")
    parser.add_argument("--write-rounds", type=int, default=100, help="rounds written per durability setting")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"Write latency per event ({args.write_rounds} rounds, 9 events each; WAL, one transaction per event)")
        print(f"{'synchronous':<12}{'median':>12}{'p95':>12}{'bare median':>14}{'vs bare':>9}")
        medians = {}
        for synchronous in ("NORMAL", "FULL"):
            ours = time_store_writes(folder, synchronous, args.write_rounds)
            bare = time_bare_writes(folder, synchronous, args.write_rounds)
            medians[synchronous] = statistics.median(ours)
            p95 = statistics.quantiles(ours, n=20)[-1]
            ratio = statistics.median(ours) / statistics.median(bare)
            print(f"{synchronous:<12}{ms(statistics.median(ours)):>12}{ms(p95):>12}{ms(statistics.median(bare)):>14}{ratio:>8.2f}x")
        print(f"FULL / NORMAL median: {medians['FULL'] / medians['NORMAL']:.1f}x  (the store uses NORMAL)")

        path = folder / "load.db"
        store = SessionStore(path)
        store.create_session("big", started=time.time())
        round_json = 0
        for index in range(1, args.rounds + 1):
            events = list(round_events(index))
            for event in events:
                store.record("big", event)
            started_event = events[0]
            assert isinstance(started_event, RoundStarted)  # its round is the whole round once recorded
            round_json += len(json.dumps(started_event.round.to_dict()).encode())
        loads, replays, raws = [], [], []
        for _ in range(5):
            started = time.perf_counter()
            stored = store.load(store.resolve("last"))
            loads.append(time.perf_counter() - started)
            started = time.perf_counter()
            cells = store.successful_cells("big")
            replays.append(time.perf_counter() - started)
            started = time.perf_counter()
            with sqlite3.connect(path) as raw:
                [json.loads(row[0]) for row in raw.execute("SELECT data FROM posts WHERE session_id = 'big' ORDER BY seq")]
            raws.append(time.perf_counter() - started)
        assert len(stored.rounds) == args.rounds and len(cells) == args.rounds
        store.close()  # checkpoints the WAL into the file
        size = path.stat().st_size
        print()
        print(f"Resume of a {args.rounds}-round session ({args.rounds * 4} posts), excluding the kernel replay; median of 5")
        print(f"{'load (rounds rebuilt)':<34}{ms(statistics.median(loads)):>12}   vs raw JSON read {statistics.median(loads) / statistics.median(raws):.2f}x")
        print(f"{'successful_cells (replay list)':<34}{ms(statistics.median(replays)):>12}")
        print(f"{'raw SELECT + json.loads':<34}{ms(statistics.median(raws)):>12}")
        print()
        print(
            f"Size: {size / 1024:,.0f} KiB for {args.rounds} rounds = {size / args.rounds / 1024:.1f} KiB per round "
            f"({size / round_json:.2f}x the rounds' JSON, {round_json / args.rounds / 1024:.1f} KiB)"
        )


if __name__ == "__main__":
    main()
