"""Running the team service: what an operator and a proxy in front see, on a real uvicorn in a thread (no kernel starts).

A proxy that ends TLS, a Prometheus scraper with a token of its own, the metrics it reads, and the
deploy files as shipped (their values are those the tests use).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import make_project

from taskweaver_lite import __version__
from taskweaver_lite.cli.main import main
from taskweaver_lite.config.file import load_config
from taskweaver_lite.records.events import ModelCalled
from taskweaver_lite.testing.web_server import WebServer
from taskweaver_lite.web.metrics import Metrics

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, "http://127.0.0.1:9", serve={"metrics_token": "scrape-only"})  # no model is called


def test_a_post_through_a_proxy_that_ends_tls_is_same_origin(project: Path) -> None:
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        page_origin = f"https://127.0.0.1:{web.port}"  # what the browser sends: the proxy's https address
        forwarded = client.post("/api/sessions/none/stop", headers={"Origin": page_origin, "X-Forwarded-Proto": "https"})
        assert forwarded.status_code == 200, f"the page's own POST behind a TLS proxy must pass the same-origin check: {forwarded.text}"
        assert client.post("/api/sessions/none/stop", headers={"Origin": page_origin}).status_code == 403, "without the proxy's word it is another origin"
        elsewhere = client.post("/api/sessions/none/stop", headers={"Origin": "https://evil.example", "X-Forwarded-Proto": "https"})
        assert elsewhere.status_code == 403


def test_the_metrics_token_opens_metrics_alone(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["users", "add", "ana", "-p", str(project)]) == 0
    token = capsys.readouterr().out.splitlines()[-1]
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        scraper = {"Authorization": "Bearer scrape-only"}
        scraped = client.get("/metrics", headers=scraper)
        assert scraped.status_code == 200, scraped.text
        assert client.get("/api/sessions", headers=scraper).status_code == 401, "the scraper's token opens no session route"
        assert client.post("/api/sessions", headers=scraper).status_code == 401
        assert client.get("/metrics").status_code == 401 and client.get("/metrics", headers={"Authorization": "Bearer scrape"}).status_code == 401
        assert client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code == 200, "a user's token still reads it"
    text = scraped.text
    assert "process_cpu_seconds_total" in text and "process_resident_memory_bytes" in text, "the process collector"
    assert "python_info{" in text, "the platform collector"
    assert f'taskweaver_build_info{{version="{__version__}"}} 1.0' in text


def test_tokens_are_counted_by_user_and_model() -> None:
    metrics = Metrics()
    metrics.listener("ana")(ModelCalled("planner", 120, 30, 0.1, ok=True, cached_tokens=100, model="gpt-4o-mini"))
    metrics.listener("ana")(ModelCalled("code_generator", 80, 20, 0.1, ok=True, model="gpt-4o-mini"))
    metrics.listener(None)(ModelCalled("planner", 5, 1, 0.1, ok=True, model="local"))
    text = metrics.render().decode()
    assert 'taskweaver_tokens_total{kind="prompt",model="gpt-4o-mini",user="ana"} 200.0' in text
    assert 'taskweaver_tokens_total{kind="completion",model="gpt-4o-mini",user="ana"} 50.0' in text
    assert 'taskweaver_tokens_total{kind="prompt",model="local",user="-"} 5.0' in text
    assert 'taskweaver_prompt_tokens_total{cache="cached",role="planner"} 100.0' in text, "by role as before"


def test_the_team_extra_brings_the_gateway_client_its_replicas_need() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs tomllib (Python 3.11)")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[]", requirement)[0] for requirement in extras["team"]}
    assert {"websocket-client", "requests"} <= names, f"pip install '.[team]' must be enough for replicas on a gateway: {extras['team']}"


def test_compose_passes_only_values_the_tests_use() -> None:
    from taskweaver_lite.cli.main import build_parser
    from taskweaver_lite.config.settings import ServeConfig, SessionConfig

    services = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())["services"]
    replica = services["replica1"]
    assert services["replica2"] == replica
    args = build_parser().parse_args(replica["command"][1:])  # the real parser: every flag compose passes exists
    assert (args.command, args.host, args.port, args.log) == ("serve", "0.0.0.0", 8800, "-")
    assert replica["depends_on"]["postgres"] == {"condition": "service_healthy"} and "healthcheck" in services["postgres"]
    assert replica["restart"] in ("unless-stopped", "always", "on-failure")
    probe = replica["healthcheck"]["test"]
    assert probe[:3] == ["CMD", "python", "-c"] and f"127.0.0.1:{args.port}/healthz" in probe[3], "the image has Python, not curl"
    grace = float(replica["stop_grace_period"].removesuffix("s"))
    project = yaml.safe_load((REPO / "deploy" / "project" / "taskweaver_config.yaml").read_text())
    drain = project["serve"].get("drain_timeout", ServeConfig().drain_timeout)
    assert grace > drain, "compose must give a stopping replica longer than serve.drain_timeout"
    assert any(volume.endswith(":/project:ro") for volume in replica["volumes"]), "the project is read-only, as the tests run it"
    gateway_token = project["execution"]["kernel_gateway"].get("token")
    assert gateway_token is not None or replica["environment"].get("KG_AUTH_TOKEN") == services["gateway"]["environment"]["KG_AUTH_TOKEN"], (
        "the replicas must send the token the gateway was started with"
    )
    nginx = (REPO / "deploy" / "nginx.conf").read_text()
    (cap,) = re.findall(r"client_max_body_size (\d+)m;", nginx)
    assert int(cap) * 1024 * 1024 > SessionConfig().max_upload_bytes, "nginx must let through the largest upload the app takes"
    assert re.findall(r"server replica\d:(\d+)", nginx) == [str(args.port)] * 2, "nginx sends to the port the replicas listen on"
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in nginx and "proxy_set_header Host $http_host;" in nginx


def test_the_configuration_reference_lists_every_section_store_and_serve_included() -> None:
    from taskweaver_lite.cli.reference import config_page
    from taskweaver_lite.config.settings import Config

    page = config_page()
    sections = [name for name, field in Config.model_fields.items() if not field.exclude]
    assert {"store", "serve"} <= set(sections)
    missing = [name for name in sections if f"## `{name}`" not in page]
    assert not missing, f"the configuration reference has no section for {missing}"
    assert "`serve.metrics_token`" in page and "`session.state_dir`" in page and "`store.url`" in page


def test_a_request_the_kernel_gateway_cannot_serve_is_503_not_400() -> None:
    from taskweaver_lite.errors import GatewayUnreachableError, KernelError
    from taskweaver_lite.web.api import answer_failure

    down = answer_failure(GatewayUnreachableError("The kernel gateway http://gw:8888 did not answer within 10 s."))
    assert down.status_code == 503 and b"kernel gateway" in down.body and b"try again" in down.body
    assert answer_failure(KernelError("The Python kernel could not start.")).status_code == 400


def _stored(project: Path, session_id: str, owner: str) -> None:
    import time

    from taskweaver_lite.records.conversation import Round
    from taskweaver_lite.records.events import RoundStarted
    from taskweaver_lite.store.database import SessionStore

    store = SessionStore(project / "sessions.db")
    ids = {user.name: user.id for user in store.users()}  # sessions belong to a user's id
    store.create_session(session_id, started=time.time(), owner=ids[owner])
    store.record(session_id, RoundStarted(Round(index=1, user_query=f"{owner}'s request")))
    store.close()


def test_an_admin_sees_each_sessions_owner_and_promotes_demotes_and_clears_an_expiry(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import time

    tokens = {}
    for name, options in (("ana", []), ("root", ["--admin"])):
        assert main(["users", "add", name, "-p", str(project), *options]) == 0
        tokens[name] = capsys.readouterr().out.splitlines()[-1]
    _stored(project, "s-ana", "ana")
    _stored(project, "s-root", "root")
    assert main(["sessions", "--json", "-p", str(project)]) == 0
    assert {row["id"]: row["owner"] for row in json.loads(capsys.readouterr().out)} == {"s-ana": "ana", "s-root": "root"}
    assert main(["sessions", "-p", str(project)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "OWNER" in table[0] and any(line.startswith("s-ana") and " ana " in line for line in table), table
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        as_ana, as_root = ({"Authorization": f"Bearer {tokens[name]}"} for name in ("ana", "root"))
        listed = client.get("/api/sessions", headers=as_root).json()
        assert {row["id"]: row["owner"] for row in listed} == {"s-ana": "ana", "s-root": "root"}, "an admin sees whose each session is"
        assert [row["id"] for row in client.get("/api/sessions", headers=as_ana).json()] == ["s-ana"]
        assert main(["users", "promote", "ana", "-p", str(project)]) == 0
        assert "now an admin" in capsys.readouterr().out
        assert _eventually(lambda: len(client.get("/api/sessions", headers=as_ana).json()) == 2), "promoted: ana sees every session"
        assert main(["users", "demote", "ana", "-p", str(project)]) == 0
        assert _eventually(lambda: [row["id"] for row in client.get("/api/sessions", headers=as_ana).json()] == ["s-ana"]), "demoted again"
        assert main(["users", "expires", "ana", "0.000002", "-p", str(project)]) == 0  # 0.17 s
        time.sleep(0.2)
        assert client.get("/api/sessions", headers=as_ana).status_code == 401
        assert main(["users", "expires", "ana", "never", "-p", str(project)]) == 0
        assert "never expires" in capsys.readouterr().out
        assert client.get("/api/sessions", headers=as_ana).status_code == 200, "an expiry cleared: the token works again"
    assert main(["users", "list", "--json", "-p", str(project)]) == 0
    assert {user["name"]: user["expires_at"] for user in json.loads(capsys.readouterr().out)} == {"ana": None, "root": None}
    assert main(["users", "promote", "nobody", "-p", str(project)]) == 1


def _eventually(check: object, seconds: float = 5.0) -> bool:
    """Whether `check()` comes true within `seconds` (servers trust what they read of the users for two seconds)."""
    import time

    assert callable(check)
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
