"""`/docs` (Swagger UI) and `/redoc` (ReDoc) render offline in a real headless Chromium:
its resolver fails every host name (tests/browser/conftest.py, `OFFLINE`), so a page whose
assets came from a CDN would stay blank. Both must draw the gateway's operations, loading
nothing from anywhere but the node. Screenshots in ``var/artifacts/docs.png`` and
``var/artifacts/redoc.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testkit.procs import Procs
from tests.browser.conftest import ARTIFACTS, NEEDS_BROWSER, By, WebDriverWait, loaded_from
from tests.gateway.conftest import Root, make_root

pytestmark = NEEDS_BROWSER


def test_swagger_ui_and_redoc_render_offline(tmp_path: Path, procs: Procs, browser: Any) -> None:
    root: Root = make_root(procs, tmp_path / "data")
    wait = WebDriverWait(browser, 30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    browser.get(root.url + "/docs")
    # Swagger UI drew the document: its title and an operation of the key API
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title"))
    assert "Mercury gateway" in browser.find_element(By.CSS_SELECTOR, ".info .title").text
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path"))
    paths = {e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert any(p.startswith("/v1/kv/") for p in paths), paths
    assert all(u.startswith(root.url) for u in loaded_from(browser)), loaded_from(browser)
    assert browser.save_screenshot(str(ARTIFACTS / "docs.png"))

    browser.get(root.url + "/redoc")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".api-content h1"))
    assert "Mercury gateway" in browser.find_element(By.CSS_SELECTOR, ".api-content h1").text
    wait.until(lambda d: "/v1/kv/" in d.find_element(By.CSS_SELECTOR, ".api-content").text)
    assert all(u.startswith(root.url) for u in loaded_from(browser)), loaded_from(browser)
    assert browser.save_screenshot(str(ARTIFACTS / "redoc.png"))
