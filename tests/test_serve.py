"""`serve`'s HTTP API over real HTTP: a real uvicorn, real kernels, the scripted model."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply
from taskweaver_lite.testing.web_server import WebServer
from taskweaver_lite.web.auth import COOKIE, Access
from taskweaver_lite.web.live import END, Turn

pytestmark = pytest.mark.kernel

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.savefig('trend.png')\nplt.show()\nprint('plotted')"


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def project(tmp_path: Path, scripted: ScriptedServer) -> Path:
    return make_project(tmp_path, scripted.url, session={"max_upload_bytes": 4096})


@pytest.fixture
def web(project: Path) -> Iterator[WebServer]:
    with WebServer(load_config(project)) as server:
        yield server


def events(client: httpx.Client, session_id: str, text: str) -> list[dict[str, Any]]:
    """The event stream of one request, each `data` line decoded."""
    with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": text}, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_a_request_streams_the_events_the_cli_renders_and_ends_with_the_answer(web: WebServer, scripted: ScriptedServer) -> None:
    scripted.enqueue("planner", planner_reply("Plot the numbers."), planner_reply("The plot is in trend.png.", send_to="User"))
    scripted.enqueue("code_generator", code_reply(PLOT))
    with httpx.Client(base_url=web.url) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        received = events(client, session_id, "plot 1, 3, 2")
        kinds = [event["type"] for event in received]
        assert kinds[0] == "round_started" and kinds[-1] == "answer", kinds
        assert received[-1]["text"] == "The plot is in trend.png."
        assert "status" in kinds and "output" in kinds, "the page must see progress and the cell's output as it prints"
        execution = next(e["execution"] for e in received if e["type"] == "post" and "execution" in e)
        assert execution["stdout"].strip() == "plotted" and execution["artifacts"]
        image = client.get(execution["artifacts"][0])
        assert image.status_code == 200 and image.headers["content-type"] == "image/png" and image.content[:4] == b"\x89PNG"
        state = client.get(f"/api/sessions/{session_id}").json()
        assert [r["answer"] for r in state["rounds"]] == ["The plot is in trend.png."], "a reloaded page shows the session as it is"
        listed = client.get("/api/sessions").json()
        assert any(row["id"] == session_id for row in listed)
        context = client.get(f"/api/sessions/{session_id}/context").json()["roles"]
        assert {role["role"] for role in context} == {"Planner", "CodeGenerator"} and all(r["total"] <= r["budget"] for r in context)
        notebook = client.get(f"/api/sessions/{session_id}/export", params={"format": "ipynb"})
        assert notebook.status_code == 200 and json.loads(notebook.content)["nbformat"] == 4


def test_a_model_error_ends_the_stream_with_an_error_and_the_session_goes_on(web: WebServer, scripted: ScriptedServer) -> None:
    scripted.enqueue("planner", Reply(status=401, error_message="invalid api key"))
    with httpx.Client(base_url=web.url) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        received = events(client, session_id, "hello")
        assert received[-1]["type"] == "error" and received[-1]["message"]
        scripted.enqueue("planner", planner_reply("Hello again.", send_to="User"))
        assert events(client, session_id, "hello again")[-1] == {"type": "answer", "text": "Hello again.", "round": 2}


def test_stop_cancels_the_running_step_like_ctrl_c(web: WebServer, scripted: ScriptedServer) -> None:
    scripted.enqueue("planner", planner_reply("Wait a while."))
    scripted.enqueue("code_generator", code_reply("import time\ntime.sleep(60)"))
    with httpx.Client(base_url=web.url) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        threading.Timer(3.0, lambda: httpx.post(f"{web.url}/api/sessions/{session_id}/stop", json={})).start()
        began = time.monotonic()
        received = events(client, session_id, "wait")
        assert received[-1]["type"] == "error" and "Stopped" in received[-1]["message"]
        assert time.monotonic() - began < 20, "Stop must not wait for the cell to end"
        scripted.enqueue("planner", planner_reply("Still here.", send_to="User"))
        assert events(client, session_id, "are you there")[-1]["type"] == "answer"


def test_a_deleted_session_is_gone_from_every_route_with_its_files_and_one_answering_is_refused(
    web: WebServer, scripted: ScriptedServer, project: Path
) -> None:
    scripted.enqueue("planner", planner_reply("Plot the numbers."), planner_reply("The plot is in trend.png.", send_to="User"))
    scripted.enqueue("code_generator", code_reply(PLOT))
    scripted.enqueue("planner", planner_reply("Wait a while."))
    scripted.enqueue("code_generator", code_reply("import time\ntime.sleep(60)"))
    with httpx.Client(base_url=web.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        plot = next(e["execution"]["artifacts"][0] for e in events(client, session_id, "plot 1, 3, 2") if e["type"] == "post" and "execution" in e)
        refused: list[int] = []
        threading.Timer(3.0, lambda: refused.append(httpx.delete(f"{web.url}/api/sessions/{session_id}").status_code)).start()
        threading.Timer(5.0, lambda: httpx.post(f"{web.url}/api/sessions/{session_id}/stop", json={})).start()
        assert events(client, session_id, "wait")[-1]["type"] == "error"
        assert refused == [409], "a session answering a request is not deleted under it"
        assert client.delete(f"/api/sessions/{session_id[:-2]}").status_code == 404, "only the exact id deletes, never a start of one"
        deleted = client.delete(f"/api/sessions/{session_id}")
        assert deleted.status_code == 200 and deleted.json() == {"deleted": session_id}
        for path in ("", "/export", "/context"):
            assert client.get(f"/api/sessions/{session_id}{path}").status_code == 404, path
        assert client.get(plot).status_code == 404 and not (project / "sessions" / session_id).exists()
        assert session_id not in [row["id"] for row in client.get("/api/sessions").json()]
        assert client.delete(f"/api/sessions/{session_id}").status_code == 404


def test_a_session_open_elsewhere_answers_409(web: WebServer, project: Path) -> None:
    with open_session(load_config(project)) as elsewhere, httpx.Client(base_url=web.url) as client:
        response = client.post(f"/api/sessions/{elsewhere.id}/resume", json={})
        assert response.status_code == 409 and "open" in response.json()["error"]


def test_uploads_land_in_the_working_folder_and_are_size_limited(web: WebServer, project: Path) -> None:
    with httpx.Client(base_url=web.url) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        loaded = client.post(f"/api/sessions/{session_id}/files", files={"file": ("../../sales.csv", b"region,sales\nnorth,3\n", "text/csv")})
        assert loaded.status_code == 200 and loaded.json()["name"] == "sales.csv"
        assert (project / "sessions" / session_id / "cwd" / "sales.csv").read_bytes() == b"region,sales\nnorth,3\n"
        too_big = client.post(f"/api/sessions/{session_id}/files", files={"file": ("big.csv", b"x" * 8192, "text/csv")})
        assert too_big.status_code == 413 and "max_upload_bytes" in too_big.json()["error"]


def test_artifacts_are_served_only_from_the_sessions_folders(web: WebServer, project: Path) -> None:
    (project / "secret.txt").write_text("do not serve")
    with httpx.Client(base_url=web.url) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        (project / "sessions" / session_id / "cwd" / "leak.txt").symlink_to(project / "secret.txt")  # what a cell could make
        for name in ("..%2F..%2F..%2Fsecret.txt", "%2E%2E", "..%2Fsessions.db", "%2Fetc%2Fpasswd", "leak.txt"):
            response = client.get(f"/api/sessions/{session_id}/artifacts/{name}")
            assert response.status_code == 404, f"{name} was served"
            assert b"do not serve" not in response.content


def test_off_loopback_a_token_is_required_and_checked_on_every_request(project: Path) -> None:
    with pytest.raises(ConfigError, match="token"):
        Access.for_address("0.0.0.0", None)
    with WebServer(load_config(project), token="t0ken") as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions").status_code == 401
        assert client.get("/").status_code == 401
        authorized = {"Authorization": "Bearer t0ken"}
        assert client.get("/api/sessions", headers=authorized).status_code == 200
        for came_from in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}, {}):  # login CSRF: another site's link
            forged = client.get("/?token=t0ken", headers=came_from, follow_redirects=False)
            assert forged.status_code == 401 and "set-cookie" not in forged.headers and "another site" in forged.text, came_from
        page = client.get("/?token=t0ken", headers={"Sec-Fetch-Site": "none"}, follow_redirects=False)  # opened from outside any site
        assert page.status_code == 303 and COOKIE in page.cookies and "HttpOnly" in page.headers["set-cookie"]
        assert "t0ken" not in page.headers["set-cookie"], "the cookie is a signed sign-in, not the token"
        assert client.get("/api/sessions").status_code == 200, "the page's cookie signs its own requests in"
        assert "access-control-allow-origin" not in {k.lower() for k in client.get("/api/sessions").headers}


def test_state_changing_requests_from_another_site_are_refused(web: WebServer) -> None:
    with httpx.Client(base_url=web.url) as client:
        assert client.post("/api/sessions", json={}, headers={"Origin": "http://evil.example"}).status_code == 403
        assert client.post("/api/sessions", json={}, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert client.post("/api/sessions", content=b"x=1", headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code == 415
        assert client.post("/api/sessions", json={}, headers={"Origin": web.url}).status_code == 200
        assert client.post("/api/sessions").status_code == 200, "a new session needs no body"


def test_without_a_token_only_this_machines_names_are_answered(web: WebServer) -> None:
    # DNS rebinding: a page on evil.example re-pointed at 127.0.0.1 sends its own name as Host.
    with httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions", headers={"Host": "evil.example"}).status_code == 403
        assert client.post("/api/sessions", headers={"Host": f"evil.example:{web.port}", "Origin": f"http://evil.example:{web.port}"}).status_code == 403
        assert client.get("/api/sessions", headers={"Host": f"localhost:{web.port}"}).status_code == 200


def test_a_request_sent_the_moment_the_answer_arrives_is_answered_not_refused(web: WebServer, scripted: ScriptedServer) -> None:
    # The answer goes out when the terminal would print it, while its round is stored and its
    # bookkeeping goes on: the next request must wait for those, not get 409, and its stream must
    # carry only its own round's events.
    scripted.set_default("planner", lambda messages: planner_reply("Done.", send_to="User"))
    with httpx.Client(base_url=web.url) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        for number in range(1, 6):
            received = events(client, session_id, f"request {number}")
            kinds = [event["type"] for event in received]
            assert kinds[0] == "round_started" and kinds[-2:] == ["round_ended", "answer"], kinds
            assert {event["round"] for event in received if "round" in event} == {number}, received
            assert received[-2]["state"] == "finished" and received[-1] == {"type": "answer", "text": "Done.", "round": number}
        rounds = client.get(f"/api/sessions/{session_id}").json()["rounds"]
        assert [r["state"] for r in rounds] == ["finished"] * 5


def test_a_streamed_reply_that_outruns_its_reader_is_sent_as_its_latest_text() -> None:
    async def read() -> list[list[dict[str, Any]]]:
        turn = Turn(asyncio.get_running_loop())

        def worker() -> None:
            for text in ("Lo", "Load", "Loading"):
                turn.put({"type": "delta", "role": "Planner", "fields": {"message": text}})
            turn.put({"type": "delta", "role": "CodeGenerator", "fields": {"code": "x"}})
            turn.put({"type": "post", "round": 1})
            turn.put({"type": "delta", "role": "Planner", "fields": {"message": "Done"}})
            turn.put({"type": "answer", "text": "Done", "round": 1})
            turn.put(END)

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()  # everything arrives before the stream reads: one batch
        return [batch async for batch in turn.batches()]

    batches = asyncio.run(read())
    assert len(batches) == 1, "what arrived together leaves together"
    assert [(e["type"], e.get("role"), e.get("fields")) for e in batches[0]] == [
        ("delta", "Planner", {"message": "Loading"}),  # the steps on the way are dropped, the latest kept
        ("delta", "CodeGenerator", {"code": "x"}),
        ("post", None, None),
        ("delta", "Planner", {"message": "Done"}),  # never merged across another event: the order holds
        ("answer", None, None),
    ]


def test_opening_a_session_takes_the_loaded_modules_out_of_the_collectors_view(web: WebServer) -> None:
    # A full collection over pandas, the tokenizer and the SDKs stops every session for ~100 ms.
    gc.unfreeze()  # what earlier tests froze
    with httpx.Client(base_url=web.url) as client:
        client.post("/api/sessions", json={})
    assert gc.get_freeze_count() > 50_000


def test_the_request_thread_learns_when_its_answer_has_been_written() -> None:
    # The round's bookkeeping waits for this, so it does not take the interpreter from the writing loop.
    async def read() -> tuple[bool, bool]:
        turn = Turn(asyncio.get_running_loop())
        turn.put({"type": "answer", "text": "Done", "round": 1})
        stream = turn.batches()
        assert [e["type"] for e in await stream.__anext__()] == ["answer"]
        before = turn.answer_sent.is_set()  # handed to the server, not yet written
        turn.put(END)
        with contextlib.suppress(StopAsyncIteration):
            await stream.__anext__()  # the server comes back for more: the answer went out
        return before, turn.answer_sent.is_set()

    assert asyncio.run(read()) == (False, True)
