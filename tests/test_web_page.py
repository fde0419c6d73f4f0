"""The page in a real headless Chromium (Debian's `chromium` and `chromedriver`, driven by Selenium).

Open the page, start a session, ask, and see the streamed answer and the plot image in the page.
Skipped where Chromium is not installed (`.ci/run` installs it). `TWL_SCREENSHOT=path.png` saves
what the browser shows (the README's screenshot comes from here).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_project

from taskweaver_lite.config import load_config
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply
from taskweaver_lite.testing.web_server import WebServer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None, reason="Chromium and chromedriver are not installed: apt-get install chromium chromium-driver"
)

PLOT = (
    "import pandas as pd\nimport matplotlib.pyplot as plt\n"
    "sales = pd.DataFrame({'region': ['north', 'south', 'east'], 'growth': [0.12, 0.31, 0.08]})\n"
    "ax = sales.plot.bar(x='region', y='growth', legend=False)\nax.set_title('Growth by region')\n"
    "plt.savefig('growth.png')\nplt.show()\nsales.sort_values('growth', ascending=False)"
)


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)  # no Selenium Manager, no download
    try:
        yield driver
    finally:
        driver.quit()


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
