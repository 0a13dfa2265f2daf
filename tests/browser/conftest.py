"""Pages in a real headless Chromium (Debian's `chromium` + `chromium-driver`, driven by
selenium): the one browser fixture of tests/browser.

Skipped, saying why, when chromium/chromedriver or selenium are missing (`make test`
installs chromium when it runs as root). Screenshots are test artefacts in
``var/artifacts/``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

webdriver: Any
By: Any
Select: Any
WebDriverWait: Any
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:  # pragma: no cover - dev dependency missing
    webdriver = By = Select = WebDriverWait = None

#: Every browser test's marks: skipped, saying why, without selenium or chromium.
NEEDS_BROWSER = [
    pytest.mark.skipif(
        webdriver is None, reason="selenium is not installed (pip install -e '.[dev]')"
    ),
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="chromium/chromedriver missing: apt-get install chromium chromium-driver "
        "(make test does it as root)",
    ),
]

#: Chromium's resolver answers "not found" for every host name but the loopback address
#: the nodes listen on: a page that loads anything from another host (a CDN) fails to,
#: as it would on a machine without Internet access.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # tests run as root in containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        # chromedriver talks to Chromium over a pipe, not a port it waits to see written to
        # a file: under load the file can come after the driver gave up on it
        "--remote-debugging-pipe",
        "--window-size=1400,1800",
        f"--user-data-dir={tmp_path / 'chromium'}",
        OFFLINE,
    ):
        opts.add_argument(arg)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()  # stops chromedriver (the Service's own process) and chromium


def loaded_from(driver: Any) -> list[str]:
    """Every URL of a script, stylesheet, font or fetch of the page in `driver` (its
    resource timing entries; images aside: ReDoc's sidebar badge is its maker's logo from
    the maker's CDN, which the page's CSP blocks and ReDoc hides)."""
    urls: list[str] = driver.execute_script(
        "return performance.getEntriesByType('resource')"
        ".filter(e => e.initiatorType !== 'img').map(e => e.name)"
    )
    return urls
