"""The usage page in a real headless Chromium (tests/browser/conftest.py): a workload
through a real root, then `/usage` shows it. A screenshot is saved as a test artefact in
``var/artifacts/usage.png``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import Procs
from testkit.wait import wait_until
from tests.browser.conftest import ARTIFACTS, NEEDS_BROWSER, By, Select, WebDriverWait
from tests.gateway.conftest import Root, make_root

pytestmark = NEEDS_BROWSER


def _chart(driver: Any, chart_id: str) -> dict[str, str]:
    el = driver.find_element(By.ID, chart_id)
    return {k: el.get_attribute(f"data-{k}") or "" for k in ("points", "nonzero", "sum", "since")}


def test_usage_page_plots_a_real_workload(
    tmp_path: Path, procs: Procs, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MERCURY_READSTATS_PERIOD_S", "0.3")  # the root's own read summaries
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


def test_usage_page_lists_the_keys_nobody_reads(
    tmp_path: Path, procs: Procs, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys written, two of them read on the root: the page's table shows the others as
    unused with their bytes, and a click lists them."""
    monkeypatch.setenv("MERCURY_READSTATS_PERIOD_S", "0.3")
    root: Root = make_root(procs, tmp_path / "data")
    name, token = root.producer()
    c = root.client(token)
    for i in range(10):
        assert c.put(f"/v1/kv/{name}/k{i}", content=b"v" * 30).status_code == 200
    # Deliberate: every key must be older than the 1-second window the page is asked for.
    time.sleep(1.5)
    for i in (2, 7):
        assert c.get(f"/v1/kv/{name}/k{i}").status_code == 200
    days = 1 / 86400
    wait_until(
        lambda: len(c.get("/v1/usage/unused", params={"days": days}).json()["keys"]) == 8,
        20,
        "the root's reads in its ledger",
        interval=0.1,
    )

    browser.get(root.url + "/usage")
    browser.find_element(By.ID, "token").send_keys(root.admin_token)
    browser.find_element(By.ID, "use-token").click()
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: d.find_element(By.ID, "unused").get_attribute("data-loaded"))
    days_input = browser.find_element(By.ID, "unused-days")
    days_input.clear()
    days_input.send_keys(f"{days:.8f}")
    loaded = browser.find_element(By.ID, "unused").get_attribute("data-loaded")
    browser.find_element(By.ID, "unused-show").click()
    wait.until(lambda d: d.find_element(By.ID, "unused").get_attribute("data-loaded") != loaded)
    row = browser.find_element(By.CSS_SELECTOR, f'#unused tbody tr[data-producer="{name}"]')
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[:4] == [name, f"{name}/", "10", "8"], cells
    assert int(cells[4]) > 0  # the bytes they hold
    row.click()
    wait.until(lambda d: d.find_element(By.ID, "unused-keys").get_attribute("data-keys") == "8")
    listed = [
        tr.find_element(By.TAG_NAME, "td").text
        for tr in browser.find_elements(By.CSS_SELECTOR, "#unused-keys tbody tr")
    ]
    assert listed == [f"{name}/k{i}" for i in range(10) if i not in (2, 7)]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "usage-unused.png"))
    root.close_clients()
