"""The usage page in a real headless Chromium (tests/browser/conftest.py): a workload
through a real root, then `/usage` shows it. A screenshot is saved as a test artefact in
``var/artifacts/usage.png``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import Procs
from testkit.wait import wait_until
from tests.browser.conftest import ARTIFACTS, NEEDS_BROWSER, By, Select, WebDriverWait
from tests.gateway.conftest import Root, make_root

pytestmark = NEEDS_BROWSER


#: An SI figure as the page writes it: three significant digits, a prefix, a unit.
SI = re.compile(r"-?[0-9]+(\.[0-9]+)?( [kMGT]?B| [kMGT])?")


def _si_axes(driver: Any) -> None:
    """Every chart's y axis is labelled in SI units, short enough for the axis: uPlot's
    own labels ("12,000,000") were clipped to ",000,000"."""
    for el in driver.find_elements(By.CSS_SELECTOR, "#charts .chart"):
        labels = (el.get_attribute("data-ylabels") or "").split("|")
        assert labels != [""], el.get_attribute("id")
        for label in labels:
            assert SI.fullmatch(label) and len(label) <= 8, (el.get_attribute("id"), labels)


def _chart(driver: Any, chart_id: str) -> dict[str, str]:
    el = driver.find_element(By.ID, chart_id)
    return {k: el.get_attribute(f"data-{k}") or "" for k in ("points", "nonzero", "sum", "since")}


def test_usage_page_plots_a_real_workload(
    tmp_path: Path, procs: Procs, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MERCURY_READSTATS_PERIOD_S", "0.3")  # the root's own read summaries
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    root: Root = make_root(procs, tmp_path / "data")
    name, token = root.producer(quota={"max_bytes_stored": 200_000})
    c = root.client(token)
    for i in range(40):
        assert c.put(f"/v1/kv/{name}/k{i}", content=b"v" * (50 + i)).status_code == 200
    for i in range(5):
        assert c.put(f"/v1/kv/{name}/k{i}", content=b"v" * (50 + i)).status_code == 200  # dup
    assert c.delete(f"/v1/kv/{name}/k39").status_code == 200
    # a key the root expires: an expiry on the page, apart from the delete (not a write)
    assert c.put(f"/v1/kv/{name}/gone?ttl=1s", content=b"t").status_code == 200
    wait_until(lambda: c.get(f"/v1/kv/{name}/gone").status_code == 404, 20, "the expiry")

    browser.get(root.url + "/usage")
    assert "Mercury usage" in browser.title
    browser.find_element(By.ID, "token").send_keys(root.admin_token)
    browser.find_element(By.ID, "use-token").click()
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: _chart(d, "chart-writes")["points"] not in ("", "0"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#producers tbody tr")
    assert [r.get_attribute("data-producer") for r in rows] == [name]
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#producers thead th")]
    cells = dict(
        zip(heads, [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")], strict=True)
    )
    assert (cells["writes"], cells["expired"]) == ("41", "1"), cells
    before = _chart(browser, "chart-writes")
    assert int(before["sum"]) == 41  # writes plotted (the 40 and the key that expired)
    sums = browser.find_element(By.ID, "chart-writes").get_attribute("data-sums")
    assert sums == "41|1|5|1", sums  # writes | deletes | duplicates | expiries
    assert int(before["nonzero"]) >= 1
    # The default range fits the data: it starts minutes before the first write (not a
    # day of empty minutes with the writes squeezed into the right edge).
    assert int(before["points"]) <= 20, before
    assert int(before["since"]) >= time.time() - 1800, before
    _si_axes(browser)
    assert browser.save_screenshot(str(ARTIFACTS / "usage-default-range.png"))
    assert int(_chart(browser, "chart-stored")["nonzero"]) >= 1  # stored bytes plotted
    # the token stays out of the address and out of the root's log
    assert root.admin_token not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('mercury.usage.token')")

    Select(browser.find_element(By.ID, "range")).select_by_visible_text("last hour")
    wait.until(lambda d: _chart(d, "chart-writes") != before)
    after = _chart(browser, "chart-writes")
    assert int(after["points"]) in (60, 61)  # 1 h of minutes
    assert int(after["since"]) < int(before["since"])
    assert int(after["sum"]) == 41  # same writes, all in the last hour

    Select(browser.find_element(By.ID, "range")).select_by_visible_text("last 7 days")
    wait.until(lambda d: _chart(d, "chart-writes")["points"] != after["points"])
    week = _chart(browser, "chart-writes")
    assert int(week["points"]) in (168, 169)  # hourly steps
    assert int(week["sum"]) == 41
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
    assert re.fullmatch(r"[1-9][0-9.]* k?B", cells[4]), cells  # the bytes they hold
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


def test_usage_page_tells_refusals_from_requests_too_large(
    tmp_path: Path, procs: Procs, browser: Any
) -> None:
    """429s (the rate quota turned ops away) and 413s (a batch larger than the quota could
    ever admit, which the SDK splits and sends again) are two columns and two chart lines:
    a producer whose batches were split never reads as one that lost writes. The byte axes
    of a producer storing megabytes read in SI units."""
    root: Root = make_root(procs, tmp_path / "data")
    quota = {"ops_per_s": 1, "burst": 5, "max_delay_ms": 0}
    name, token = root.producer(quota=quota)
    c = root.client(token)
    ops = [{"op": "set", "key": f"{name}/b{i}", "value": "v"} for i in range(10)]
    assert c.post("/v1/batch", json={"ops": ops}).status_code == 413  # never admissible
    big = b"x" * 3_000_000  # megabytes stored: the byte axes' labels are long numbers
    statuses = [c.put(f"/v1/kv/{name}/k{i}", content=big).status_code for i in range(6)]
    assert statuses.count(429) >= 1 and statuses.count(200) >= 1, statuses

    def counted() -> bool:
        pts: list[dict[str, int]] = c.get("/v1/usage/series", params={"since": "-1h"}).json()[
            "points"
        ]
        return sum(p["refused_429"] for p in pts) >= 1 and sum(p["refused_413"] for p in pts) == 10

    wait_until(counted, 30, "the refusals in the usage series")
    browser.get(root.url + "/usage")
    browser.find_element(By.ID, "token").send_keys(root.admin_token)
    browser.find_element(By.ID, "use-token").click()
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#producers tr[data-producer="{name}"]'))
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#producers thead th")]
    row = browser.find_element(By.CSS_SELECTOR, f'#producers tr[data-producer="{name}"]')
    cells = dict(zip(heads, [td.text for td in row.find_elements(By.TAG_NAME, "td")], strict=True))
    assert cells["refused (429)"] == str(statuses.count(429)), cells
    assert cells["too large (413)"] == "10", cells
    assert re.fullmatch(r"[0-9.]+ MB", cells["stored"]), cells
    wait.until(lambda d: _chart(d, "chart-quota")["points"] not in ("", "0"))
    _si_axes(browser)
    assert any(
        label.endswith(" MB")
        for label in (
            browser.find_element(By.ID, "chart-stored").get_attribute("data-ylabels") or ""
        ).split("|")
    )
    assert browser.save_screenshot(str(ARTIFACTS / "usage-refusals.png"))
    root.close_clients()
