"""The usage page in a real headless Chromium (Debian's `chromium` + `chromium-driver`,
driven by selenium): a workload through a real root, then `/usage` shows it.

Skipped, saying why, when chromium/chromedriver or selenium are missing (`make test`
installs chromium when it runs as root). A screenshot is saved as a test artefact in
``var/artifacts/usage.png``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import Root, make_root
from tests.support.procs import Procs

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

webdriver: Any
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:  # pragma: no cover - dev dependency missing
    webdriver = None

pytestmark = [
    pytest.mark.skipif(
        webdriver is None, reason="selenium is not installed (pip install -e '.[dev]')"
    ),
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="chromium/chromedriver missing: apt-get install chromium chromium-driver "
        "(make test does it as root)",
    ),
]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # tests run as root in containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1800",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        opts.add_argument(arg)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()  # stops chromedriver (the Service's own process) and chromium


def _chart(driver: Any, chart_id: str) -> dict[str, str]:
    el = driver.find_element(By.ID, chart_id)
    return {k: el.get_attribute(f"data-{k}") or "" for k in ("points", "nonzero", "sum", "since")}


def test_usage_page_plots_a_real_workload(tmp_path: Path, procs: Procs, browser: Any) -> None:
    root: Root = make_root(procs, tmp_path / "data")
    name, token = root.producer(quota={"max_bytes_stored": 200_000})
    c = root.client(token)
    for i in range(40):
        assert c.put(f"/v1/kv/{name}/k{i}", content=b"v" * (50 + i)).status_code == 200
    for i in range(5):
        assert c.put(f"/v1/kv/{name}/k{i}", content=b"v" * (50 + i)).status_code == 200  # dup
    assert c.delete(f"/v1/kv/{name}/k39").status_code == 200

    browser.get(root.url + "/usage")
    assert "Mercury usage" in browser.title
    browser.find_element(By.ID, "token").send_keys(root.admin_token)
    browser.find_element(By.ID, "use-token").click()
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: _chart(d, "chart-writes")["points"] not in ("", "0"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#producers tbody tr")
    assert [r.get_attribute("data-producer") for r in rows] == [name]
    before = _chart(browser, "chart-writes")
    assert int(before["sum"]) == 40  # writes plotted
    assert int(before["nonzero"]) >= 1
    assert int(_chart(browser, "chart-stored")["nonzero"]) >= 1  # stored bytes plotted
    # the token stays out of the address and out of the root's log
    assert root.admin_token not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('mercury.usage.token')")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    Select(browser.find_element(By.ID, "range")).select_by_visible_text("last hour")
    wait.until(lambda d: _chart(d, "chart-writes") != before)
    after = _chart(browser, "chart-writes")
    assert int(after["points"]) < int(before["points"])  # 1 h of minutes, not 24 h
    assert int(after["since"]) > int(before["since"])
    assert int(after["sum"]) == 40  # same writes, all in the last hour

    Select(browser.find_element(By.ID, "range")).select_by_visible_text("last 7 days")
    wait.until(lambda d: _chart(d, "chart-writes")["points"] != after["points"])
    week = _chart(browser, "chart-writes")
    assert int(week["points"]) in (168, 169)  # hourly steps
    assert int(week["sum"]) == 40
    # growth from the state the range began with (a new producer: all it stores)
    growth = browser.find_element(By.CSS_SELECTOR, "#producers tbody tr td:nth-child(2)").text
    assert growth not in ("0", "–", ""), growth
    assert browser.save_screenshot(str(ARTIFACTS / "usage.png"))
    root.close_clients()
    assert root.admin_token not in procs.logs()
