"""A PostgreSQL outage as a replica lives it: each request's wait for its 503 while the store is down, and the time to the first success after the restart.

    .venv/bin/python bench/store_outage_bench.py [--outage 30]

One private PostgreSQL server; requests (`Store.ping`, the query /healthz makes) every 0.2 s from
two threads, as a replica's users and its load balancer send them. The same run measures the store
as shipped and, as the baseline, with its outage handling switched off (the connection pool alone:
each request waits for a connection until the pool gives up, and the pool reconnects on its own
back-off). Prints both and their ratios.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from taskweaver_lite.errors import StoreError
from taskweaver_lite.store import postgres
from taskweaver_lite.store.postgres import PostgresStore, close_pools
from taskweaver_lite.testing.postgres_cluster import PostgresCluster, running_cluster


@contextmanager
def _pool_alone() -> Iterator[None]:
    """The store without its outage handling: every request asks the pool, whatever happened before."""
    usable, found_down = postgres.Outage.usable, postgres.Outage.found_down
    postgres.Outage.usable = lambda self: True  # type: ignore[method-assign]
    postgres.Outage.found_down = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        postgres.Outage.usable, postgres.Outage.found_down = usable, found_down  # type: ignore[method-assign]


def _measure(cluster: PostgresCluster, outage: float) -> tuple[float, float, float]:
    """(median wait for a refusal, longest wait, seconds from the restart to the first success)."""
    store = PostgresStore(cluster.new_database())
    store.ping()
    waits: list[float] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                store.ping()
            except StoreError:
                waits.append(time.monotonic() - began)
            stop.wait(0.2)

    cluster.stop()
    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(outage)
    stop.set()
    for thread in threads:
        thread.join()
    cluster.start_again()
    restarted = time.monotonic()
    while True:
        try:
            store.ping()
            break
        except StoreError:
            time.sleep(0.1)
    back = time.monotonic() - restarted
    store.close()
    close_pools()
    return statistics.median(waits), max(waits), back


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=30.0, help="seconds the store is down")
    args = parser.parse_args()
    with running_cluster() as cluster:
        with _pool_alone():
            base = _measure(cluster, args.outage)
        ours = _measure(cluster, args.outage)
    print(f"outage of {args.outage:g} s       median wait for a 503   longest wait   back after the restart")
    print(f"pool alone (baseline)  {base[0]:8.2f} s {base[1]:19.2f} s {base[2]:12.2f} s")
    print(f"as shipped             {ours[0]:8.2f} s {ours[1]:19.2f} s {ours[2]:12.2f} s")
    print(f"ratio (shipped / baseline): wait {ours[0] / base[0]:.3f}x, back {ours[2] / base[2]:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
