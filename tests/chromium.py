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
