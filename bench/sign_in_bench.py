"""Signing in: what a refused token costs whatever was wrong with it, and what a sign-in cookie costs a request.

1. A refused token, three ways, interleaved in one run against the same store: its id known (a real
   user's) with a wrong secret, its id unknown, and malformed. Each pays one scrypt check, so the time
   tells nothing of which ids exist. Target: unknown / known and malformed / known within 0.8-1.25
   (before the decoy check, an unknown id was refused in ~0.05 ms against ~20 ms: a ratio near 0.002).
2. A request: `GET /api/sessions` on a served store with users, with `Authorization: Bearer` (the token
   checked once, then remembered) against the page's sign-in cookie (its signature checked with the
   server's key, then its row read from the store). Target: cookie / bearer <= 1.5.

    python bench/sign_in_bench.py [--rounds 15] [--requests 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from taskweaver_lite.config.file import load_config
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing.web_server import WebServer
from taskweaver_lite.web.auth import COOKIE


def refusals(store: SessionStore, known_id: str, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """The fastest refusal of each kind in ms, and the median over rounds of each kind's time over the known id's in that round.

    Interleaved, and compared round by round: a loaded machine's drift falls on each kind alike.
    """
    kinds = {"known id": f"twl_{known_id}_{'y' * 43}", "unknown id": f"twl_{'0' * 16}_{'y' * 43}", "malformed": "not-a-token"}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind, token in kinds.items():
            started = time.perf_counter()
            assert store.user_for_token(token) is None
            times[kind].append(time.perf_counter() - started)
    fastest = {kind: min(values) * 1000 for kind, values in times.items()}
    ratios = {kind: statistics.median(t / k for t, k in zip(times[kind], times["known id"], strict=True)) for kind in ("unknown id", "malformed")}
    return fastest, ratios


def requests(url: str, token: str, count: int) -> dict[str, float]:
    """The median `GET /api/sessions` in ms, by bearer token and by the sign-in cookie, alternated."""
    with httpx.Client(base_url=url) as signed:
        assert signed.post("/sign-in", data={"token": token}, follow_redirects=False).status_code == 303
        cookie = signed.cookies[COOKIE]
    times: dict[str, list[float]] = {"bearer": [], "cookie": []}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as bearer, httpx.Client(base_url=url, cookies={COOKIE: cookie}) as page:
        for client in (bearer, page):
            assert client.get("/api/sessions").status_code == 200  # warm: the bearer token's check is remembered
        for _ in range(count):
            for kind, client in (("bearer", bearer), ("cookie", page)):
                started = time.perf_counter()
                assert client.get("/api/sessions").status_code == 200
                times[kind].append(time.perf_counter() - started)
    return {kind: statistics.median(values) * 1000 for kind, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder) / "project"
        project.mkdir()
        (project / "taskweaver_config.yaml").write_text(yaml.safe_dump({"llm": {"api_base": "http://127.0.0.1:9", "api_key": "x", "model": "m"}}))
        store = SessionStore(project / "sessions.db")
        token = store.add_user("ana")
        try:
            refused, ratios = refusals(store, token.split("_")[1], args.rounds)
        finally:
            store.close()
        with WebServer(load_config(project)) as web:
            served = requests(web.url, token, args.requests)
    print(f"1. refused token, fastest of {args.rounds}: " + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in refused.items()))
    print(f"   median per round: unknown id / known id = {ratios['unknown id']:.2f}   malformed / known id = {ratios['malformed']:.2f}   (target 0.8-1.25)")
    print(f"2. GET /api/sessions, median of {args.requests}: bearer {served['bearer']:.2f} ms, sign-in cookie {served['cookie']:.2f} ms")
    print(f"   cookie / bearer = {served['cookie'] / served['bearer']:.2f}   (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
