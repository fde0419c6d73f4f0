"""The shipped deploy files, run: nginx (Debian's) with TLS in front of two replicas on PostgreSQL and a kernel gateway.

`deploy/nginx.conf` is used as shipped with only its addresses and paths rewritten (the replicas'
ports, the listening address, the certificate's files); the certificate is self-signed, made here
with openssl. The replicas start with the `--host` compose gives them. The page is driven in
headless Chromium through the proxy: sign in, new session, ask, upload; then a replica dies under a
running request and the page must recover on the other. Skipped without nginx, openssl or Chromium.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chromium import NEEDS_CHROMIUM, chromium, sign_in_at_the_provider
from helpers import OIDC_PROVIDER_MODULE, oidc_provider

from taskweaver_lite.kernel.gateway.remote import REMOTE_SESSIONS
from taskweaver_lite.store.postgres import PostgresStore
from taskweaver_lite.testing.kernel_gateway import Gateway, free_port, kernel_gateway
from taskweaver_lite.testing.postgres_cluster import PostgresCluster, binaries
from taskweaver_lite.testing.replicas import ServeProcess, run_code_model, write_team_project
from taskweaver_lite.testing.scripted_server import ScriptedServer

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
OPENSSL = shutil.which("openssl")
NEEDS_NGINX = pytest.mark.skipif(NGINX is None or OPENSSL is None, reason="nginx and openssl are not installed: apt-get install nginx openssl")
# A browser, nginx, two replicas and a gateway on a loaded machine: more than the usual 120 s per test.
pytestmark = [pytest.mark.team, pytest.mark.timeout(300), NEEDS_NGINX, NEEDS_CHROMIUM]
REPO = Path(__file__).resolve().parent.parent
LEASE = 3.0  # serve.lease_timeout: a dead replica's session is free after this
METRICS_TOKEN = "prometheus-only"
SSO_SECRET = "the-deployment-tests-client-secret-0123456789"
SSO_ACCOUNTS = {"dora": {"email": "dora@example.org", "groups": ["analysts"]}}


class Deployment:
    """The running service: two replicas, nginx in front at `url` (https), a user's token, the cluster."""

    def __init__(
        self, root: Path, project: Path, token: str, replicas: list[ServeProcess], *, store_url: str, gateway: Gateway, port: int | None = None
    ) -> None:
        self.root = root
        self.project = project
        self.token = token
        self.admin_token = ""
        self.store_url = store_url
        self.gateway = gateway
        self.replicas = replicas
        self.port = port or free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.sso = False  # serve.oidc is set, with oidc-provider running
        self.nginx = _start_nginx(root / "nginx", port=self.port, replicas=[replica.port for replica in replicas])

    def client(self, **headers: str) -> httpx.Client:
        """A client of the proxy (the self-signed certificate accepted), as the user."""
        return httpx.Client(base_url=self.url, verify=False, timeout=90, headers={"Authorization": f"Bearer {self.token}", **headers})

    def close(self) -> None:
        self.nginx.terminate()
        self.nginx.wait(30)
        for replica in self.replicas:
            replica.stop()


def _rewritten_nginx_conf(folder: Path, *, port: int, replicas: list[int]) -> str:
    """deploy/nginx.conf with its addresses and paths, and nothing else, changed for this machine."""
    shipped = (REPO / "deploy" / "nginx.conf").read_text(encoding="utf-8")
    text = shipped.replace("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")
    text = text.replace("/etc/nginx/tls/fullchain.pem", str(folder / "cert.pem")).replace("/etc/nginx/tls/privkey.pem", str(folder / "key.pem"))
    for number, replica_port in enumerate(replicas, 1):
        text = text.replace(f"server replica{number}:8800", f"server 127.0.0.1:{replica_port}")
    assert text.count("127.0.0.1") == 1 + len(replicas) and str(folder) in text, "the shipped nginx.conf changed: update the rewrite"
    return text


def _start_nginx(folder: Path, *, port: int, replicas: list[int]) -> subprocess.Popen[bytes]:
    folder.mkdir(parents=True)
    subprocess.run(
        [str(OPENSSL), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (folder / "site.conf").write_text(_rewritten_nginx_conf(folder, port=port, replicas=replicas), encoding="utf-8")
    temp = "\n".join(f"    {kind}_temp_path {folder / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    user = "user root;\n" if os.geteuid() == 0 else ""  # the workers as the test's user: they write the temp folders made here
    main = (
        f"{user}worker_processes 1;\npid {folder / 'nginx.pid'};\nerror_log {folder / 'error.log'} warn;\nevents {{ worker_connections 256; }}\n"
        f"http {{\n    access_log {folder / 'access.log'};\n{temp}\n    include {folder / 'site.conf'};\n}}\n"
    )
    (folder / "nginx.conf").write_text(main, encoding="utf-8")
    assert NGINX is not None
    process = subprocess.Popen([NGINX, "-p", str(folder), "-e", str(folder / "error.log"), "-c", str(folder / "nginx.conf"), "-g", "daemon off;"])
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None and time.monotonic() < deadline, (folder / "error.log").read_text() if (folder / "error.log").exists() else "nginx ended"
        try:
            httpx.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2)
            return process
        except httpx.TransportError:
            time.sleep(0.2)


def _shipped_trusted_proxies() -> list[str]:
    """deploy/project's serve.trusted_proxies with compose's proxy address as this machine's (nginx runs on 127.0.0.1 here)."""
    shipped = yaml.safe_load((REPO / "deploy" / "project" / "taskweaver_config.yaml").read_text())["serve"]["trusted_proxies"]
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    proxy = compose["services"]["proxy"]["networks"]["default"]["ipv4_address"]
    assert proxy in shipped, "the shipped config must trust the proxy at the address compose gives it"
    return ["127.0.0.1" if entry == proxy else entry for entry in shipped]


def _compose_host() -> str:
    """The `--host` compose.yaml starts the replicas with (they run here with it)."""
    command = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())["services"]["replica1"]["command"]
    return str(command[command.index("--host") + 1])


@pytest.fixture(scope="module")
def deployment(postgres_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("deploy")
    (root / "gateway").mkdir()
    nginx_port, provider_port = free_port(), free_port()
    sso = shutil.which("node") is not None and OIDC_PROVIDER_MODULE.exists()
    provider = (
        oidc_provider(port=provider_port, redirect_uris=[f"https://127.0.0.1:{nginx_port}/oidc/callback"], accounts=SSO_ACCOUNTS, client_secret=SSO_SECRET)
        if sso
        else contextlib.nullcontext("")
    )
    with ScriptedServer() as model, kernel_gateway(root / "gateway") as gateway, provider as issuer:
        run_code_model(model)
        url = postgres_cluster.new_database()
        project = write_team_project(root / "project", store_url=url, gateway=gateway, model_url=model.url, lease_timeout=LEASE)
        config = yaml.safe_load((project / "taskweaver_config.yaml").read_text())
        config["serve"]["metrics_token"] = METRICS_TOKEN
        config["serve"]["trusted_proxies"] = _shipped_trusted_proxies()
        if sso:
            config["serve"]["oidc"] = {"issuer": issuer, "client_id": "taskweaver", "client_secret": SSO_SECRET, "allowed_groups": ["analysts"]}
            config["serve"]["oidc"]["scopes"] = ["openid", "email", "profile", "groups"]  # the provider sends groups with this scope
        (project / "taskweaver_config.yaml").write_text(yaml.safe_dump(config))
        added = subprocess.run(
            [sys.executable, "-m", "taskweaver_lite", "users", "add", "alice", "-p", str(project)], capture_output=True, text=True, timeout=60
        )
        assert added.returncode == 0, added.stderr
        boss = subprocess.run(
            [sys.executable, "-m", "taskweaver_lite", "users", "add", "boss", "--admin", "-p", str(project)], capture_output=True, text=True, timeout=60
        )
        assert boss.returncode == 0, boss.stderr
        replicas = ServeProcess.start_several(project, 2, args=("--host", _compose_host()))
        service = Deployment(root, project, added.stdout.strip().splitlines()[-1], replicas, store_url=url, gateway=gateway, port=nginx_port)
        service.admin_token = boss.stdout.strip().splitlines()[-1]
        service.sso = sso
        try:
            yield service
        finally:
            service.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium(self_signed=True) as driver:  # the proxy's certificate is self-signed
        yield driver


def _sign_in_by_the_form(browser: Any, deployment: Deployment, token: str | None = None) -> None:
    """Open the page and sign in as a person does: the token pasted into the form, Enter."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.delete_all_cookies()
    browser.get(f"{deployment.url}/")
    field = WebDriverWait(browser, 60).until(lambda d: d.find_element(By.NAME, "token"))
    field.send_keys((token or deployment.token) + "\n")
    try:
        WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.ID, "new-session"))
    except TimeoutException:
        raise AssertionError(f"the form did not sign in; the browser shows: {browser.find_element(By.TAG_NAME, 'body').text}") from None


def _open_new_session(browser: Any, deployment: Deployment) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _sign_in_by_the_form(browser, deployment)
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: d.find_element(By.ID, "new-session").is_enabled())
    browser.find_element(By.ID, "new-session").click()
    wait.until(lambda d: d.find_element(By.ID, "text").is_enabled() and "#" in d.current_url)
    return str(browser.current_url.rsplit("#", 1)[1])


def _wait(browser: Any, condition: Any, what: str, *, seconds: float = 90) -> None:
    """Until `condition(browser)`; else an AssertionError naming `what`, with the page's chat and notice."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(browser, seconds).until(condition)
    except TimeoutException:
        shown = browser.find_element(By.ID, "notice").get_attribute("textContent")
        raise AssertionError(f"{what}; the page shows:\n{_chat(browser)}\nnotice: {shown}") from None


def _last_to_answer(deployment: Deployment, session_id: str) -> ServeProcess:
    """The replica whose access log has the session's latest message (the lines start with the time)."""
    marker = f"POST /api/sessions/{session_id}/messages"
    stamped = [(line, replica) for replica in deployment.replicas for line in replica.access_log.read_text().splitlines() if marker in line]
    return max(stamped, key=lambda pair: pair[0].split()[0])[1]


def _chat(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.ID, "chat").text)


def test_the_page_through_nginx_over_tls_signs_in_asks_and_uploads(deployment: Deployment, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    session_id = _open_new_session(browser, deployment)  # a POST: refused as "from other sites" without X-Forwarded-Proto and the port in Host
    browser.find_element(By.ID, "text").send_keys("RUN<<x = 6 * 7; print('x is', x)>>\n")  # one line: Enter sends
    _wait(browser, lambda d: "x is 42" in _chat(d) and d.find_element(By.ID, "send").is_enabled(), "the answer through the proxy")
    data = tmp_path / "numbers.csv"
    data.write_text("n\n1\n2\n3\n")
    field = browser.find_element(By.ID, "file")
    browser.execute_script("arguments[0].hidden = false;", field)
    field.send_keys(str(data))
    _wait(browser, lambda d: "Loaded numbers.csv" in _chat(d), "the upload through the proxy")
    browser.find_element(By.ID, "text").send_keys("RUN<<print('rows', len(open('numbers.csv').read().split()) - 1, x)>>\n")
    _wait(browser, lambda d: "rows 3 42" in _chat(d), "the uploaded file must be in the kernel's folder")
    assert "other sites" not in _chat(browser)
    with deployment.client() as client:
        assert session_id in [row["id"] for row in client.get("/api/sessions").json()]
        uploads = [load["name"] for load in client.get(f"/api/sessions/{session_id}").json()["loads"]]
        assert uploads == ["numbers.csv"]
    # The gateway loses the session's kernel and its folder: the upload comes back from the store before the cells are replayed.
    store = PostgresStore(deployment.store_url)
    try:
        kernel_id = store.load(session_id).kernel_id
    finally:
        store.close()
    gone = httpx.delete(f"{deployment.gateway.url}/api/kernels/{kernel_id}", headers={"Authorization": f"token {deployment.gateway.token}"}, timeout=30)
    assert gone.status_code == 204, gone.text
    shutil.rmtree(deployment.gateway.root / REMOTE_SESSIONS / session_id)
    # Asked of the replica that did not answer last: its copy is stale, so it loads the session onto a new kernel.
    other = next(r for r in deployment.replicas if r is not _last_to_answer(deployment, session_id))
    with (
        httpx.Client(base_url=other.url, headers={"Authorization": f"Bearer {deployment.token}"}, timeout=120) as direct,
        direct.stream(
            "POST", f"/api/sessions/{session_id}/messages", json={"text": "RUN<<print('again', len(open('numbers.csv').read().split()) - 1, x)>>"}
        ) as answer,
    ):
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    assert events and "again 3 42" in events[-1].get("text", ""), (
        f"a new kernel must get the upload back from the store, then the replayed variables: {events[-1:]}"
    )
    # pg_dump holds the upload's bytes: a backup of the database is a backup of the sessions' files.
    bin_dir = binaries()
    assert bin_dir is not None
    dump = subprocess.run([str(bin_dir / "pg_dump"), "--data-only", "--table=blobs", deployment.store_url], capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    assert data.read_bytes().hex() in dump.stdout, "the upload's bytes must be in the database's dump"
    # compose.yaml's healthcheck, as it is, against a replica here.
    probe = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())["services"]["replica1"]["healthcheck"]["test"]
    code = probe[3].replace("127.0.0.1:8800", f"127.0.0.1:{deployment.replicas[0].port}")
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0


def test_the_page_signs_in_by_its_form_and_out_through_nginx_and_the_signed_out_cookie_is_then_refused(deployment: Deployment, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    _sign_in_by_the_form(browser, deployment)  # Chromium sends the form's Origin (a page with no-referrer would send `Origin: null`: 403)
    (cookie,) = [c for c in browser.get_cookies() if c["name"] == "twl_sign_in"]
    assert cookie["secure"] and cookie["httpOnly"], f"behind the shipped nginx with TLS the sign-in cookie is Secure: {cookie}"
    assert deployment.token not in cookie["value"]
    nginx_log = (deployment.root / "nginx" / "access.log").read_text()
    assert deployment.token not in nginx_log and deployment.token.split("_", 2)[2] not in nginx_log, "the token never reaches the proxy's log"
    with httpx.Client(base_url=deployment.url, verify=False, timeout=60, cookies={"twl_sign_in": cookie["value"]}) as kept:
        assert kept.get("/api/sessions").status_code == 200, "the cookie signs the API in, on either replica"
        # The page has learnt who is signed in (Admin and New token appear left of Sign out, which keeps its place).
        _wait(browser, lambda d: d.find_element(By.ID, "new-token").is_displayed(), "the page's header naming who is signed in", seconds=60)
        browser.find_element(By.CSS_SELECTOR, "#sign-out button").click()
        _wait(browser, lambda d: d.find_elements(By.NAME, "token"), "the sign-in page after signing out", seconds=60)
        assert "other sites" not in browser.page_source, "the sign-out form is same-origin"
        for _ in deployment.replicas:  # round robin: each replica refuses it
            assert kept.get("/api/sessions").status_code == 401, "after sign-out the cookie is refused, even by a client that kept it"
    store = PostgresStore(deployment.store_url)
    try:
        entries = store.audit_entries()
    finally:
        store.close()
    actions = [(entry.actor, entry.action) for entry in entries]
    assert ("alice", "sign-in") in actions and ("alice", "sign-out") in actions, actions
    assert all(entry.source == "127.0.0.1" for entry in entries if entry.action == "sign-in"), "the client, as X-Forwarded-For names it"


def test_the_admin_page_through_nginx_lists_the_users_sessions_kernels_usage_and_the_audit(deployment: Deployment, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    session_id = _open_new_session(browser, deployment)  # alice's session, with a kernel on the gateway
    browser.find_element(By.ID, "text").send_keys("RUN<<print('for the admin', 6 * 7)>>\n")
    _wait(browser, lambda d: "for the admin 42" in _chat(d) and d.find_element(By.ID, "send").is_enabled(), "alice's answer")
    assert not browser.find_element(By.ID, "admin-link").is_displayed(), "no admin link for a user"
    _sign_in_by_the_form(browser, deployment, deployment.admin_token)
    _wait(browser, lambda d: d.find_element(By.ID, "admin-link").is_displayed(), "the admin link for an admin")
    browser.find_element(By.ID, "admin-link").click()

    def table(name: str) -> str:
        return str(browser.find_element(By.ID, name).text)

    _wait(browser, lambda d: "alice" in table("users") and "boss" in table("users"), "the users on the admin page")
    _wait(browser, lambda d: session_id in table("sessions") and "sign-in" in table("audit"), "the sessions and the audit on the admin page")
    _wait(browser, lambda d: session_id in table("kernels"), "alice's kernel on the gateway, with its session")
    assert "alice" in [line.split()[0] for line in table("kernels").splitlines()[1:]], table("kernels")
    assert "scripted" in table("usage") and "alice" in table("usage"), table("usage")
    audit = table("audit")
    assert "boss" in audit and "alice" in audit, audit
    # An admin adds a user on the page: the token is shown once, and the audit names boss as the actor.
    browser.find_element(By.ID, "new-name").send_keys("carl")
    browser.find_element(By.CSS_SELECTOR, "#add-user button").click()
    _wait(browser, lambda d: d.find_element(By.ID, "token-value").text.startswith("twl_") and "carl" in table("users"), "carl added with a token")
    _wait(browser, lambda d: any(line.split()[2:4] == ["boss", "user-added"] for line in table("audit").splitlines()), "the page's change in the audit")


def test_the_page_signs_in_through_the_openid_provider_behind_nginx_with_a_secure_cookie(deployment: Deployment, browser: Any) -> None:
    if not deployment.sso:
        pytest.skip("oidc-provider is not in build/npm (.ci/run installs it)")
    sign_in_at_the_provider(browser, deployment.url, "dora")
    (cookie,) = [c for c in browser.get_cookies() if c["name"] == "twl_sign_in"]
    assert cookie["secure"] and cookie["httpOnly"], cookie
    with httpx.Client(base_url=deployment.url, verify=False, timeout=60, cookies={"twl_sign_in": cookie["value"]}) as client:
        for _ in deployment.replicas:  # either replica knows the sign-in the other made
            assert client.get("/api/sessions").status_code == 200
    store = PostgresStore(deployment.store_url)
    try:
        dora = store.user_by_name("dora@example.org")
        entries = [(e.actor, e.action, e.target) for e in store.audit_entries()]
    finally:
        store.close()
    assert dora is not None and not dora.admin, "added at her first sign-in"
    assert ("dora@example.org", "sign-in", "dora@example.org") in entries, entries


def test_metrics_answer_the_scrapers_token_through_the_proxy_while_the_store_is_down(deployment: Deployment, postgres_cluster: PostgresCluster) -> None:
    with deployment.client() as user, deployment.client(Authorization=f"Bearer {METRICS_TOKEN}") as scraper:
        session_id = user.post("/api/sessions", json={}).json()["id"]
        with user.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "just a question"}) as response:
            assert response.status_code == 200, response.read()
            response.read()
        assert scraper.get("/api/sessions").status_code == 401, "the scraper's token opens /metrics alone"
        postgres_cluster.stop()
        try:
            for _ in deployment.replicas:  # round robin: each replica answers once
                scraped = scraper.get("/metrics")
                assert scraped.status_code == 200, f"/metrics must answer while the store is down: {scraped.text}"
                assert "taskweaver_build_info{" in scraped.text and "process_resident_memory_bytes" in scraped.text
            assert scraper.get("/healthz").status_code == 503
        finally:
            postgres_cluster.start_again()
        for replica in deployment.replicas:
            deadline = time.monotonic() + 30
            while httpx.get(replica.url + "/healthz", timeout=10).status_code != 200:
                assert time.monotonic() < deadline, "the replicas must find the store again"
                time.sleep(0.5)
        billed = "".join(httpx.get(replica.url + "/metrics", headers=scraper.headers, timeout=10).text for replica in deployment.replicas)
        assert re.search(r'taskweaver_tokens_total\{kind="prompt",model="scripted",user="alice"\} [1-9]', billed), "tokens by user and model"


def test_a_page_whose_replica_dies_mid_request_recovers_on_the_other(deployment: Deployment, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    session_id = _open_new_session(browser, deployment)
    browser.find_element(By.ID, "text").send_keys("RUN<<kept = 5; print('kept is', kept)>>\n")  # stored as run: rebuilt by a replay if need be
    _wait(browser, lambda d: "kept is 5" in _chat(d) and d.find_element(By.ID, "send").is_enabled(), "the first answer")
    browser.find_element(By.ID, "text").send_keys("RUN<<import time; print('started', flush=True); time.sleep(300)>>\n")
    _wait(browser, lambda d: "started" in _chat(d), "the cell must start")
    (running,) = [r for r in deployment.replicas if f"POST /api/sessions/{session_id}/messages" in (r.access_log.read_text() if r.access_log.exists() else "")]
    running.kill()
    killed = time.monotonic()
    # Within the lease (3 s here) and the page's watch (every 3 s): Send is back, and the page says what happened.
    recovered = "the page must enable Send and say the request's server stopped"
    _wait(browser, lambda d: d.find_element(By.ID, "send").is_enabled() and "stopped before it finished" in d.find_element(By.ID, "notice").text, recovered)
    assert time.monotonic() - killed < 30, "the page must not wait for a reload"
    browser.find_element(By.ID, "text").send_keys("RUN<<print('after', kept * 2)>>\n")
    _wait(browser, lambda d: "after 10" in _chat(d), "the next request must be answered by the other replica, with the variables")


def test_the_shipped_proxy_keeps_each_session_on_one_replica(deployment: Deployment) -> None:
    with deployment.client() as client:
        sessions = [client.post("/api/sessions", json={}).json()["id"] for _ in range(4)]
        for session_id in sessions:
            for n in range(3):
                asked = client.post(f"/api/sessions/{session_id}/messages", json={"text": f"RUN<<x = {n}>>"})
                assert asked.status_code == 200, asked.text
    for session_id in sessions:
        marker = f"POST /api/sessions/{session_id}/messages"
        answered_by = {replica.port for replica in deployment.replicas if marker in replica.access_log.read_text()}
        assert len(answered_by) == 1, f"session {session_id}'s requests went to replicas {sorted(answered_by)}: the proxy moves sessions between replicas"


def test_a_stopping_replica_answers_503_stopping_until_its_request_is_done(deployment: Deployment, tmp_path: Path) -> None:
    leaving = ServeProcess.start(deployment.project, args=("--host", _compose_host()))
    headers = {"Authorization": f"Bearer {deployment.token}"}
    go = tmp_path / "go"  # the cell runs until the test has seen the replica stopping, however busy the machine
    try:
        with httpx.Client(base_url=leaving.url, headers=headers, timeout=90) as client:
            session_id = client.post("/api/sessions", json={}).json()["id"]
            done: list[int] = []
            waiting = f"import os, time\nprint('started', flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
            asked = {"text": f"RUN<<{waiting}>>"}
            running = threading.Thread(target=lambda: done.append(client.post(f"/api/sessions/{session_id}/messages", json=asked).status_code))
            running.start()
            deadline = time.monotonic() + 60
            while not client.get(f"/api/sessions/{session_id}").json()["busy"]:
                assert time.monotonic() < deadline, "the request never started"
                time.sleep(0.2)
            leaving.terminate()
            deadline = time.monotonic() + 30
            while (health := client.get("/healthz")).status_code == 200:  # until the signal is handled; a refused connection fails here
                assert time.monotonic() < deadline, "the replica never began to stop"
                time.sleep(0.05)
            assert health.status_code == 503 and health.json()["status"] == "stopping", health.text
            refused = client.post("/api/sessions", json={})
            assert refused.status_code == 503 and "stopping" in refused.json()["error"], (
                f"a stopping replica answers 503, not a refused connection: {refused.text}"
            )
            assert running.is_alive() and not done, "precondition: the request was still running while the replica refused new ones"
            go.touch()
            running.join(60)
            assert done == [200], "the running request finishes first"
        assert leaving.process.wait(60) in (0, 143, -15) and "Traceback" not in leaving.log(), leaving.log()
    finally:
        leaving.stop()


def test_a_body_past_the_proxys_cap_is_refused_with_json_naming_the_limit(deployment: Deployment) -> None:
    import socket
    import ssl

    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    head = "POST /api/sessions/any/files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nContent-Length: 300000000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", deployment.port), timeout=30) as raw, context.wrap_socket(raw) as sock:
        sock.sendall(head.encode())  # nginx answers from the length alone, before any of the body
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert b" 413 " in status and b"application/json" in rest, answer[:500]
    body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert "client_max_body_size 257m" in body["error"] and "session.max_upload_bytes" in body["error"], body
