"""The store on its two backends: the same operations on the SQLite file (the baseline) and on PostgreSQL.

One run starts a private PostgreSQL server (Debian's binaries, as the tests do) and times, on both:
writing one event (one transaction, realistic rounds), loading a 200-round session, listing 100
sessions (everyone's and one owner's), a user's token checked the first time (scrypt) and again
(remembered), and taking a session's lease. Each PostgreSQL figure is printed with its ratio to SQLite.

    .venv/bin/python bench/team_store_bench.py [--rounds 200] [--sessions 100]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from store_bench import round_events

from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.events import RoundStarted
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.store.interface import Store
from taskweaver_lite.store.postgres import PostgresStore, close_pools
from taskweaver_lite.testing.postgres_cluster import running_cluster


def timed(action: Callable[[], object], times: int = 1) -> list[float]:
    """Seconds each of `times` calls of `action` took."""
    spent = []
    for _ in range(times):
        start = time.perf_counter()
        action()
        spent.append(time.perf_counter() - start)
    return spent


def lease_round_trip(store: Store) -> None:
    """Take a session's lease and free it again (what each request of a replica does)."""
    store.take_lease("big", "r1", seconds=10)
    store.release_lease("big", "r1")


def measure(store: Store, *, rounds: int, sessions: int) -> dict[str, float]:
    """The figures of one store, in milliseconds."""
    store.create_session("big", started=time.time(), owner="ana")
    writes: list[float] = []
    for index in range(1, rounds + 1):
        for event in round_events(index):
            writes += timed(lambda event=event: store.record("big", event))  # type: ignore[misc]
    for n in range(sessions):
        store.create_session(f"s{n}", started=time.time(), owner="ana" if n % 10 == 0 else "bob")
        store.record(f"s{n}", RoundStarted(Round(index=1, user_query=f"request {n}")))
    token = store.add_user("ana")
    store.user_for_token(token)  # warm the connection; the first check below uses a new token
    fresh = store.add_user("bob")
    writes.sort()
    return {
        "event write p50": statistics.median(writes) * 1000,
        "event write p95": writes[int(len(writes) * 0.95)] * 1000,
        f"load a {rounds}-round session": statistics.median(timed(lambda: store.load("big"), 5)) * 1000,
        f"list {sessions + 1} sessions": statistics.median(timed(store.list_sessions, 10)) * 1000,
        "list one owner's": statistics.median(timed(lambda: store.list_sessions(owner="ana"), 10)) * 1000,
        "token, first check (scrypt)": timed(lambda: store.user_for_token(fresh))[0] * 1000,
        "token, checked again": statistics.median(timed(lambda: store.user_for_token(fresh), 20)) * 1000,
        "take + release a lease": statistics.median(timed(lambda: lease_round_trip(store), 20)) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        sqlite = measure(SessionStore(Path(folder) / "sessions.db"), rounds=args.rounds, sessions=args.sessions)
    with running_cluster() as cluster:
        postgres = measure(PostgresStore(cluster.new_database()), rounds=args.rounds, sessions=args.sessions)
        close_pools()
    print(f"{'operation':<32} {'SQLite':>10} {'PostgreSQL':>12} {'ratio':>7}")
    for name, base in sqlite.items():
        print(f"{name:<32} {base:>8.2f}ms {postgres[name]:>10.2f}ms {postgres[name] / base:>6.2f}x")


if __name__ == "__main__":
    main()
