"""The team service under load and under kills, in one run: today's single SQLite server against one and two replicas on PostgreSQL.

Load: N sessions at once (10, 20, 40), each sending `--requests` requests in turn; each request has
the Planner delegate `x = 1`, the cell run, the Planner answer (three model calls, the scripted
model waiting 50 ms before each). Latency as in serve_bench.py: from the moment the model's last
reply of a request has been sent whole to its `answer` event reaching the client (what the server
adds), p95; and requests per second over the whole load. Configurations:

    sqlite       one `serve`, the project's SQLite file, local kernels (today)
    pg-local     one `serve` on PostgreSQL with local kernels (serve.single_replica): the store's cost alone
    pg-1         one `serve` replica on PostgreSQL, kernels on a gateway: `taskweaver-lite gateway` (each kernel
                 in its sandbox; `--gateway plain`: a plain `jupyter kernelgateway`)
    pg-2         two replicas on that store and gateway; request r of session n goes to replica (n + r) % 2,
                 as a round-robin proxy without sticky sessions would send it: every request moves its session
    pg-2-sticky  the same two replicas, each session kept on one of them (replica n % 2) as the shipped nginx
                 keeps it (a consistent hash of the session id in the path)
    pg-2-sticky-before  as pg-2-sticky, the replicas running the taskweaver-lite of `--before` (a source tree,
                 e.g. `git worktree add /tmp/before <commit>`) on a database of their own: a change
                 measured against the code before it in the same run

Each load begins with a warm-up, not measured: every session's first WARM_UP requests, which reach
each replica its load uses (one when kept in place, both round robin), so what is measured is a
service that has held its sessions a while; the first load of a session on a replica, paid once per
session, is counted by the replicas' load histogram should one happen during the load. Every
configuration warms up with as many requests, so each load times the same rounds of its sessions,
and as many folds (a role's rounds are folded as they gather: a load that began a round later
would time a different number of them). `--rounds N` loads each configuration
N times, the configurations taking turns, and sums them: a shared machine whose load drifts weighs on
each alike. The replicas' targets compare each figure with the SQLite server's at the same session
count in the same run: CPU per answer at most 1.3x kept in place and 2x round robin, answers per
second kept in place at least 0.8x.

The loads run with the shipped `serve.lease_timeout` (each held lease renewed every third of it);
the kills with `--lease`.

Kills (`--kills K`): a request whose cell sleeps runs on one replica; once its cell runs, the replica
is killed (SIGKILL) and a new one started in its place; the other replica is asked again until it
answers. Reported: the time from the kill to that answer (it includes waiting out
`serve.lease_timeout`, set by `--lease`), the time from the lease running out to the answer, what
loading a session costs (the replicas' own histogram of it), and stored events lost: every event the
store held before the kill is read again after it, by id and content.

Statements (`--statements`): PostgreSQL counts every statement the service sent during each timed
load (pg_stat_statements, loaded into the private cluster for the run); each PostgreSQL configuration
then lists them per answer, most frequent first: the profile of an answer's round trips.

    python bench/team_bench.py [--sessions 10,20,40] [--requests 5] [--kills 20] [--lease 3] [--gateway sandbox|plain] [--rounds N] [--statements]
                               [--before SOURCE_TREE]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from taskweaver_lite.config.settings import ServeConfig
from taskweaver_lite.kernel.gateway.provisioner import SESSION_ROUTE
from taskweaver_lite.testing.kernel_gateway import Gateway, kernel_gateway, sandbox_gateway
from taskweaver_lite.testing.postgres_cluster import PostgresCluster, running_cluster
from taskweaver_lite.testing.replicas import ServeProcess, write_team_project
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply

LATENCY = 0.05
WARM_UP = 2  # requests per session before the timing: round robin over two replicas, one on each


class Model:
    """Planner: delegate (or run RUN<<code>>), then answer with the request's marker; notes when each answer was sent whole."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self._lock = threading.Lock()

    def planner(self, messages: list[dict[str, Any]]) -> Reply:
        last = str(messages[-1]["content"])
        if "CodeInterpreter" not in last.split("\n", 1)[0]:
            code = last.split("RUN<<", 1)[1].split(">>", 1)[0] if "RUN<<" in last else "x = 1"
            return Reply(content=planner_reply(f"RUN<<{code}>>"), delay=LATENCY)
        request = next(str(m["content"]) for m in reversed(messages) if "MARK-" in str(m["content"]))
        marker = request.rsplit("MARK-", 1)[1].split()[0]
        return Reply(content=planner_reply(f"Done: MARK-{marker}", send_to="User"), delay=LATENCY, on_finished=lambda: self._note(marker))

    def _note(self, marker: str) -> None:
        with self._lock:
            self.sent[marker] = time.perf_counter()


def code_generator(messages: list[dict[str, Any]]) -> Reply:
    last = "\n".join(str(m["content"]) for m in messages if m.get("role") == "user")
    code = last.rsplit("RUN<<", 1)[1].split(">>", 1)[0] if "RUN<<" in last else "x = 1"
    return Reply(content=code_reply(code), delay=LATENCY)


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


@contextmanager
def replicas(project: Path, count: int, *, source: Path | None = None) -> Iterator[list[ServeProcess]]:
    """`count` serve processes on `project`; `source`: a taskweaver-lite source tree they run instead of this one."""
    # PYTHONSAFEPATH: `python -m` would otherwise put the working folder (perhaps this checkout) before PYTHONPATH.
    env = {"PYTHONPATH": str(source), "PYTHONSAFEPATH": "1"} if source is not None else None
    with ExitStack() as stack:
        yield [stack.enter_context(ServeProcess.start(project, env=env)) for _ in range(count)]


@dataclass(frozen=True)
class Load:
    """One configuration at one size: what the clients saw, and what the service's own processes spent (summed over rounds)."""

    latencies: list[float]  # s, the model's last reply sent -> its answer event at the client
    elapsed: float  # s of load
    answered: int
    cpu_total: float  # CPU seconds of the serve processes (and PostgreSQL's, when it is the store)
    store_cpu_total: float  # of which PostgreSQL's
    refreshed: tuple[int, float]  # replicas' copies brought up to date in place during the load: how many, seconds in all
    loaded: tuple[int, float]  # sessions loaded afresh from the store during the load: how many, seconds in all
    sessions: list[str]  # the ids of the sessions the load made

    @property
    def rate(self) -> float:
        """Answers per second over the load."""
        return self.answered / self.elapsed if self.elapsed else 0.0

    @property
    def cpu(self) -> float:
        """CPU seconds per answer, the service's processes."""
        return self.cpu_total / max(self.answered, 1)

    @property
    def store_cpu(self) -> float:
        """CPU seconds per answer, PostgreSQL's."""
        return self.store_cpu_total / max(self.answered, 1)

    def __add__(self, other: Load) -> Load:
        """Two rounds of one configuration as one load."""

        def both(a: tuple[int, float], b: tuple[int, float]) -> tuple[int, float]:
            return a[0] + b[0], a[1] + b[1]

        return Load(
            self.latencies + other.latencies,
            self.elapsed + other.elapsed,
            self.answered + other.answered,
            self.cpu_total + other.cpu_total,
            self.store_cpu_total + other.store_cpu_total,
            both(self.refreshed, other.refreshed),
            both(self.loaded, other.loaded),
            self.sessions + other.sessions,
        )


def load(
    urls: list[str],
    model: Model,
    *,
    sessions: int,
    requests: int,
    service: Callable[[], list[int]],
    store_pids: Callable[[], list[int]],
    sticky: bool = False,
    statements: Statements | None = None,
) -> Load:
    """`sessions` clients sending `requests` each, after a warm-up; `service`: the pids whose CPU is the service's (`store_pids` of them PostgreSQL's).

    The warm-up sends each session's first WARM_UP requests, which reach every replica its load will
    use (one, kept in place; each of them, round robin): what is measured is a service that has held
    its sessions a while, not the first load of each session on each replica, which a session pays
    once (the replicas' load histogram counts any that happen during the load all the same). As many
    in every configuration: each load times the same rounds (and folds) of its sessions.
    """
    with httpx.Client(timeout=120) as http:
        opened = [http.post(urls[n % len(urls)] + "/api/sessions", json={}).json()["id"] for n in range(sessions)]
    # Kernels started, first cells run, each session held where its requests go: not what is measured.
    run_clients(urls, opened, model, requests=WARM_UP, prefix="warm-", sticky=sticky)
    if statements is not None:
        statements.reset()
    moves_before = _moves(urls)
    before = cpu_seconds(service())
    started = time.perf_counter()
    arrivals = run_clients(urls, opened, model, requests=requests, sticky=sticky)
    elapsed = time.perf_counter() - started
    after = cpu_seconds(service())
    if statements is not None:
        statements.read()
    spent = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
    in_store = set(store_pids())
    stored = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items() if pid in in_store)
    latencies = [arrived - model.sent[marker] for marker, arrived in arrivals.items() if marker in model.sent]
    (refreshed, loaded), (refreshed_before, loaded_before) = _moves(urls), moves_before
    since = [(now[0] - was[0], now[1] - was[1]) for now, was in ((refreshed, refreshed_before), (loaded, loaded_before))]
    return Load(latencies, elapsed, len(arrivals), spent, stored, since[0], since[1], opened)


def _moves(urls: list[str]) -> tuple[tuple[int, float], tuple[int, float]]:
    """The replicas' copies brought up to date, and sessions loaded, so far: (how many, seconds in all) of each."""
    with httpx.Client(timeout=120) as http:
        refreshed, loaded = (_histogram_totals(http, urls, name) for name in ("taskweaver_session_refresh_seconds", "taskweaver_session_load_seconds"))
    return refreshed, loaded


class Statements:
    """PostgreSQL's own count of the statements run on the cluster (pg_stat_statements), between `reset` and `read`."""

    def __init__(self, cluster: PostgresCluster) -> None:
        self.cluster = cluster
        self.counted: list[tuple[str, int, float]] = []  # (statement, times run, milliseconds of PostgreSQL's time in all)

    def enable(self) -> None:
        """Load pg_stat_statements into the cluster (a restart); it counts utility statements (BEGIN, COMMIT, LISTEN) too."""
        with psycopg.connect(self.cluster.url(), autocommit=True) as db:
            db.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        self.cluster.restart()
        with psycopg.connect(self.cluster.url(), autocommit=True) as db:
            db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def reset(self) -> None:
        with psycopg.connect(self.cluster.url(), autocommit=True) as db:
            db.execute("SELECT pg_stat_statements_reset()")

    def read(self) -> None:
        """What ran since `reset` in the service's databases (not this bench's own queries to the `postgres` database)."""
        with psycopg.connect(self.cluster.url(), autocommit=True) as db:
            rows = db.execute(
                "SELECT s.query, SUM(s.calls)::bigint, SUM(s.total_exec_time + s.total_plan_time) FROM pg_stat_statements s"
                " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname <> 'postgres' GROUP BY s.query ORDER BY 2 DESC, 1"
            ).fetchall()
        self.counted = [(" ".join(str(query).split()), int(calls), float(ms)) for query, calls, ms in rows]

    def report(self, answered: int) -> None:
        total = sum(calls for _, calls, _ in self.counted)
        print(f"    statements per answer: {total / answered:.1f} in all", file=sys.stderr)
        for query, calls, ms in self.counted:
            if calls / answered >= 0.05:
                print(f"    {calls / answered:6.2f}  {ms / answered:6.3f} ms  {query[:150]}", file=sys.stderr)


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds so far of each process still alive (a process born later counts from 0)."""
    spent = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            spent[pid] = times.user + times.system
    return spent


def service_pids(servers: list[ServeProcess], cluster: PostgresCluster | None) -> list[int]:
    """The serve processes (not their local kernels: user code costs the same everywhere), and PostgreSQL's when it is the store."""
    return [server.process.pid for server in servers] + postgres_pids(cluster)


def postgres_pids(cluster: PostgresCluster | None) -> list[int]:
    """The PostgreSQL server's processes (none when it is not the store)."""
    if cluster is None:
        return []
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        postmaster = psutil.Process(int((cluster.folder / "data" / "postmaster.pid").read_text().split()[0]))
        return [postmaster.pid, *(child.pid for child in postmaster.children(recursive=True))]
    return []


def run_clients(urls: list[str], sessions: list[str], model: Model, *, requests: int, prefix: str = "", sticky: bool = False) -> dict[str, float]:
    """Each session's client sends `requests` in turn: round robin over `urls`, or each session on one of them (`sticky`)."""
    arrivals: dict[str, float] = {}

    def client(n: int, session_id: str) -> None:
        with httpx.Client(timeout=120) as http:
            for r in range(requests):
                marker = f"{prefix}{n}-{r}"
                url = urls[n % len(urls)] if sticky else urls[(n + r) % len(urls)]
                for _ in range(100):  # a 409 while the previous request's bookkeeping ends on the other replica: again
                    with http.stream("POST", f"{url}/api/sessions/{session_id}/messages", json={"text": f"set x MARK-{marker} please"}) as response:
                        if response.status_code == 409:
                            response.read()
                            time.sleep(0.05)
                            continue
                        last = ""
                        for line in response.iter_lines():
                            if line.startswith('data: {"type": "answer"'):
                                arrivals[marker] = time.perf_counter()
                            last = line or last
                        if marker not in arrivals:
                            print(f"session {n}, request {r}: HTTP {response.status_code}, no answer; the stream ended with {last[:300]!r}", file=sys.stderr)
                    break
                else:
                    print(f"session {n}, request {r}: refused (409) 100 times", file=sys.stderr)

    threads = [threading.Thread(target=client, args=(n, session_id)) for n, session_id in enumerate(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return arrivals


def measure_load(
    setups: dict[str, Callable[[], Any]],
    model: Model,
    *,
    sizes: list[int],
    requests: int,
    gateway: Gateway,
    cluster: PostgresCluster,
    statements: Statements | None = None,
    rounds: int = 1,
) -> dict[tuple[str, int], Load]:
    """Each configuration at each size, `rounds` times over, the configurations taking turns (a machine whose load drifts weighs on each alike)."""
    results: dict[tuple[str, int], Load] = {}
    for _ in range(rounds):
        for name, start in setups.items():
            for size in sizes:
                found = measure_one(name, start, model, size=size, requests=requests, gateway=gateway, cluster=cluster, statements=statements)
                results[(name, size)] = results[(name, size)] + found if (name, size) in results else found
    return results


def measure_one(
    name: str,
    start: Callable[[], Any],
    model: Model,
    *,
    size: int,
    requests: int,
    gateway: Gateway,
    cluster: PostgresCluster,
    statements: Statements | None,
) -> Load:
    """One configuration at one size, once: its servers started, loaded, stopped; a line on stderr."""
    with start() as servers:
        store = None if name == "sqlite" else cluster
        service, store_pids = functools.partial(service_pids, servers, store), functools.partial(postgres_pids, store)
        urls = [s.url for s in servers]
        counting = statements if store is not None else None
        sticky = "-sticky" in name
        found = load(urls, model, sessions=size, requests=requests, service=service, store_pids=store_pids, sticky=sticky, statements=counting)
    cull(gateway, found.sessions)  # replicas leave kernels on the gateway; a deployment's culling ends them, here at once
    line = f"  {name:11} {size:3} sessions: p95 {p95(found.latencies) * 1000:7.1f} ms, {found.rate:6.1f} requests/s, {found.answered} answered"
    moves = ""
    if name.startswith("pg-2"):
        (refreshes, refresh_total), (loads, load_total) = found.refreshed, found.loaded
        moves = f"; copies brought up to date {refreshes} (mean {refresh_total / max(refreshes, 1) * 1000:.0f} ms)"
        moves += f", sessions loaded {loads} (mean {load_total / max(loads, 1) * 1000:.0f} ms)"
    of_store = f" ({found.store_cpu * 1000:.0f} ms of it PostgreSQL's)" if store is not None else ""
    print(line + f", {found.cpu * 1000:.1f} ms CPU per answer{of_store}{moves}", file=sys.stderr, flush=True)
    if counting is not None:
        counting.report(max(found.answered, 1))
    return found


def cull(gateway: Gateway, sessions: list[str]) -> None:
    """End the kernels of `sessions` on the gateway (what its idle culling does in a deployment).

    `taskweaver-lite gateway` lists no kernels: each session's kernels end through its session route.
    A plain gateway lists them (the bench starts it with `list_kernels`): each one is deleted.
    """
    headers = {"Authorization": f"token {gateway.token}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=60) as http:
        listed = http.get("/api/kernels")
        if listed.status_code == 200:
            for kernel in listed.json():
                http.delete(f"/api/kernels/{kernel['id']}")
            return
        for session_id in sessions:
            http.delete(f"{SESSION_ROUTE}{session_id}")


def kills(project: Path, *, count: int, lease: float) -> tuple[list[float], list[float], int, int, float]:
    """Kill -> next answer (s), lease free -> next answer (s), events lost, events checked, mean session load (s)."""
    to_answer, after_lease, lost, checked = [], [], 0, 0
    with ExitStack() as stack:
        pair = [stack.enter_context(ServeProcess.start(project)) for _ in range(2)]
        http = stack.enter_context(httpx.Client(timeout=120))
        for k in range(count):
            victim, other = pair[k % 2], pair[(k + 1) % 2]
            session_id = http.post(other.url + "/api/sessions", json={}).json()["id"]
            ask(http, other.url, session_id, f"RUN<<kept = {k}>> MARK-kill-{k}-a")
            threading.Thread(target=_ask_quietly, args=(victim.url, session_id, f"RUN<<import time\ntime.sleep(60)>> MARK-kill-{k}-b"), daemon=True).start()
            _wait_for_cell(http, other.url, session_id)
            before = stored_events(http, other.url, session_id)
            victim.kill()
            killed = time.perf_counter()
            while ask(http, other.url, session_id, f"RUN<<print(kept)>> MARK-kill-{k}-c") != 200:
                time.sleep(0.05)
            answered = time.perf_counter()
            to_answer.append(answered - killed)
            after_lease.append(max(answered - killed - lease, 0.0))
            after = dict(stored_events(http, other.url, session_id))
            lost += sum(1 for event_id, data in before if after.get(event_id) != data)
            checked += len(before)
            stack.callback(victim.stop)
            pair[k % 2] = stack.enter_context(ServeProcess.start(project))
        _, loads = _histogram(http, [s.url for s in pair], "taskweaver_session_load_seconds")
    return to_answer, after_lease, lost, checked, loads


def ask(http: httpx.Client, url: str, session_id: str, text: str) -> int:
    with http.stream("POST", f"{url}/api/sessions/{session_id}/messages", json={"text": text}) as response:
        for _ in response.iter_lines():
            pass
        return response.status_code


def _ask_quietly(url: str, session_id: str, text: str) -> None:
    try:
        with httpx.Client(timeout=120) as http:
            ask(http, url, session_id, text)
    except httpx.TransportError:
        pass  # its replica was killed under it


def _wait_for_cell(http: httpx.Client, url: str, session_id: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rounds = http.get(f"{url}/api/sessions/{session_id}").json()["rounds"]
        if rounds and rounds[-1]["state"] == "running" and len(rounds[-1]["posts"]) >= 2:
            time.sleep(0.5)
            return
        time.sleep(0.05)
    raise RuntimeError("the request to be cut off never delegated its cell")


def stored_events(http: httpx.Client, url: str, session_id: str) -> list[tuple[int, Any]]:
    """Every event the store holds for the session, by id (read through the events stream up to the newest)."""
    newest = http.get(f"{url}/api/sessions/{session_id}").json()["last_event"]
    events: list[tuple[int, Any]] = []
    event_id = 0
    with http.stream("GET", f"{url}/api/sessions/{session_id}/events", params={"after": 0}) as response:
        for line in response.iter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                events.append((event_id, json.loads(line[6:])))
                if event_id >= newest:
                    break
    return events


def _histogram(http: httpx.Client, urls: list[str], name: str) -> tuple[int, float]:
    """A histogram of the servers' /metrics summed over them: how many were observed, and their mean in seconds."""
    count, total = _histogram_totals(http, urls, name)
    return count, total / count if count else 0.0


def _histogram_totals(http: httpx.Client, urls: list[str], name: str) -> tuple[int, float]:
    """A histogram of the servers' /metrics summed over them: how many were observed, and their sum in seconds."""
    total = count = 0.0
    for url in urls:
        for line in http.get(url + "/metrics").text.splitlines():
            if line.startswith(name + "_sum "):
                total += float(line.split()[-1])
            elif line.startswith(name + "_count "):
                count += float(line.split()[-1])
    return int(count), total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="10,20,40", help="session counts, comma-separated")
    parser.add_argument("--requests", type=int, default=5, help="timed requests per session")
    parser.add_argument("--kills", type=int, default=20, help="replicas killed mid-cell (0: none)")
    parser.add_argument("--lease", type=float, default=3.0, help="serve.lease_timeout for the kills (the loads run with the shipped one)")
    parser.add_argument("--configs", default="sqlite,pg-local,pg-1,pg-2,pg-2-sticky", help="which configurations to load, comma-separated")
    parser.add_argument("--rounds", type=int, default=1, help="times each configuration is loaded, the configurations taking turns")
    parser.add_argument("--statements", action="store_true", help="count the statements PostgreSQL ran per answer (pg_stat_statements)")
    parser.add_argument("--before", type=Path, help="a taskweaver-lite source tree whose replicas pg-2-sticky-before runs (the code before a change)")
    parser.add_argument(
        "--gateway", choices=("sandbox", "plain"), default="sandbox", help="the replicas' gateway: taskweaver-lite gateway, or jupyter kernelgateway"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sessions.split(",")]
    model = Model()
    with ScriptedServer() as scripted, tempfile.TemporaryDirectory() as folder, running_cluster() as cluster:
        statements = Statements(cluster) if args.statements else None
        if statements is not None:
            statements.enable()
        root = Path(folder)
        (root / "gateway").mkdir()
        scripted.set_default("planner", model.planner)
        scripted.set_default("code_generator", code_generator)
        scripted.set_default("compression", '{"ConversationSummary": "x was set on request.", "Variables": []}')
        plain = ["--JupyterWebsocketPersonality.list_kernels=True"]
        started = sandbox_gateway(root / "gateway") if args.gateway == "sandbox" else kernel_gateway(root / "gateway", options=plain)
        print(f"gateway: {'taskweaver-lite gateway' if args.gateway == 'sandbox' else 'jupyter kernelgateway'}", file=sys.stderr)
        with started as gateway:
            setups = _setups(root, cluster, gateway_url=gateway, model_url=scripted.url, lease=args.lease, before=args.before)
            print("load (each line: one configuration, one size):", file=sys.stderr)
            chosen = {name: start for name, (start, _) in setups.items() if name in args.configs.split(",") and name != "kills"}
            results = measure_load(
                chosen, model, sizes=sizes, requests=args.requests, gateway=gateway, cluster=cluster, statements=statements, rounds=args.rounds
            )
            kill_numbers = kills(setups["kills"][1], count=args.kills, lease=args.lease) if args.kills else None
    report(results, sizes, kill_numbers, lease=args.lease)
    return 0


def _setups(
    root: Path, cluster: PostgresCluster, *, gateway_url: Any, model_url: str, lease: float, before: Path | None = None
) -> dict[str, tuple[Callable[[], Any], Path]]:
    """Each configuration's servers, and its project. The loads run with the shipped serve.lease_timeout (a lease renewed
    each third of it); the kills (`kills`) with `lease`, so that a takeover is not waited for that long."""
    # Streamed replies, as serve_bench.py: the model notes the moment each answer was sent whole.
    shipped = ServeConfig().lease_timeout
    sqlite = write_team_project(root / "sqlite", store_url=None, gateway=None, model_url=model_url, stream=True)
    one = write_team_project(root / "pg-1", store_url=cluster.new_database(), gateway=gateway_url, model_url=model_url, lease_timeout=shipped, stream=True)
    two = write_team_project(root / "pg-2", store_url=cluster.new_database(), gateway=gateway_url, model_url=model_url, lease_timeout=shipped, stream=True)
    killed = write_team_project(root / "kills", store_url=cluster.new_database(), gateway=gateway_url, model_url=model_url, lease_timeout=lease, stream=True)
    # The code before a change (--before) on a database of its own: its schema may be older.
    earlier = root / "before"
    if before is not None:
        write_team_project(earlier, store_url=cluster.new_database(), gateway=gateway_url, model_url=model_url, lease_timeout=shipped, stream=True)
    local = write_team_project(root / "pg-local", store_url=cluster.new_database(), gateway=None, model_url=model_url, stream=True, single_replica=True)
    return {
        "sqlite": (lambda: replicas(sqlite, 1), sqlite),
        "pg-local": (lambda: replicas(local, 1), local),
        "pg-1": (lambda: replicas(one, 1), one),
        "pg-2": (lambda: replicas(two, 2), two),
        "pg-2-sticky": (lambda: replicas(two, 2), two),
        **({"pg-2-sticky-before": (lambda: replicas(earlier, 2, source=before), earlier)} if before is not None else {}),
        "kills": (lambda: replicas(killed, 2), killed),
    }


# Two replicas against one SQLite server at the same session count: (configuration, what, the most CPU per answer it may take).
CPU_TARGETS = (
    ("pg-2-sticky", "sessions kept on one replica, as the shipped nginx routes", 1.3),
    ("pg-2-sticky-before", "kept on one replica, the code of --before", 1.3),
    ("pg-2", "round robin, every request moving", 2.0),
)
RATE_TARGET = 0.8  # answers per second of two replicas kept in place, at least this share of the SQLite server's


def replica_targets(results: dict[tuple[str, int], Load], sqlite: Load, size: int) -> None:
    """The replicas' targets at `size` sessions, each figure against the SQLite server's in the same run."""
    for name, what, most in CPU_TARGETS:
        found = results.get((name, size))
        if found is not None:
            ratio = found.cpu / sqlite.cpu
            print(
                f"target: CPU per answer, two replicas ({what}), at most {most:g}x the SQLite server's at {size} sessions:"
                f" {ratio:.2f}x ({found.cpu * 1000:.1f} against {sqlite.cpu * 1000:.1f} ms, {found.store_cpu * 1000:.1f} of it PostgreSQL's):"
                f" {'holds' if ratio <= most else 'misses'}"
            )
    kept = results.get(("pg-2-sticky", size))
    if kept is not None:
        ratio = kept.rate / sqlite.rate
        print(
            f"target: answers per second, two replicas kept in place, at least {RATE_TARGET:g}x the SQLite server's at {size} sessions:"
            f" {ratio:.2f}x ({kept.rate:.1f} against {sqlite.rate:.1f}): {'holds' if ratio >= RATE_TARGET else 'misses'}"
        )


def report(results: dict[tuple[str, int], Load], sizes: list[int], kills: Any, *, lease: float) -> None:
    print("\nanswer p95 (model's reply sent -> answer event), requests/s, and the service's CPU per answer (serve processes,")
    print("and PostgreSQL's when it is the store); ratios against one SQLite server at 10 sessions")
    base = results.get(("sqlite", 10)) or next(iter(results.values()))
    base_p95 = p95(base.latencies)
    print(f"{'config':11} {'sessions':>8} {'p95 ms':>8} {'x base':>7} {'req/s':>7} {'x base':>7} {'CPU ms':>7} {'x base':>7} {'answered':>8}")
    for (name, size), found in results.items():
        latency = p95(found.latencies)
        print(
            f"{name:11} {size:8} {latency * 1000:8.1f} {latency / base_p95:7.2f} {found.rate:7.1f} {found.rate / base.rate:7.2f}"
            f" {found.cpu * 1000:7.1f} {found.cpu / base.cpu:7.2f} {found.answered:8}"
        )
    if ("pg-2", 20) in results:
        two = results[("pg-2", 20)]
        verdict = "holds" if p95(two.latencies) <= base_p95 else "misses"
        print(f"target: two PostgreSQL replicas at 20 sessions, p95 no worse than one SQLite server at 10: {verdict} on this machine")
        # On one machine the replicas, PostgreSQL, the gateway and the clients share its cores; in a deployment each
        # replica has its own. What one replica spends per answer says whether it holds there.
        print(
            f"  per answer, a replica and its store spend {two.cpu * 1000:.1f} ms CPU against {base.cpu * 1000:.1f} ms for the SQLite server"
            f" ({two.cpu / base.cpu:.2f}x): with a machine per replica, each of two replicas at 20 sessions does the work of one server at 10,"
            f" at that ratio of its CPU per answer"
        )
    for size in sizes:
        same = results.get(("sqlite", size))
        if same is not None:
            replica_targets(results, same, size)
    if kills is None:
        return
    to_answer, after_lease, lost, checked, load_mean = kills
    print(f"\nkills: {len(to_answer)} replicas killed mid-cell (serve.lease_timeout {lease:g} s)")
    print(f"kill -> the other replica's next answer: median {statistics.median(to_answer):.2f} s, max {max(to_answer):.2f} s")
    print(f"lease run out -> that answer (the takeover): median {statistics.median(after_lease):.2f} s, max {max(after_lease):.2f} s (target < 5 s)")
    print(f"loading a session from the store (replicas' histogram, mean): {load_mean * 1000:.0f} ms")
    print(f"stored events lost: {lost} of {checked} read before the kills (target 0)")


if __name__ == "__main__":
    sys.exit(main())
