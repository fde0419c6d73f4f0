"""Headless Chromium for the page tests: Debian's `chromium` and `chromedriver`, driven by Selenium (no Selenium Manager, no download)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None, reason="Chromium and chromedriver are not installed: apt-get install chromium chromium-driver"
)
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000")


@contextmanager
def chromium(*, self_signed: bool = False) -> Iterator[Any]:
    """A Selenium driver of a fresh headless Chromium, quit on leaving; `self_signed`: it accepts a self-signed certificate (a test's proxy)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, *(["--ignore-certificate-errors"] if self_signed else [])):
        options.add_argument(flag)
    options.accept_insecure_certs = self_signed
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def sign_in_at_the_provider(browser: Any, url: str, login: str, *, patience: float = 60) -> str:
    """Open the page at `url`, press the single sign-on button, sign in as `login` and consent at the provider; the text the browser ends on.

    It ends back on the page: signed in, or at the token form of a refusal. Each step waits up to `patience` seconds.
    """
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.delete_all_cookies()
    browser.get(url + "/")
    WebDriverWait(browser, patience).until(lambda d: d.find_elements(By.ID, "sso")).pop().click()
    WebDriverWait(browser, patience).until(lambda d: d.find_elements(By.NAME, "login")).pop().send_keys(login)
    browser.find_element(By.NAME, "password").send_keys("any password\n")

    def landed(d: Any) -> bool:
        consent = d.find_elements(By.CSS_SELECTOR, "input[name=prompt][value=consent]")
        if consent:
            consent[0].find_element(By.XPATH, "./ancestor::form").submit()
            return False
        return bool(d.current_url.startswith(url) and (d.find_elements(By.ID, "new-session") or d.find_elements(By.NAME, "token")))

    try:
        WebDriverWait(browser, patience).until(landed)
    except TimeoutException:
        raise AssertionError(
            f"not back on the page from the provider; the browser shows {browser.current_url}: {browser.find_element(By.TAG_NAME, 'body').text}"
        ) from None
    return str(browser.find_element(By.TAG_NAME, "body").text)
