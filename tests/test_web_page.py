"""The page in a real headless Chromium (Debian's `chromium` and `chromedriver`, driven by Selenium).

Open the page, start a session, ask, and see the streamed answer and the plot image in the page.
Skipped where Chromium is not installed (`.ci/run` installs it). `TWL_SCREENSHOT=path.png` saves
what the browser shows (the README's screenshot comes from here).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import NEEDS_CHROMIUM, chromium
from helpers import make_project

from taskweaver_lite.cli.main import main
from taskweaver_lite.config.file import load_config
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply
from taskweaver_lite.testing.web_server import WebServer

pytestmark = [pytest.mark.kernel, NEEDS_CHROMIUM]

PLOT = (
    "import pandas as pd\nimport matplotlib.pyplot as plt\n"
    "sales = pd.DataFrame({'region': ['north', 'south', 'east'], 'growth': [0.12, 0.31, 0.08]})\n"
    "ax = sales.plot.bar(x='region', y='growth', legend=False)\nax.set_title('Growth by region')\n"
    "plt.savefig('growth.png')\nplt.show()\nsales.sort_values('growth', ascending=False)"
)


@pytest.fixture(scope="module")
def chromium_for_the_module() -> Iterator[Any]:
    """One Chromium for the module's tests (a start costs about a second of CPU): each test's server is a new origin."""
    with chromium() as driver:
        yield driver


@pytest.fixture
def browser(chromium_for_the_module: Any) -> Iterator[object]:
    """The module's Chromium on a blank page, left there again after the test, with no dialog open and no cookie kept."""
    from selenium.common.exceptions import NoAlertPresentException

    driver = chromium_for_the_module
    driver.get("about:blank")
    yield driver
    with contextlib.suppress(NoAlertPresentException):
        driver.switch_to.alert.dismiss()  # a test that failed with its dialog open
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})


def test_ask_in_the_page_and_see_the_answer_and_the_plot(tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    with ScriptedServer() as scripted:
        scripted.enqueue("planner", planner_reply("Plot the growth of each region as a bar chart and show the table sorted by growth."))
        scripted.enqueue("planner", planner_reply("South grew fastest (31%), then north (12%) and east (8%). The chart is growth.png.", send_to="User"))
        scripted.enqueue("code_generator", code_reply(PLOT))
        with WebServer(load_config(make_project(tmp_path, scripted.url))) as web:
            browser.get(web.url + "/")
            wait = WebDriverWait(browser, 60)
            browser.find_element(By.ID, "new-session").click()
            wait.until(lambda d: d.find_element(By.ID, "text").is_enabled())
            browser.find_element(By.ID, "text").send_keys("Which region grew fastest? Plot it.\n")
            wait.until(lambda d: "South grew fastest" in d.find_element(By.ID, "chat").text)
            image = browser.find_element(By.CSS_SELECTOR, "#chat img")
            wait.until(lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", image))
            assert browser.find_element(By.CSS_SELECTOR, "#chat iframe.table"), "the DataFrame is shown as a table"
            assert browser.find_element(By.CSS_SELECTOR, "pre.code .kw"), "the code is highlighted"
            if os.environ.get("TWL_SCREENSHOT"):
                shot = Path(os.environ["TWL_SCREENSHOT"])
                browser.execute_script("document.getElementById('chat').scrollTop = 0;")
                browser.save_screenshot(str(shot.with_stem(shot.stem + "-step")))
                browser.execute_script("const c = document.getElementById('chat'); c.scrollTop = c.scrollHeight;")
                browser.save_screenshot(str(shot))
            browser.refresh()  # a reloaded page shows the session as it is
            wait.until(lambda d: "South grew fastest" in d.find_element(By.ID, "chat").text)


def test_save_experience_in_the_page_shows_the_tips_saved(tmp_path: Path, browser: object) -> None:
    import json

    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    with ScriptedServer() as scripted:
        scripted.enqueue("planner", planner_reply("Totals are in euros.", send_to="User"))
        scripted.enqueue("other", json.dumps({"tips": [{"kind": "preference", "text": "The user wants totals in euros."}]}))
        with WebServer(load_config(make_project(tmp_path, scripted.url))) as web:
            browser.get(web.url + "/")
            wait = WebDriverWait(browser, 60)
            browser.find_element(By.ID, "new-session").click()
            wait.until(lambda d: d.find_element(By.ID, "text").is_enabled())
            browser.find_element(By.ID, "text").send_keys("Totals in euros, please.\n")
            wait.until(lambda d: "Totals are in euros." in d.find_element(By.ID, "chat").text)
            browser.find_element(By.ID, "save-experience").click()
            wait.until(lambda d: "Saved 1 tip for later sessions" in d.find_element(By.ID, "chat").text)
            assert "#1 preference: The user wants totals in euros." in browser.find_element(By.ID, "chat").text


MARKDOWN_ANSWER = (
    "**South** grew fastest.\n\n"
    "| region | growth |\n|---|---|\n| south | 0.31 |\n| north | 0.12 |\n\n"
    "```\nregion  growth\nsouth     0.31\n```\n\n"
    "<data>\nraw output\n</data>\n\n"
    '<img src="x" onerror="window.pwned = 1"> <script>window.pwned = 2</script> '
    '[click](javascript:window.pwned=3) <b onclick="window.pwned=4">bold tag</b>'
)
TALL = "import pandas as pd\npd.DataFrame({'n': range(60), 'square': [i * i for i in range(60)]})"
SHORT = "import pandas as pd\npd.DataFrame({'n': range(8)}).describe()"


def _ask(browser: object, web: WebServer, text: str, until: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    browser.get(web.url + "/")
    wait = WebDriverWait(browser, 60)
    browser.find_element(By.ID, "new-session").click()
    wait.until(lambda d: d.find_element(By.ID, "text").is_enabled())
    browser.find_element(By.ID, "text").send_keys(text + "\n")
    wait.until(lambda d: until in d.find_element(By.ID, "chat").text)


def test_the_planners_markdown_is_rendered_and_its_raw_html_never_becomes_markup(tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    with ScriptedServer() as scripted:
        scripted.enqueue("planner", planner_reply(MARKDOWN_ANSWER, send_to="User"))
        with WebServer(load_config(make_project(tmp_path, scripted.url))) as web:
            _ask(browser, web, "Which region grew fastest?", "South grew fastest")
            answer = browser.execute_script("const m = [...document.querySelectorAll('.msg.planner .md')]; return m[m.length - 1];")
            assert browser.execute_script("return arguments[0].querySelector('strong').textContent", answer) == "South", "bold is bold"
            assert browser.execute_script("return arguments[0].querySelectorAll('table tr').length", answer) == 3, "a Markdown table is a table"
            font = browser.execute_script("return getComputedStyle(arguments[0].querySelector('table')).fontFamily", answer)
            assert "monospace" in font, f"tables are set in a monospace face, not {font}"
            fence = browser.execute_script("return arguments[0].querySelector('pre code').textContent", answer)
            assert "south     0.31" in fence, "a code fence keeps its layout"
            text = browser.execute_script("return arguments[0].textContent", answer)
            assert "<data>" not in text and "raw output" in text, "the prompt's data markers are not shown"
            assert '<img src="x"' in text and "<script>" in text, "raw HTML from the model is shown as the text it is"
            assert browser.execute_script("return arguments[0].querySelector('img, script, b[onclick], [onerror]')", answer) is None
            assert browser.execute_script("return [...arguments[0].querySelectorAll('a')].every(a => !a.href.startsWith('javascript'))", answer)
            assert browser.execute_script("return window.pwned") is None, "nothing the model wrote ran"
            _screenshot(browser, "markdown")


def test_a_dataframe_is_as_tall_as_its_rows_up_to_a_limit_and_scrolls_past_it(tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    with ScriptedServer() as scripted:
        scripted.enqueue("planner", planner_reply("Describe n."), planner_reply("Described.", send_to="User"))
        scripted.enqueue("planner", planner_reply("Show the squares."), planner_reply("Here are the squares.", send_to="User"))
        scripted.enqueue("code_generator", code_reply(SHORT), code_reply(TALL))
        with WebServer(load_config(make_project(tmp_path, scripted.url))) as web:
            _ask(browser, web, "Describe n", "Described.")
            wait = WebDriverWait(browser, 60)
            browser.find_element(By.ID, "text").send_keys("Show the squares\n")
            wait.until(lambda d: "Here are the squares." in d.find_element(By.ID, "chat").text)
            frames = browser.find_elements(By.CSS_SELECTOR, "#chat iframe.table")
            assert len(frames) == 2
            wait.until(lambda d: all(d.execute_script("return arguments[0].style.height", f) for f in frames))
            short, tall = (browser.execute_script("return arguments[0].getBoundingClientRect().height", f) for f in frames)
            inner = browser.execute_script("return arguments[0].contentDocument.documentElement.scrollHeight", frames[0])
            assert short >= inner, f"describe() is shown whole ({short} px for {inner} px of table: its max row is not cut)"
            assert "max" in browser.execute_script("return arguments[0].contentDocument.body.textContent", frames[0])
            assert short != 160 and short < 480, "the frame takes the table's height, not a fixed one"
            assert tall == 480, f"sixty rows stop at the limit ({tall} px)"
            assert browser.execute_script("const d = arguments[0].contentDocument.documentElement; return d.scrollHeight > d.clientHeight", frames[1])
            _screenshot(browser, "tables")


def _screenshot(browser: object, name: str) -> None:
    """With TWL_SCREENSHOT=path.png, save what the browser shows beside it, named for the test."""
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    if os.environ.get("TWL_SCREENSHOT"):
        shot = Path(os.environ["TWL_SCREENSHOT"])
        browser.save_screenshot(str(shot.with_stem(f"{shot.stem}-{name}")))


SUGGESTED = ["Which region grew fastest?", "Plot monthly revenue by region."]


def test_an_empty_session_lists_the_suggested_requests_and_a_click_asks_one(tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    with ScriptedServer() as scripted:
        scripted.enqueue("planner", planner_reply("Revenue by region, plotted.", send_to="User"), planner_reply("South grew fastest.", send_to="User"))
        project = make_project(tmp_path, scripted.url, session={"suggested_requests": SUGGESTED})
        with WebServer(load_config(project)) as web:
            browser.get(web.url + "/")
            wait = WebDriverWait(browser, 60)
            browser.find_element(By.ID, "new-session").click()
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chat .suggestions button"))
            buttons = browser.find_elements(By.CSS_SELECTOR, "#chat .suggestions button")
            assert [b.text for b in buttons] == SUGGESTED, "the empty session shows the requests it knows"
            _screenshot(browser, "suggestions")
            buttons[1].click()
            wait.until(lambda d: "Revenue by region, plotted." in d.find_element(By.ID, "chat").text)
            assert not browser.find_elements(By.CSS_SELECTOR, "#chat .suggestions"), "the list goes once a request is asked"
            assert "You\nPlot monthly revenue by region." in browser.find_element(By.ID, "chat").text
            browser.find_element(By.ID, "text").send_keys("1\n")  # a number asks the request it names
            wait.until(lambda d: "South grew fastest." in d.find_element(By.ID, "chat").text)
            assert "You\nWhich region grew fastest?" in browser.find_element(By.ID, "chat").text, "the request, not '1'"


def test_a_long_title_without_spaces_wraps_and_one_request_is_singular(tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    long_title = "sales_" * 60
    with ScriptedServer() as scripted:
        scripted.enqueue("planner", planner_reply("Noted: " + "revenue_" * 60, send_to="User"))
        with WebServer(load_config(make_project(tmp_path, scripted.url))) as web:
            _ask(browser, web, long_title, "Noted:")
            wait = WebDriverWait(browser, 60)
            wait.until(lambda d: "1 request ·" in d.find_element(By.ID, "sessions").text)
            assert "1 requests" not in browser.find_element(By.ID, "sessions").text
            wide = browser.execute_script(
                "const over = (e) => e.scrollWidth > e.clientWidth + 1;"
                "const boxes = [document.documentElement, ...document.querySelectorAll('#sidebar, #sidebar li, #toolbar, #chat, .msg')];"
                "return boxes.filter(over).map((e) => e.id || e.className || e.tagName)"
            )
            assert wide == [], f"wider than their boxes: {wide}"
            _screenshot(browser, "long-title")


FILES = (
    "import os\nimport pandas as pd\n"
    "pd.DataFrame({'region': ['south'], 'growth': [0.31]}).to_csv('growth.csv', index=False)\nprint(os.path.abspath('growth.csv'))"
)


def _where(messages: list[dict[str, object]]) -> str:
    """The Planner's answer: names the file by its server path and by its bare name, and a path outside the session."""
    report = next(str(m["content"]) for m in reversed(messages) if str(m.get("content", "")).startswith("CodeInterpreter:"))
    path = next(line.strip() for line in report.splitlines() if line.strip().endswith("/growth.csv"))
    return planner_reply(f"Saved to {path}. Open `growth.csv` for the table; /etc/hostname and other.csv are not the session's.", send_to="User")


def test_file_paths_in_an_answer_link_to_the_sessions_artifact(tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    with ScriptedServer() as scripted:
        scripted.enqueue("planner", planner_reply("Save the growth table as growth.csv."), _where)
        scripted.enqueue("code_generator", code_reply(FILES))
        with WebServer(load_config(make_project(tmp_path, scripted.url))) as web:
            _ask(browser, web, "Save the growth table", "Saved to")
            answer = browser.execute_script("const m = [...document.querySelectorAll('.msg.planner .md')]; return m[m.length - 1];")
            links = browser.execute_script(
                "return [...arguments[0].querySelectorAll('a')].map((a) => [a.textContent, a.getAttribute('href'), a.title])", answer
            )
            assert [text for text, _, _ in links] == ["growth.csv", "growth.csv"], "a server path is linked by its file's name, not the folder's path"
            assert links[0][2].endswith("/growth.csv") and links[0][2].startswith("/"), "the path stays in the link's tooltip"
            assert all(href.endswith("/artifacts/growth.csv") for _, href, _ in links), links
            _screenshot(browser, "file-links")
            served = browser.execute_script("return fetch(arguments[0]).then((r) => r.text())", links[0][1])
            assert served.startswith("region,growth"), served
            browser.refresh()  # a reloaded session (its address names it) links them too
            WebDriverWait(browser, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.planner a.file")) == 2)


def test_delete_in_the_page_asks_first_then_the_session_is_gone_from_the_list(tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    with ScriptedServer() as scripted:
        scripted.set_default("planner", planner_reply("Noted.", send_to="User"))
        with WebServer(load_config(make_project(tmp_path, scripted.url))) as web:
            _ask(browser, web, "remember this", until="Noted.")
            wait = WebDriverWait(browser, 60)
            wait.until(lambda d: "remember this" in d.find_element(By.ID, "sessions").text)
            browser.find_element(By.ID, "delete-session").click()
            browser.switch_to.alert.dismiss()  # asked first: no means nothing happens
            assert "Noted." in browser.find_element(By.ID, "chat").text
            browser.find_element(By.ID, "delete-session").click()
            browser.switch_to.alert.accept()
            wait.until(lambda d: "The session was deleted." in d.find_element(By.ID, "notice").text)
            wait.until(lambda d: "remember this" not in d.find_element(By.ID, "sessions").text)
            assert browser.find_element(By.ID, "chat").text == "" and not browser.find_element(By.ID, "delete-session").is_enabled()


# Where Sign out is when the page's document has loaded, before it knows who signed in (Admin and New token come after).
_RECORD_SIGN_OUT = (
    "document.addEventListener('DOMContentLoaded', () => {"
    " const r = document.querySelector('#sign-out button').getBoundingClientRect(); window.twlSignOutAtLoad = [r.left, r.top]; });"
)


@pytest.mark.parametrize("width", [1280, 900])
def test_sign_out_keeps_its_place_when_admin_and_new_token_appear_after_sign_in(
    tmp_path: Path, browser: object, capsys: pytest.CaptureFixture[str], width: int
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    project = make_project(tmp_path, "http://127.0.0.1:9")  # no model is called
    assert main(["users", "add", "boss", "--admin", "-p", str(project)]) == 0
    token = capsys.readouterr().out.splitlines()[-1]
    recorder = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _RECORD_SIGN_OUT})
    size = browser.get_window_size()
    browser.set_window_size(width, 800)
    try:
        with WebServer(load_config(project)) as web:
            browser.get(web.url + "/")
            browser.find_element(By.NAME, "token").send_keys(token + "\n")
            shown = WebDriverWait(browser, 60).until(
                lambda d: d.find_element(By.ID, "admin-link").is_displayed() and d.find_element(By.ID, "new-token").is_displayed()
            )
            assert shown
            at_load = browser.execute_script("return window.twlSignOutAtLoad")
            now = browser.execute_script("const r = document.querySelector('#sign-out button').getBoundingClientRect(); return [r.left, r.top];")
            assert at_load is not None and now == at_load, f"Sign out moved from {at_load} to {now} once Admin and New token appeared"
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": recorder["identifier"]})
        browser.set_window_size(size["width"], size["height"])
