"""The web server under load: ten sessions at once, five requests each, a 50 ms model.

`taskweaver-lite serve` runs in its own process; the scripted model (50 ms before each reply) runs
here and the ten clients in a process of their own, all on one clock: from the moment the model's
last reply of a request has been sent whole ([DONE] out, the body's end following) to its `answer` event
reaching the client; and, as the page sees it, from the moment that reply's text left the model
to the first `delta` event carrying it. Baseline, same run: the same requests through `Session.ask`
in this process (no HTTP), from the reply sent whole to the session telling its listeners the
answer (when the terminal prints it).
Memory: the server's resident size once the ten sessions have each answered a request, minus its
size once the first had answered alone, per session (kernels are their own processes and are not
counted); and its growth per session over the timed requests. Each session answers one untimed
request before the timed ones, so the ten kernels have started: their start-up is not what is measured.

    python bench/serve_bench.py [--sessions 10] [--requests 5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.config.file import load_config
from taskweaver_lite.records.events import Event, PostAdded
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply

LATENCY = 0.05


class Model:
    """Planner: delegate, then answer with a marker; notes when each answer's text left the server
    (`shown`: its one content piece) and when the reply had been sent whole (`sent`: [DONE] out, the
    body's end following, the moment the model has replied)."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.shown: dict[str, float] = {}
        self._lock = threading.Lock()

    def planner(self, messages: list[dict[str, Any]]) -> Reply:
        last = messages[-1]["content"]
        if "CodeInterpreter:" not in last:
            return Reply(content=planner_reply("Set x to 1."), delay=LATENCY)
        request = next(m["content"] for m in reversed(messages) if "MARK-" in m["content"])  # this round's user message
        marker = request.rsplit("MARK-", 1)[1].split()[0]
        answer = planner_reply(f"Done: MARK-{marker} x is 1.", send_to="User")
        return Reply(
            content=answer, delay=LATENCY, chunk_chars=100_000,
            on_sent=lambda _: self._note(self.shown, marker), on_finished=lambda: self._note(self.sent, marker),
        )  # fmt: skip

    def _note(self, times: dict[str, float], marker: str) -> None:
        with self._lock:
            times[marker] = time.perf_counter()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Memory:
    """The server's resident size per session (MiB; kernels are their own processes, not counted)."""

    per_session: float  # each session opened and answered once, against the first doing so alone
    growth: float  # per session, over the timed requests


def through_serve(project: Path, model: Model, *, sessions: int, requests: int) -> tuple[list[float], list[float], list[float], int, Memory]:
    """Latencies (s) reply -> answer event and reply -> its text on the page, answers received, server memory."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "taskweaver_lite", "serve", "-p", str(project), "--port", str(port)],
        stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/api/sessions", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        # The first session, once it has answered, has loaded what every session uses (pandas, the
        # tokenizer, a kernel's client...): memory per session is counted from there, each session
        # measured once it too has answered a request.
        rss = psutil.Process(server.pid).memory_info
        with httpx.Client(base_url=url, timeout=60) as http:
            opened = [http.post("/api/sessions", json={}).json()["id"]]
        # The clients run in a process of their own: in this one the scripted model's threads would
        # hold the GIL while an answer waits to be read. perf_counter is the system's monotonic clock.
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            # One untimed request per session first: its kernel has started and its first cell ran.
            # Ten kernels starting at once (~0.5 s of CPU each) is another load than ten sessions answering.
            pool.apply(run_clients, (url, opened, 1, "warm-first-"))
            warm = rss().rss
            with httpx.Client(base_url=url, timeout=60) as http:
                opened += [http.post("/api/sessions", json={}).json()["id"] for _ in range(sessions - 1)]
            pool.apply(run_clients, (url, opened[1:], 1, "warm-"))
            answered_once = rss().rss
            arrivals, shown = pool.apply(run_clients, (url, opened, requests))
            answered_all = rss().rss
        memory = Memory((answered_once - warm) / max(sessions - 1, 1) / 2**20, (answered_all - answered_once) / sessions / 2**20)
        latencies = [arrived - model.sent[marker] for marker, arrived in arrivals.items()]
        streamed = [arrived - model.shown[marker] for marker, arrived in shown.items()]
        from_text = [arrived - model.shown[marker] for marker, arrived in arrivals.items()]
        return latencies, streamed, from_text, len(arrivals), memory
    finally:
        server.terminate()
        server.wait(30)


def run_clients(url: str, sessions: list[str], requests: int, prefix: str = "") -> tuple[dict[str, float], dict[str, float]]:
    """One thread per session, `requests` requests each, in turn; by marker, when each answer event
    arrived, and when the answer's text first arrived as it streamed (a `delta` carrying it)."""
    arrivals: dict[str, float] = {}
    shown: dict[str, float] = {}

    def client(n: int, session_id: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            for r in range(requests):
                marker = f"{prefix}{n}-{r}"
                last = ""
                with http.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": f"set x MARK-{marker} please"}) as response:
                    for line in response.iter_lines():
                        # Read as a page's script would, but only as far as needed: ten readers in one
                        # process must not hold up one another's clocks by decoding every event.
                        if not line.startswith("data: "):
                            continue
                        last = line
                        if line.startswith('data: {"type": "answer"'):
                            arrivals[marker] = time.perf_counter()
                        elif marker not in shown and line.startswith('data: {"type": "delta"') and f"MARK-{marker}" in line:
                            shown[marker] = time.perf_counter()
                if not last or json.loads(last[6:])["type"] != "answer":
                    print(f"session {n}, request {r}: no answer; the stream ended with {last!r}", file=sys.stderr)

    threads = [threading.Thread(target=client, args=(n, session_id)) for n, session_id in enumerate(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return arrivals, shown


def in_process(project: Path, model: Model, *, requests: int) -> list[float]:
    """The baseline, no HTTP: the reply sent whole -> the session telling its listeners the answer
    (the moment the terminal prints it)."""
    answered: list[float] = []

    def on_event(event: Event) -> None:
        if isinstance(event, PostAdded) and event.post.is_answer:
            answered.append(time.perf_counter())

    with open_session(load_config(project), listeners=[on_event]) as session:
        for r in range(requests):
            session.ask(f"set x MARK-local-{r} please")
    return [at - model.sent[f"local-{r}"] for r, at in enumerate(answered)]


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    model = Model()
    with ScriptedServer() as scripted, tempfile.TemporaryDirectory() as root:
        scripted.set_default("planner", model.planner)
        scripted.set_default("code_generator", code_reply("x = 1"))
        scripted.set_default("compression", '{"ConversationSummary": "x was set to 1 on request.", "Variables": []}')
        project = Path(root) / "project"
        shutil.copytree(bundled_project(), project, ignore=shutil.ignore_patterns("sessions", "*.db*", ".chat_history"))
        settings = {"llm": {"api_base": scripted.url, "api_key": "bench", "model": "scripted"}, "execution": {"timeout": 60}}
        (project / "taskweaver_config.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
        baseline = in_process(project, model, requests=args.requests * 2)
        latencies, streamed, from_text, answered, per_session = through_serve(project, model, sessions=args.sessions, requests=args.requests)
    total = args.sessions * args.requests
    print(f"answered: {answered} of {total} requests ({args.sessions} sessions at once, {args.requests} each, model {LATENCY * 1000:.0f} ms)")
    print(
        f"model's reply sent whole -> answer event on the client: p95 {p95(latencies) * 1000:.1f} ms, median {statistics.median(latencies) * 1000:.1f} ms "
        f"(target p95 < 20 ms); one session in-process, no HTTP: p95 {p95(baseline) * 1000:.1f} ms, median {statistics.median(baseline) * 1000:.1f} ms"
    )
    print(
        f"model's reply -> its text on the client as it streams (delta event): p95 {p95(streamed) * 1000:.1f} ms, "
        f"median {statistics.median(streamed) * 1000:.1f} ms ({len(streamed)} replies)"
    )
    print(
        f"the reply's text leaving the model -> answer event (counting the reply's last bytes too): "
        f"p95 {p95(from_text) * 1000:.1f} ms, median {statistics.median(from_text) * 1000:.1f} ms"
    )
    print(
        f"server memory per session, kernels excluded, each once it has answered a request: {per_session.per_session:.1f} MiB; "
        f"and per session over its {args.requests} timed requests: {per_session.growth:+.1f} MiB"
    )
    return 0 if answered == total else 1


if __name__ == "__main__":
    sys.exit(main())
