"""Headless Chromium (Debian's chromium + chromium-driver) through selenium, for the HTML views.

No browser is downloaded: the binaries are the system's. When they are missing or Chromium
cannot start, a test skips - or fails where MLDEBUG_REQUIRE_CLUSTER=1 (CI), as cluster tests do.
The browser gets a fresh profile and no network features; views must load nothing anyway.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REQUIRE = os.environ.get("MLDEBUG_REQUIRE_CLUSTER") == "1"
CHROMIUM = os.environ.get("MLDEBUG_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("MLDEBUG_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1500,1100")


def unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"headless Chromium required but unavailable: {reason}", pytrace=False)
    pytest.skip(f"headless Chromium unavailable: {reason}")


@contextmanager
def chromium() -> Iterator[Any]:
    """A started headless Chromium driver (quit, and its profile removed, on exit)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed (pip install 'mldebug[dev]')")
    for f in (CHROMIUM, DRIVER):
        if not Path(f).exists():
            unavailable(f"{f} not found (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="mldebug-chromium-")
    opts = webdriver.ChromeOptions()
    for a in FLAGS:
        opts.add_argument(a)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
    except Exception as e:  # noqa: BLE001 - any start failure is "unavailable"
        shutil.rmtree(profile, ignore_errors=True)
        unavailable(f"Chromium did not start: {str(e).splitlines()[0] if str(e) else e!r}")
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_view(driver: Any, path: Path, timeout: float = 30.0) -> float:
    """Load ``path`` and wait until its script marked the page rendered; seconds it took."""
    t = time.perf_counter()
    driver.get(path.resolve().as_uri())
    deadline = time.monotonic() + timeout
    while driver.execute_script("return document.body && document.body.dataset.rendered") != "1":
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not render in {timeout}s: {severe(driver)}")
        time.sleep(0.05)
    return time.perf_counter() - t


def severe(driver: Any) -> list[str]:
    """The browser log's SEVERE entries since the last call (JS errors, failed loads)."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def text(driver: Any, css: str) -> str:
    return "\n".join(e.text for e in driver.find_elements("css selector", css))
