"""A team service's limits when one user's requests race, and what its users see while the gateway or the store is away.

Two real `serve` replicas on a private PostgreSQL server and a real `taskweaver-lite gateway` whose
project allows 8 kernels per user; requests go over HTTP to either replica, sent at once from
threads as a page's tabs or a script would. The model is scripted (`RUN<<code>>` runs that code).
Every wait is on a condition, never a fixed sleep: the machine running this is small and busy.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import yaml

from taskweaver_lite.errors import StoreUnavailable
from taskweaver_lite.store.postgres import PostgresStore, close_pools
from taskweaver_lite.testing.kernel_gateway import Gateway, sandbox_gateway
from taskweaver_lite.testing.postgres_cluster import PostgresCluster, running_cluster
from taskweaver_lite.testing.replicas import ServeProcess, run_code_model, write_team_project
from taskweaver_lite.testing.scripted_server import ScriptedServer

pytestmark = [pytest.mark.team, pytest.mark.timeout(300)]  # a gateway, two replicas, PostgreSQL and 12 kernels on a loaded machine

KERNELS_PER_USER = 8
SETTING = "gateway.max_kernels_per_user"


@dataclass
class Service:
    """The module's service: the gateway's project (to start it again), the gateway, two replicas, users' tokens."""

    gateway_project: Path
    gateway: Gateway
    project: Path
    replicas: list[ServeProcess]
    store_url: str
    gateways: contextlib.ExitStack  # the gateway's process, and the one started in its place after it was stopped
    tokens: dict[str, str] = field(default_factory=dict)

    def start_gateway_again(self) -> Gateway:
        """The gateway on its port, with its token, after it was stopped: where the replicas look for it."""
        port = int(self.gateway.url.rsplit(":", 1)[1])
        self.gateway = self.gateways.enter_context(sandbox_gateway(self.gateway_project, port=port, token=self.gateway.token))
        return self.gateway

    def client(self, replica: int, user: str) -> httpx.Client:
        return httpx.Client(base_url=self.replicas[replica].url, headers={"Authorization": f"Bearer {self.tokens[user]}"}, timeout=180)

    def logs(self) -> str:
        return "".join(replica.log() for replica in self.replicas)


@pytest.fixture(scope="module")
def service(postgres_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("limits")
    gateway_project = root / "gateway"
    gateway_project.mkdir()
    (gateway_project / "taskweaver_config.yaml").write_text(yaml.safe_dump({"gateway": {SETTING.split(".")[1]: KERNELS_PER_USER}}), encoding="utf-8")
    with ScriptedServer() as model, contextlib.ExitStack() as gateways:
        gateway = gateways.enter_context(sandbox_gateway(gateway_project))
        run_code_model(model)
        store_url = postgres_cluster.new_database()
        project = write_team_project(root / "project", store_url=store_url, gateway=gateway, model_url=model.url, lease_timeout=3.0)
        tokens = {name: _add_user(project, name) for name in ("alice", "bob", "carol")}
        replicas = ServeProcess.start_several(project, 2)
        try:
            yield Service(gateway_project, gateway, project, replicas, store_url, gateways, tokens)
        finally:
            for replica in replicas:
                replica.stop()


def _add_user(project: Path, name: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "taskweaver_lite", "users", "add", name, "-p", str(project)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def ask(client: httpx.Client, session_id: str, text: str) -> tuple[int, list[dict[str, Any]]]:
    """POST a message; the status and, for a 200, its events (else the error body)."""
    with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": text}) as response:
        if response.status_code != 200:
            response.read()
            return response.status_code, [response.json()]
        return 200, [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def _gateway_metrics(gateway: Gateway) -> str:
    answer = requests.get(f"{gateway.url}/metrics", headers={"Authorization": f"token {gateway.token}"}, timeout=30)
    answer.raise_for_status()
    return answer.text


def _kernels_counted(gateway: Gateway) -> int:
    """The kernels the gateway's /metrics counts now, every user's, starting ones included."""
    return sum(int(line.rsplit(" ", 1)[1]) for line in _gateway_metrics(gateway).splitlines() if line.startswith("taskweaver_gateway_kernels{"))


class Watch:
    """Polls a number in a thread until stopped, keeping the largest it saw."""

    def __init__(self, measure: Callable[[], int]) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._measure = measure
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(requests.RequestException):
                self.most = max(self.most, self._measure())
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.most


def _running_kernel_processes(gateway: Gateway) -> int:
    """Kernels of the gateway that are processes now, starting ones included: the distinct connection files of the
    ipykernel command lines under the gateway's process (a kernel's launcher and the kernel it becomes are one kernel)."""
    import psutil

    try:
        children = psutil.Process(gateway.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    kernels: set[str] = set()
    for child in children:
        try:
            command = child.cmdline()
            if child.name() != "bwrap" and "ipykernel_launcher" in command:
                kernels.add(command[command.index("-f") + 1] if "-f" in command[:-1] else str(child.pid))
        except psutil.Error:
            continue
    return len(kernels)


def test_twelve_first_requests_at_once_from_one_user_run_the_first_eight_and_refuse_the_rest_naming_the_setting(service: Service) -> None:
    clients = [service.client(n % 2, "alice") for n in range(12)]
    try:
        sessions = [client.post("/api/sessions", json={}).json()["id"] for client in clients]
        assert not list((service.gateway.root / "taskweaver_sessions").glob("*")), "a session never asked anything has no kernel, nor a folder"
        # Each cell counts its own runs in its session's folder, and holds its kernel busy until the test has seen the
        # refusals come back and the kernels that run all running at once (however slowly a loaded machine starts them).
        code = (
            "RUN<<import os, time\nopen('runs.txt', 'a').write('x')\nprint('runs', len(open('runs.txt').read()))\n"
            "while not os.path.exists('go'):\n    time.sleep(0.05)>>"
        )
        kernels_counted = Watch(lambda: _kernels_counted(service.gateway))
        kernel_processes = Watch(lambda: _running_kernel_processes(service.gateway))
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            asked = [pool.submit(ask, client, session_id, code) for client, session_id in zip(clients, sessions, strict=True)]
            deadline = time.monotonic() + 120  # past it, the cells are let go all the same: the checks below say what went wrong
            while time.monotonic() < deadline and (sum(future.done() for future in asked) < 12 - KERNELS_PER_USER or kernel_processes.most < KERNELS_PER_USER):
                time.sleep(0.1)
            for folder in (service.gateway.root / "taskweaver_sessions").glob("*"):
                (folder / "go").touch()
            results = [future.result() for future in asked]
        counted, running = kernels_counted.stop(), kernel_processes.stop()
        assert counted <= KERNELS_PER_USER and running <= KERNELS_PER_USER, f"never more kernels than the limit: {counted} counted, {running} running"
        assert running == KERNELS_PER_USER, f"the eight kernels that ran were seen running at once ({running}): the count sees kernels"
    finally:
        for client in clients:
            client.close()
    ran = [events for status, events in results if status == 200]
    refused = [events[0]["error"] for status, events in results if status != 200]
    assert len(ran) == KERNELS_PER_USER, results
    for events in ran:
        assert events[-1]["type"] == "answer" and "runs 1" in events[-1]["text"], events[-1]
    assert all(status in (200, 429) for status, _ in results), [status for status, _ in results]
    assert len(refused) == 12 - KERNELS_PER_USER and all(f"{SETTING} ({KERNELS_PER_USER})" in said and "alice" in said for said in refused), refused
    everything = json.dumps(results) + service.logs()
    assert "refused the token" not in everything and "KeyboardInterrupt" not in everything and "runs 2" not in everything
    assert service.logs().count("the kernel gateway refused a kernel") == len(refused), "each refusal is in the replicas' log"
    gateway_log = (service.gateway.root / "gateway.log").read_text(encoding="utf-8")
    assert gateway_log.count("refused a kernel to alice") == len(refused), gateway_log[-3000:]
    # The gateway's own /metrics, behind its token, names the user (not the id their sessions belong to).
    assert requests.get(f"{service.gateway.url}/metrics", timeout=30).status_code == 401
    metrics = _gateway_metrics(service.gateway)
    assert f'taskweaver_gateway_kernels{{user="alice"}} {KERNELS_PER_USER}' in metrics, metrics
    assert f'taskweaver_gateway_kernel_starts_refused_total{{user="alice"}} {len(refused)}' in metrics, metrics
    # Another user is not held back by alice's kernels.
    with service.client(0, "bob") as bob:
        session_id = bob.post("/api/sessions", json={}).json()["id"]
        status, events = ask(bob, session_id, "RUN<<print('bob ran')>>")
        assert status == 200 and "bob ran" in events[-1]["text"], events[-1]


def test_sessions_made_at_once_by_one_user_never_pass_serve_max_sessions_per_user_on_any_replica(service: Service) -> None:
    limited = ServeProcess.start_several(service.project, 2, args=("--set", "serve.max_sessions_per_user=5"))
    headers = {"Authorization": f"Bearer {service.tokens['carol']}"}
    try:

        def make(n: int) -> httpx.Response:
            with httpx.Client(base_url=limited[n % 2].url, headers=headers, timeout=120) as client:
                return client.post("/api/sessions", json={})

        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(make, range(30)))
        assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers if a.status_code != 200]
        made = {answer.json()["id"] for answer in answers}
        assert len(made) == 5, f"{len(made)} sessions made against a limit of 5: past it, a never-used one of hers is handed back"
        with httpx.Client(base_url=limited[0].url, headers=headers, timeout=180) as client:
            for session_id in sorted(made):
                status, events = ask(client, session_id, "a question")
                assert status == 200 and events[-1]["type"] == "answer", events
            refused = client.post("/api/sessions", json={})
            assert refused.status_code == 429 and "serve.max_sessions_per_user (5)" in refused.json()["error"], refused.text
            assert len(client.get("/api/sessions").json()) == 5
    finally:
        for replica in limited:
            replica.stop()


def test_the_gateway_stopped_with_a_request_in_flight_answers_503_naming_it_and_the_variables_come_back_by_replay(service: Service) -> None:
    with service.client(0, "bob") as first, service.client(1, "bob") as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        status, events = ask(first, session_id, "RUN<<kept = 41\nprint('kept', kept)>>")
        assert status == 200 and "kept 41" in events[-1]["text"], events
        in_flight: list[tuple[int, list[dict[str, Any]]]] = []
        running = threading.Thread(target=lambda: in_flight.append(ask(first, session_id, "RUN<<import time\nprint('started', flush=True)\ntime.sleep(60)>>")))
        running.start()
        _wait_for_busy_kernel(service, session_id)
        stopped = _stop_gateway(service.gateway)
        try:
            running.join(120)
            assert in_flight and in_flight[0][0] == 200, in_flight
            last = in_flight[0][1][-1]
            assert last["type"] == "error" and "kernel gateway" in last["message"] and "stopped answering" in last["message"], last
            for client in (first, second):
                status, said = ask(client, session_id, "RUN<<print(kept)>>")
                assert status == 503 and "kernel gateway" in said[0]["error"] and "\n" not in said[0]["error"], (status, said)
        finally:
            service.start_gateway_again()
        assert stopped
        for client in (second, first):
            status, events = ask(client, session_id, "RUN<<print('kept is', kept + 1)>>")
            assert status == 200 and "kept is 42" in events[-1]["text"], events[-1]
        assert "Variables lost" not in json.dumps(events) and "NameError" not in json.dumps(events)
    assert "Traceback" not in service.logs()


def _wait_for_busy_kernel(service: Service, session_id: str) -> None:
    """Until the session's kernel (its id from the store) runs a cell."""
    store = PostgresStore(service.store_url)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            kernel_id = store.load(session_id).kernel_id
            if kernel_id is not None:
                asked = requests.get(f"{service.gateway.url}/api/kernels/{kernel_id}", headers={"Authorization": f"token {service.gateway.token}"}, timeout=30)
                if asked.ok and asked.json().get("execution_state") == "busy":
                    return
            time.sleep(0.1)
    finally:
        store.close()
    raise AssertionError("the session's kernel never ran the cell")


def _stop_gateway(gateway: Gateway) -> bool:
    """SIGTERM to the gateway's process; True once it has exited."""
    import os
    import signal

    import psutil

    os.kill(gateway.pid, signal.SIGTERM)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(gateway.pid).wait(60)
    return True


def test_a_store_outage_is_answered_at_once_and_the_service_is_back_within_seconds_of_the_restart(service: Service, postgres_cluster: PostgresCluster) -> None:
    with service.client(0, "bob") as first, service.client(1, "bob") as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        status, events = ask(first, session_id, "RUN<<before = 5>>")
        assert status == 200, events
        postgres_cluster.stop()
        waits: list[float] = []
        try:
            # Long enough that retries growing from 1 s (1, 2, 4, 8 s: tries at about 1, 3, 7 and 15 s) would put the next
            # one some 7 s past the restart, well past the 4 s the service has to be back in (seen failing so at 7.6 s).
            outage_ends = time.monotonic() + 8
            while time.monotonic() < outage_ends:
                for client in (first, second):
                    began = time.monotonic()
                    down = client.get("/api/sessions")
                    waits.append(time.monotonic() - began)
                    assert down.status_code == 503 and "store" in down.json()["error"] and "\n" not in down.json()["error"], down.text
                    assert client.get("/healthz").status_code == 503
                time.sleep(0.1)  # some forty requests per replica over the outage: enough to see each answered at once, without a busy loop
        finally:
            postgres_cluster.start_again()
        restarted = time.monotonic()
        for client in (first, second):
            while client.get("/healthz").status_code != 200 or client.get("/api/sessions").status_code != 200:
                assert time.monotonic() - restarted < 60, "the replicas never found the store again"
        recovered = time.monotonic() - restarted
        assert "5" in ask(second, session_id, "RUN<<print(before)>>")[1][-1]["text"]
    slow = [wait for wait in waits if wait > 1.0]
    assert recovered < 4.0, f"back {recovered:.1f} s after the store's restart"
    assert len(slow) <= 2 and sorted(waits)[len(waits) // 2] < 0.3, f"while down, requests are answered at once: {sorted(waits)[-5:]}"


def test_once_the_store_is_back_its_first_request_gets_through_without_waiting_out_the_pools_reconnection_back_off() -> None:
    """The connection pool reconnects on its own back-off (1, 2, 4, 8 s: tries some 1, 3, 7 and 15 s into an outage), and
    while one try waits no other starts: after 10 s down, its next is 3 s or more past the restart, and each request
    meanwhile waits 5 s for a connection and fails (the first got through 5.7 s after the restart so). Finding the server
    back, the store starts a fresh pool, which connects at once. Its own server: stopping the run's would cut other tests."""
    with running_cluster() as cluster:
        url = cluster.new_database()
        store = PostgresStore(url)
        try:
            store.ping()
            cluster.stop()
            down = time.monotonic()
            while time.monotonic() - down < 10:  # past the pool's tries at 7 and 8 s (10% jitter), short of the next at 13.5 s
                with pytest.raises(StoreUnavailable):
                    store.ping()
                time.sleep(0.2)
            cluster.start_again()
            restarted = time.monotonic()
            while True:
                try:
                    store.ping()
                    break
                except StoreUnavailable:
                    assert time.monotonic() - restarted < 30, "the store never found the server again"
                    time.sleep(0.05)
            recovered = time.monotonic() - restarted
        finally:
            close_pools(url)  # before the server goes: no pool left reconnecting to it
    assert recovered < 2.0, f"the first request got through {recovered:.1f} s after the store's restart"


def test_a_replica_lets_go_of_a_session_unused_for_serve_hot_session_idle_and_the_next_request_finds_it_whole(service: Service) -> None:
    letting_go = ServeProcess.start(service.project, args=("--set", "serve.hot_session_idle=1"))
    try:
        with httpx.Client(base_url=letting_go.url, headers={"Authorization": f"Bearer {service.tokens['carol']}"}, timeout=180) as client:
            session_id = client.post("/api/sessions", json={}).json()["id"]
            status, events = ask(client, session_id, "RUN<<held = 7>>")
            assert status == 200, events
            store = PostgresStore(service.store_url)
            kernel_id = store.load(session_id).kernel_id
            store.close()
            headers = {"Authorization": f"token {service.gateway.token}"}
            deadline = time.monotonic() + 90
            while requests.get(f"{service.gateway.url}/api/kernels/{kernel_id}", headers=headers, timeout=30).json()["connections"] != 0:
                assert time.monotonic() < deadline, "the replica never let go of the session's kernel"
                time.sleep(0.5)
            status, events = ask(client, session_id, "RUN<<print('held', held)>>")
            assert status == 200 and "held 7" in events[-1]["text"], events[-1]
    finally:
        letting_go.stop()
