"""Debian's headless chromium driven by selenium (chromium-driver); tests skip when either is missing.

Install both with `tests/browser/install.sh` (CI runs it). The browser runs with a fresh profile and with
background networking, component updates and sync off, so it talks to nothing but the gateway on 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-default-apps",
)  # fmt: skip


def _find(*names: str) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


def missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e .[test])"
    if _find("chromium", "chromium-browser") is None or _find("chromedriver") is None:
        return "chromium and chromedriver are not installed (run tests/browser/install.sh)"
    return None


needs_browser = pytest.mark.skipif(missing() is not None, reason=missing() or "")
"""For tests that take the `browser` fixture: skip before module fixtures (the gateway) start."""


@contextmanager
def chromium(window_size: str = "1280,1300", args: Sequence[str] = (), network_log: bool = False) -> Iterator[Any]:
    """A fresh headless chromium (selenium WebDriver) with its own profile, its console log kept (and, with
    `network_log`, its DevTools performance log: every request the page made); extra command-line `args`.
    Skips the test when chromium, chromedriver or selenium is missing."""
    why = missing()
    if why is not None:
        pytest.skip(why)
    from selenium import webdriver

    chromium_path, driver = _find("chromium", "chromium-browser"), _find("chromedriver")
    assert chromium_path is not None and driver is not None
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="voltgate-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium_path
    for arg in (*CHROMIUM_ARGS, f"--window-size={window_size}", f"--user-data-dir={profile}", *args):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", **({"performance": "ALL"} if network_log else {})})
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser() -> Iterator[object]:
    """A fresh headless chromium (selenium WebDriver) per test: nothing carries over (sessionStorage, cache)."""
    with chromium() as session:
        yield session


SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
