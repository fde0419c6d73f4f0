"""Replicas of one team service: two real `serve` processes on a private PostgreSQL server and a real kernel gateway.

Every request goes over HTTP to a replica chosen by the test, the way a round-robin proxy would send
it; nothing is sticky. The model is scripted (`RUN<<code>>` runs that code); the kernels are real
ipykernels on `taskweaver-lite gateway`, each in its session's sandbox. One cluster, one gateway and one pair of replicas serve the
module; a test that kills or stops a replica starts a new one in its place.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from taskweaver_lite.store.interface import INTERRUPTED_ERROR, StoredSession
from taskweaver_lite.store.postgres import PostgresStore
from taskweaver_lite.testing.kernel_gateway import Gateway, sandbox_gateway
from taskweaver_lite.testing.postgres_cluster import PostgresCluster
from taskweaver_lite.testing.replicas import ServeProcess, run_code_model, write_team_project
from taskweaver_lite.testing.scripted_server import ScriptedServer, summary_reply

pytestmark = pytest.mark.team

LEASE = 3.0  # serve.lease_timeout here: a dead replica's session is free after this


class Team:
    """The module's service: its project, two replicas (replaceable), and a user's token."""

    def __init__(self, project: Path, tokens: dict[str, str], model: ScriptedServer, store_url: str, gateway: Gateway) -> None:
        self.project = project
        self.tokens = tokens
        self.model = model  # the scripted model every replica calls
        self.store_url = store_url
        self.gateway = gateway
        self.replicas = ServeProcess.start_several(project, 2)

    def client(self, replica: int, user: str = "alice", **options: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[user]}"}
        return httpx.Client(base_url=self.replicas[replica].url, headers=headers, timeout=90, **options)

    def replace(self, replica: int) -> None:
        """A new replica in place of one that was killed or stopped."""
        self.replicas[replica].stop()
        self.replicas[replica] = ServeProcess.start(self.project)

    def close(self) -> None:
        for replica in self.replicas:
            replica.stop()


@pytest.fixture(scope="module")
def team(postgres_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    root = tmp_path_factory.mktemp("team")
    (root / "gateway").mkdir()
    # The gateway machine's project: the defaults, but for the kernels a user may hold at once: alice holds more than
    # 8 sessions in the replicas' memory here (test_team_limits.py tests gateway.max_kernels_per_user).
    (root / "gateway" / "taskweaver_config.yaml").write_text("gateway: {max_kernels_per_user: null}\n", encoding="utf-8")
    with ScriptedServer() as model, sandbox_gateway(root / "gateway") as gateway:
        run_code_model(model)
        url = postgres_cluster.new_database()
        project = write_team_project(root / "project", store_url=url, gateway=gateway, model_url=model.url, lease_timeout=LEASE)
        tokens = {name: _add_user(project, name) for name in ("alice", "bob")}
        service = Team(project, tokens, model, url, gateway)
        try:
            yield service
        finally:
            service.close()


def _add_user(project: Path, name: str, *options: str) -> str:
    return _users(project, "add", name, *options).stdout.strip().splitlines()[-1]


def _users(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`taskweaver-lite users ...` on the service's store, as an administrator runs it."""
    done = subprocess.run([sys.executable, "-m", "taskweaver_lite", "users", *args, "-p", str(project)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def ask(client: httpx.Client, session_id: str, text: str) -> tuple[int, list[dict[str, Any]]]:
    """POST a message; the status and, for a 200, its events."""
    with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": text}) as response:
        if response.status_code != 200:
            response.read()
            return response.status_code, [response.json()]
        return 200, [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def answer(client: httpx.Client, session_id: str, text: str) -> str:
    status, events = ask(client, session_id, text)
    assert status == 200 and events[-1]["type"] == "answer", events[-1]
    return str(events[-1]["text"])


def test_a_session_moves_between_replicas_with_its_variables_and_stays_its_owners(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second, team.client(1, "bob") as bob:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        assert "41" in answer(first, session_id, "RUN<<x = 41\nprint(x)>>")
        assert "42" in answer(second, session_id, "RUN<<print(x + 1)>>"), "the second replica must reach the same kernel"
        assert "43" in answer(first, session_id, "RUN<<print(x + 2)>>"), "and the first must see what the second stored"
        pids = [answer(client, session_id, "RUN<<import os\nprint('pid', os.getpid())>>").rsplit("pid", 1)[1].split()[0] for client in (first, second)]
        assert pids[0] == pids[1], "one kernel on the gateway, attached to by each replica in turn (not rebuilt by a replay)"
        history = second.get(f"/api/sessions/{session_id}").json()
        assert [r["state"] for r in history["rounds"]] == ["finished"] * 5 and history["last_event"] > 0
        assert session_id in [row["id"] for row in second.get("/api/sessions").json()]
        # Another user: not there at all, on every route and in the list.
        assert session_id not in [row["id"] for row in bob.get("/api/sessions").json()]
        for method, path in [("GET", ""), ("POST", "/messages"), ("GET", "/events"), ("GET", "/export"), ("POST", "/stop"), ("GET", "/context")]:
            refused = bob.request(method, f"/api/sessions/{session_id}{path}", json={"text": "RUN<<print(x)>>"} if method == "POST" else None)
            assert refused.status_code == 404, (method, path, refused.text)
    with httpx.Client(base_url=team.replicas[0].url) as anonymous:
        assert anonymous.get("/api/sessions").status_code == 401
        assert anonymous.get("/api/sessions", headers={"Authorization": "Bearer not-a-token"}).status_code == 401
        assert anonymous.get("/healthz").json() == {"status": "ok", "store": "ok", "kernel_gateway": "ok"}
        assert anonymous.get("/metrics").status_code == 401
    with team.client(1) as second:
        metrics = second.get("/metrics").text
        assert 'taskweaver_http_requests_total{method="POST",route="/api/sessions/{id}/messages",status="200"}' in metrics
        assert "taskweaver_prompt_tokens_total{cache=" in metrics and "taskweaver_lease_takeovers_total" in metrics
        assert "taskweaver_answer_seconds_count" in metrics and "taskweaver_answer_seconds_count 0.0" not in metrics
    log = (team.project / f"access-{team.replicas[1].port}.log").read_text()
    assert f"user=alice session={session_id}" in log and team.tokens["alice"] not in log and "password" not in log
    # A removed user's token stops working (within the two seconds a server trusts what it checked).
    done = subprocess.run([sys.executable, "-m", "taskweaver_lite", "users", "remove", "bob", "-p", str(team.project)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with team.client(0, "bob") as bob:
        deadline = time.monotonic() + 10
        while (status := bob.get("/api/sessions").status_code) != 401 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert status == 401


def test_the_events_stream_on_another_replica_resumes_from_last_event_id(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        seen: list[tuple[int, dict[str, Any]]] = []
        reader = threading.Thread(target=_read_events, args=(team, session_id, 0, seen, 4))
        reader.start()
        answer(first, session_id, "RUN<<import time\ntime.sleep(1)\nprint('slept')>>")
        reader.join(30)
        assert [event["type"] for _, event in seen][:4] == ["round_started", "post", "post", "post"], seen
        assert seen[-1][1]["execution"]["stdout"].strip() == "slept" if "execution" in seen[-1][1] else True
        # A client that dropped after the first event reconnects with Last-Event-ID: it gets the rest, exactly.
        with second.stream("GET", f"/api/sessions/{session_id}/events", headers={"Last-Event-ID": str(seen[0][0])}) as response:
            again = _events(response, len(seen) - 1)
        assert again == seen[1:]
        assert second.get(f"/api/sessions/{session_id}/events", params={"after": "x"}).status_code == 400


def test_requests_sent_back_to_back_on_one_replica_each_say_where_their_own_events_begin(team: Team) -> None:
    # Each request's stream opens with the session's newest stored event before it (`id:`): a page that loses the
    # stream follows the session from there. The replica keeps the session's lease between such requests.
    with team.client(0) as first:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        since: list[int] = []
        handed_before = _count(first, "taskweaver_lease_handovers_total")
        for n in range(4):
            with first.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": f"RUN<<print({n})>>"}) as response:
                lines = [line for line in response.iter_lines() if line]
            assert lines[-1].startswith("data: ") and json.loads(lines[-1][6:])["type"] == "answer", lines[-1]
            since.append(int(next(line for line in lines if line.startswith("id: "))[4:]))
        handed = _count(first, "taskweaver_lease_handovers_total") - handed_before
        last = first.get(f"/api/sessions/{session_id}").json()["last_event"]
        stored: list[tuple[int, dict[str, Any]]] = []
        with first.stream("GET", f"/api/sessions/{session_id}/events", params={"after": 0}) as response:
            event_id = 0
            for line in response.iter_lines():
                event_id = int(line[4:]) if line.startswith("id: ") else event_id
                if line.startswith("data: "):
                    stored.append((event_id, json.loads(line[6:])))
                    if event_id >= last:
                        break
    starts = [(event_id, data["round"]) for event_id, data in stored if data["type"] == "round_started"]
    before = [max((event_id for event_id, _ in stored if event_id < start), default=0) for start, _ in starts]
    assert since == before, f"where each request's events begin, as its stream said {since}, and as stored {before}"
    assert handed >= 2, f"requests sent back to back on one replica must be handed the session's lease there: {handed} of 3 were"


def _read_events(team: Team, session_id: str, after: int, into: list[tuple[int, dict[str, Any]]], count: int) -> None:
    with team.client(1) as second, second.stream("GET", f"/api/sessions/{session_id}/events", params={"after": after}) as response:
        into.extend(_events(response, count))


def _events(response: httpx.Response, count: int) -> list[tuple[int, dict[str, Any]]]:
    got: list[tuple[int, dict[str, Any]]] = []
    event_id = 0
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            got.append((event_id, json.loads(line[6:])))
            if len(got) >= count:
                break
    return got


def test_two_requests_racing_for_one_session_on_two_replicas_one_runs_one_is_refused(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        answer(first, session_id, "RUN<<print('warm')>>")
        statuses: list[int] = []
        code = "RUN<<import time\ntime.sleep(2)\nprint('raced')>>"
        racers = [threading.Thread(target=lambda c=client: statuses.append(ask(c, session_id, code)[0])) for client in (first, second)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(60)
        assert sorted(statuses) == [200, 409], statuses


def test_a_replica_killed_in_a_cell_leaves_the_session_to_another_with_its_variables(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        answer(first, session_id, "RUN<<kept = 7\nprint(kept)>>")
        cut: list[tuple[int, list[dict[str, Any]]]] = []
        code = "RUN<<import time\nlate = 8\nprint('started', flush=True)\ntime.sleep(60)>>"
        _, printed = _ask_watching_output(first, session_id, code, "started", cut)
        assert printed.wait(60), f"the cell never started: {cut}"
        team.replicas[0].kill()
        killed = time.monotonic()
        while (status_and_events := ask(second, session_id, "RUN<<print(kept * 6, late)>>"))[0] == 409:
            assert time.monotonic() - killed < 30, "the dead replica's session must be free within 30 s"
            time.sleep(0.5)
        status, events = status_and_events
        assert status == 200 and "42 8" in events[-1]["text"], events[-1]
        rounds = second.get(f"/api/sessions/{session_id}").json()["rounds"]
        assert [(r["state"], r["error"]) for r in rounds] == [("finished", None), ("failed", INTERRUPTED_ERROR), ("finished", None)]
        assert "taskweaver_lease_takeovers_total 1.0" in second.get("/metrics").text
    team.replace(0)


def _ask_watching_output(
    client: httpx.Client, session_id: str, text: str, marker: str, into: list[tuple[int, list[dict[str, Any]]]]
) -> tuple[threading.Thread, threading.Event]:
    """POST a message in a thread (its status and events into `into`); the event is set once a cell prints `marker`.

    What a test waits for before it acts on a running cell: the cell's own output, not a time it should take to get there.
    A request whose replica is killed under it breaks off: nothing goes into `into`.
    """
    printed = threading.Event()

    def run() -> None:
        with contextlib.suppress(httpx.TransportError), client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": text}) as response:
            events = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1]["type"] == "output" and marker in events[-1]["text"]:
                        printed.set()
            into.append((response.status_code, events))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, printed


def test_while_the_store_restarts_requests_get_503_and_the_sessions_go_on_after(team: Team, postgres_cluster: PostgresCluster) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        answer(first, session_id, "RUN<<before = 5>>")
        postgres_cluster.stop()
        try:
            down = second.get("/api/sessions")
            assert down.status_code == 503 and "store" in down.json()["error"] and "\n" not in down.json()["error"]
            assert ask(first, session_id, "RUN<<print(before)>>")[0] == 503
            health = first.get("/healthz")
            assert health.status_code == 503 and health.json()["kernel_gateway"] == "ok" and health.json()["store"] != "ok"
        finally:
            postgres_cluster.start_again()
        for client in (first, second):  # each replica's pool and LISTEN connection come back by themselves
            deadline = time.monotonic() + 30
            while client.get("/healthz").status_code != 200:
                assert time.monotonic() < deadline, "the replicas must find the store again once it is back"
                time.sleep(0.5)
        assert "5" in answer(second, session_id, "RUN<<print(before)>>")
        assert [r["state"] for r in first.get(f"/api/sessions/{session_id}").json()["rounds"]] == ["finished", "finished"]
    for replica in team.replicas:
        assert "Traceback" not in replica.log(), replica.log()


def test_sigterm_lets_the_running_request_finish_then_the_replica_exits(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        result: list[tuple[int, list[dict[str, Any]]]] = []
        # The cell runs until the test has seen the replica stopping with it under way, however busy the machine.
        code = "RUN<<import os, time\nprint('started', flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\nfinal = 1\nprint('finished')>>"
        running, printed = _ask_watching_output(first, session_id, code, "started", result)
        assert printed.wait(60), f"the cell never started: {result}"
        team.replicas[0].terminate()
        deadline = time.monotonic() + 30
        while (health := first.get("/healthz")).status_code == 200:
            assert time.monotonic() < deadline, "the replica never began to stop"
            time.sleep(0.05)
        assert health.json()["status"] == "stopping" and running.is_alive() and not result, "precondition: it stops with the request under way"
        (team.gateway.root / "taskweaver_sessions" / session_id / "go").touch()
        running.join(60)
        assert result and result[0][0] == 200 and "finished" in result[0][1][-1]["text"], result
        # It exits on its own once drained (uvicorn passes the signal on: 128 + SIGTERM), without a traceback.
        assert team.replicas[0].process.wait(30) in (0, 143, -15) and "Traceback" not in team.replicas[0].log()
        assert "1" in answer(second, session_id, "RUN<<print(final)>>")
    team.replace(0)


def test_stop_pressed_on_another_replica_stops_the_request_there_and_frees_the_session(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        answer(first, session_id, "RUN<<kept = 3>>")
        result: list[tuple[int, list[dict[str, Any]]]] = []
        code = "RUN<<import time\nprint('started', flush=True)\ntime.sleep(120)\nprint('never')>>"
        running, printed = _ask_watching_output(first, session_id, code, "started", result)
        assert printed.wait(60), f"the cell never started: {result}"
        pressed = time.monotonic()
        stopped = second.post(f"/api/sessions/{session_id}/stop")
        assert stopped.status_code == 200 and stopped.json() == {"stopped": True}, f"Stop on the second replica: {stopped.text}"
        second.post(f"/api/sessions/{session_id}/stop")  # pressed twice, impatiently: heard twice (the notice, the store's mark) on the first
        running.join(60)
        assert not running.is_alive(), "Stop pressed on the second replica must end the request running on the first"
        # Far from the cell's 120 s, and with room for a loaded machine: the stop is heard at once (NOTIFY) or at the next renewal.
        assert time.monotonic() - pressed < 60, "the request must end soon after Stop, not when its cell would have"
        status, events = result[0]
        assert status == 200 and events[-1] == {"type": "error", "message": "Stopped. The session and its variables are kept."}, events[-1]
        # Free at once: a request sent on reading the error is not refused (the stopped one freed its lease first).
        status, events = ask(second, session_id, "RUN<<print(kept * 2)>>")
        assert status == 200 and "6" in events[-1]["text"], f"the session must be free once the stop's error is out: {status} {events[-1]}"
        rounds = first.get(f"/api/sessions/{session_id}").json()["rounds"]
        assert [(r["state"], r["error"]) for r in rounds] == [("finished", None), ("failed", "Cancelled by the user."), ("finished", None)]
        cells = [post["execution"] for post in rounds[1]["posts"] if post.get("execution")]
        assert cells, f"the stopped cell must be kept with what it printed until then: {rounds[1]['posts']}"
        assert cells[0]["cancelled"] and "started" in cells[0]["stdout"] and "never" not in cells[0]["stdout"], f"interrupted, not left to finish: {cells[0]}"
        assert second.post(f"/api/sessions/{session_id}/stop").json() == {"stopped": False}, "nothing runs now"


def test_a_replica_never_trusts_its_copy_over_rounds_another_replica_stored(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        asked = ["RUN<<a = 1>>", "RUN<<b = 2>>", "just a question", "RUN<<print('sum', a + b)>>", "RUN<<print('after', a + b + 1)>>"]
        answer(first, session_id, asked[0])  # the first replica now holds a copy of the session
        answer(second, session_id, asked[1])  # the second goes on with it: the first's copy is stale
        answer(second, session_id, asked[2])
        calls = len(team.model.requests)
        assert "sum 3" in answer(first, session_id, asked[3]), "back on the first replica, the kernel has what the second ran"
        planner = next(r for r in team.model.requests[calls:] if r.role == "planner")
        prompt = json.dumps(planner.messages)
        assert "just a question" in prompt and "b = 2" in prompt, "the first replica's prompt must hold the rounds the second stored"
        coder = json.dumps(next(r for r in team.model.requests[calls:] if r.role == "code_generator").messages)
        assert "## Variables in the kernel (2)" in coder, "and list the variables the kernel holds now, b included, not those of its old copy"
        assert "after 4" in answer(second, session_id, asked[4]), "and the second sees what the first stored since"
        assert _count(first, "taskweaver_session_refresh_seconds_count") >= 1, "the first replica's copy was brought up to date, not loaded again"
        for client in (first, second):
            rounds = client.get(f"/api/sessions/{session_id}").json()["rounds"]
            assert [(r["round"], r["text"], r["state"]) for r in rounds] == [(i, text, "finished") for i, text in enumerate(asked, 1)], rounds


def test_a_copy_brought_up_to_date_names_the_variables_a_kernel_death_on_the_other_replica_took(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        answer(first, session_id, "RUN<<x = 41>>")
        status, events = ask(second, session_id, "RUN<<import os\nos._exit(1)>>")
        assert status == 200 and events[-1]["type"] == "answer", events[-1]
        calls = len(team.model.requests)
        assert "ok True" in answer(first, session_id, "RUN<<x = 1\nprint('ok', x == 1)>>"), "the first replica's copy goes on with the restarted kernel"
        coder = json.dumps(next(r for r in team.model.requests[calls:] if r.role == "code_generator").messages)
        assert "Lost in a kernel restart (recompute before use): x" in coder, "the first replica's copy must not go on believing x is there"


def test_a_copy_whose_kernel_was_replaced_on_the_other_replica_is_loaded_afresh_onto_the_new_kernel(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        answer(first, session_id, "RUN<<y = 5>>")
        store = PostgresStore(team.store_url)
        try:
            old_kernel = store.load(session_id).kernel_id
            gone = httpx.delete(f"{team.gateway.url}/api/kernels/{old_kernel}", headers={"Authorization": f"token {team.gateway.token}"}, timeout=30)
            assert gone.status_code == 204, gone.text
            assert "y is 5" in answer(second, session_id, "RUN<<print('y is', y)>>"), "the second replica starts a kernel and replays the cells"
            new_kernel = store.load(session_id).kernel_id
        finally:
            store.close()
        assert new_kernel not in (None, old_kernel)
        loads = _count(first, "taskweaver_session_load_seconds_count")
        assert "y is 6" in answer(first, session_id, "RUN<<y += 1\nprint('y is', y)>>"), "the first replica's copy must move to the new kernel"
        assert _count(first, "taskweaver_session_load_seconds_count") == loads + 1, "a copy on a kernel the session left is loaded again"


def test_a_session_deleted_on_one_replica_is_gone_on_the_other_with_its_kernel_and_only_its_owner_may_delete_it(team: Team) -> None:
    team.tokens.setdefault("dora", _add_user(team.project, "dora"))
    with team.client(0) as first, team.client(1) as second, team.client(1, "dora") as dora:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        answer(first, session_id, "RUN<<z = 3>>")  # the first replica keeps a copy, attached to the kernel
        store = PostgresStore(team.store_url)
        try:
            kernel_id = store.load(session_id).kernel_id
        finally:
            store.close()
        assert dora.delete(f"/api/sessions/{session_id}").status_code == 404, "another user's session is not there to delete"
        deleted = second.delete(f"/api/sessions/{session_id}")
        assert deleted.status_code == 200, deleted.text
        # The replicas share one project folder here: what the first kept of its copy on a machine of its own, put back.
        kept = team.project / "sessions" / session_id / "outputs"
        kept.mkdir(parents=True, exist_ok=True)
        (kept / "cell-0001.txt").write_text("z = 3\n")
        status, said = ask(first, session_id, "RUN<<print(z)>>")
        assert status == 404, (status, said)
        assert not (team.project / "sessions" / session_id).exists(), "the first replica drops what it kept of the deleted session"
        kernel = httpx.get(f"{team.gateway.url}/api/kernels/{kernel_id}", headers={"Authorization": f"token {team.gateway.token}"}, timeout=30)
        assert kernel.status_code == 404, f"the deleted session's kernel must not run on in the gateway: {kernel.text}"
        assert not (team.gateway.root / "taskweaver_sessions" / session_id).exists(), "nor its folder stay on the gateway's machine"
        assert session_id not in [row["id"] for row in first.get("/api/sessions").json()]


def _count(client: httpx.Client, name: str) -> float:
    """One sample of the replica's /metrics, by its full name."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics has no {name}")


def test_a_fold_still_running_when_a_replica_lets_go_of_a_session_never_lands_over_what_the_next_one_stored(team: Team) -> None:
    with team.client(0) as first, team.client(1) as second:
        session_id = first.post("/api/sessions", json={}).json()["id"]
        for n in range(4):
            answer(first, session_id, f"RUN<<v{n} = {n}>>")
        # The fifth round starts a fold of rounds 1-2 (2 folded, 3 kept) that outlasts serve.lease_wait (5 s here): its
        # answer is held until the second replica has taken the session over and stored its own fold, however busy the machine.
        release = threading.Event()

        def stale(messages: list[dict[str, Any]]) -> str:
            release.wait(120)
            return summary_reply("STALE: from the replica that let go.", [])

        team.model.set_default("compression", stale)
        try:
            answer(first, session_id, "RUN<<v4 = 4>>")
        finally:
            run_code_model(team.model)
        try:
            answered = time.monotonic()
            while (outcome := ask(second, session_id, "just a question"))[0] == 409:  # the first replica's bookkeeping, up to lease_wait
                assert time.monotonic() - answered < 20, "the first replica must let go of the session once serve.lease_wait has passed"
                time.sleep(0.5)
            assert outcome[0] == 200 and outcome[1][-1]["type"] == "answer", outcome[1][-1]
            deadline = time.monotonic() + 60
            while not _own_fold(stored := _stored(team, session_id)):
                assert time.monotonic() < deadline, f"the second replica never stored its own fold: {stored.compression}"
                time.sleep(0.2)
        finally:
            release.set()  # the first replica's fold returns now, after the second one's landed
        watched = time.monotonic() + 2  # what it would write, it writes as its answer arrives
        while time.monotonic() < watched:
            summaries = {role: state["summary"] for role, state in _stored(team, session_id).compression.items()}
            assert not any("STALE" in text for text in summaries.values()), f"a replica that let go of the session wrote its fold over the store: {summaries}"
            time.sleep(0.2)
        stored = _stored(team, session_id)
        assert _own_fold(stored), "the second replica's own fold stays"
        assert [r.state for r in stored.rounds] == ["finished"] * 6


def _stored(team: Team, session_id: str) -> StoredSession:
    store = PostgresStore(team.store_url)
    try:
        return store.load(session_id)
    finally:
        store.close()


def _own_fold(stored: StoredSession) -> bool:
    """The Planner's summary covers rounds 1-2 and is the code model's own (not the stale one)."""
    planner = stored.compression.get("planner", {})
    return bool(planner.get("folded_through", 0) >= 2 and "The user ran code." in planner.get("summary", ""))


def test_a_request_cut_short_by_the_drain_timeout_is_marked_cut_off_not_cancelled(team: Team) -> None:
    draining = ServeProcess.start(team.project, args=("--set", "serve.drain_timeout=2"))
    headers = {"Authorization": f"Bearer {team.tokens['alice']}"}
    try:
        with httpx.Client(base_url=draining.url, headers=headers, timeout=90) as leaving, team.client(1) as second:
            session_id = leaving.post("/api/sessions", json={}).json()["id"]
            answer(leaving, session_id, "RUN<<print('warm')>>")
            result: list[tuple[int, list[dict[str, Any]]]] = []
            running, printed = _ask_watching_output(leaving, session_id, "RUN<<import time\nprint('started', flush=True)\ntime.sleep(60)>>", "started", result)
            assert printed.wait(60), f"the cell never started: {result}"
            draining.terminate()
            running.join(30)
            assert result and result[0][0] == 200, f"the cut request's stream must end with its error, not break off: {result}"
            assert result[0][1][-1]["type"] == "error" and "shutting down" in result[0][1][-1]["message"], result[0][1][-1]
            assert draining.process.wait(40) in (0, 143, -15), "the replica exits once its drain timeout has passed"
            rounds = second.get(f"/api/sessions/{session_id}").json()["rounds"]
            assert [(r["state"], r["error"]) for r in rounds] == [("finished", None), ("failed", INTERRUPTED_ERROR)], (
                "a request the drain timeout cut must be marked cut off, as for a replica that died, not as cancelled by the user"
            )
            # Free at once (not after serve.lease_timeout): the stopping replica let go of it. (Its variables are the
            # kernel's: kept, unless interrupting the cut cell took past the kernel's grace and it was restarted.)
            status, events = ask(second, session_id, "RUN<<print(2 * 5)>>")
            assert status == 200 and "10" in events[-1]["text"], f"the stopped replica frees the session: {status} {events[-1]}"
        assert "Traceback" not in draining.log(), draining.log()
    finally:
        draining.stop()


def test_an_expired_token_is_refused_and_a_rotated_one_works_on_every_replica_at_once(team: Team) -> None:
    brief = _add_user(team.project, "carol", "--expires", "0.00001")  # under a second
    time.sleep(1.0)
    for replica in team.replicas:
        refused = httpx.get(replica.url + "/api/sessions", headers={"Authorization": f"Bearer {brief}"}, timeout=30)
        assert refused.status_code == 401 and refused.json()["error"].startswith("The token of carol expired on "), refused.text
    rotated = _users(team.project, "rotate", "carol", "--expires", "30").stdout.strip().splitlines()[-1]
    again = _users(team.project, "rotate", "carol").stdout.strip().splitlines()[-1]
    for replica in team.replicas:
        for token, status in ((brief, 401), (rotated, 401), (again, 200)):
            answered = httpx.get(replica.url + "/api/sessions", headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert answered.status_code == status, f"{replica.url}: a token replaced by `users rotate` stops at once, the newest works: {answered.text}"
    (carol,) = [user for user in json.loads(_users(team.project, "list", "--json").stdout) if user["name"] == "carol"]
    assert abs(carol["expires_at"] - (time.time() + 30 * 86400)) < 60, "rotated without --expires: the days the last token had"


def test_a_session_past_serve_max_sessions_per_user_is_refused_counting_what_every_replica_made(team: Team) -> None:
    headers = {"Authorization": f"Bearer {_add_user(team.project, 'dana')}"}
    limited = ServeProcess.start(team.project, args=("--set", "serve.max_sessions_per_user=1"))
    try:
        other = httpx.Client(base_url=team.replicas[0].url, headers=headers, timeout=90)
        with other, httpx.Client(base_url=limited.url, headers=headers, timeout=90) as client:
            session_id = other.post("/api/sessions", json={}).json()["id"]  # dana's one session, made on another replica
            again = client.post("/api/sessions", json={}).json()["id"]
            assert again == session_id, "it counts from its making: at the limit, her session never asked anything is handed back"
            answer(other, session_id, "just a question")
            refused = client.post("/api/sessions", json={})
            assert refused.status_code == 429, refused.text
            assert "serve.max_sessions_per_user (1)" in refused.json()["error"] and "\n" not in refused.json()["error"], refused.text
            assert "Done." in answer(client, session_id, "another question"), "the session dana has goes on"
            assert client.delete(f"/api/sessions/{session_id}").status_code == 200
            assert client.post("/api/sessions", json={}).status_code == 200, "once she deleted one, she may make another"
    finally:
        limited.stop()


def test_a_rotated_token_ends_its_event_streams_on_every_replica_within_the_lease_renewal_period(team: Team) -> None:
    token = _add_user(team.project, "fern")
    store = PostgresStore(team.store_url)
    fern = next(user for user in store.users() if user.name == "fern")
    store.create_session("fern-streams", started=time.time(), owner=fern.id)  # no kernel needed: the stream reads the store
    ended: dict[int, float] = {}
    streaming = {replica: threading.Event() for replica in (0, 1)}

    def follow(replica: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with (
            httpx.Client(base_url=team.replicas[replica].url, headers=headers, timeout=30) as client,
            client.stream("GET", "/api/sessions/fern-streams/events") as stream,
        ):
            assert stream.status_code == 200
            streaming[replica].set()
            for _ in stream.iter_lines():
                if time.monotonic() > give_up[0]:
                    return
        ended[replica] = time.monotonic()

    give_up = [time.monotonic() + 90.0]  # a stream still open then outlived the token for good (25 s past the rotation, below)
    followers = [threading.Thread(target=follow, args=(replica,)) for replica in (0, 1)]
    for thread in followers:
        thread.start()
    for replica, event in streaming.items():  # both open before the token changes, however long a loaded machine takes
        assert event.wait(30), f"the stream on replica {replica} did not open"
    _users(team.project, "rotate", "fern")
    rotated = time.monotonic()  # the rotation is stored by now (the command's start-up is not the servers' doing)
    give_up[0] = rotated + 25
    for thread in followers:
        thread.join(40)
    assert set(ended) == {0, 1}, "a stream outlived the token it was opened with"
    # Nine checks (one each LEASE / 3): what it tells apart is a stream that ends at a check from one that runs on (25 s here),
    # and a loaded machine runs each check late.
    assert all(at - rotated < 3 * LEASE for at in ended.values()), ("each replica's stream ends at its next checks", ended, rotated)
