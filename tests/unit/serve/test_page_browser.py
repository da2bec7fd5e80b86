"""The page at `/` of `trainmem serve`, driven in a real headless browser (Debian's chromium).

A server on a free loopback port; chromium through chromedriver (selenium), its DNS mapped to
nothing but 127.0.0.1 so that the network is off for it, and its performance log read back:
every request the page and the docs make goes to this server. A job typed into the form shows
the numbers /v1/estimate answers for the body the page sent, byte for byte and in GiB as shown;
the heatmap, the phase peaks and the recommended plan's launch config are drawn. A screenshot is
written under the test's tmp folder (and to $TRAINMEM_PAGE_SCREENSHOT when set: that is how
docs/serve-page.png is made).

Skipped only where /usr/bin/chromium or /usr/bin/chromedriver is missing (.ci/run installs
both, and sets TRAINMEM_REQUIRE_BROWSER, under which a missing browser fails instead) or the test
extra is not installed (selenium, fastapi, uvicorn).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
pytest.importorskip("fastapi", reason="trainmem[serve] not installed: pip install '.[test]'")
pytest.importorskip("uvicorn", reason="trainmem[serve] not installed: pip install '.[test]'")
pytest.importorskip("selenium", reason="selenium not installed: pip install '.[test]'")

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

from trainmem.serve import create_app  # noqa: E402

GIB = 2**30
WAIT_S = 120
"""Longest wait for the page (an estimate, 30 heatmap estimates and a recommend on 2 cores)."""
JOB = {
    "model": "llama-3.1-8b",
    "num_gpus": 8,
    "zero": 3,
    "micro_batch_size": 2,
    "seq_len": 4096,
    "recompute": "full",
}
"""What the test types into the form (the README's serve example, with full recompute)."""
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    # the network off: every host name but the server's resolves to nothing
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--window-size=1400,1000",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """uvicorn in a thread of the test process on 127.0.0.1, stopped after the module."""
    port = _free_port()
    config = uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless chromium with a fresh profile and the performance log on; always quit."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        why = "no browser: apt-get install chromium chromium-driver (.ci/run does)"
        if os.environ.get("TRAINMEM_REQUIRE_BROWSER"):
            pytest.fail(f"{why}; TRAINMEM_REQUIRE_BROWSER is set", pytrace=False)
        pytest.skip(why)
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager never downloads a driver
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        driver.get("about:blank")
        driver.get_log("performance")  # what the browser did before the test: not the page's
        driver.set_page_load_timeout(WAIT_S)
        driver.set_script_timeout(WAIT_S)
        yield driver
    finally:
        driver.quit()


def _requested_urls(driver: Any) -> list[str]:
    """Every URL the browser asked for since the last call (its performance log), but its own
    internal pages (chrome://, the new tab page it starts on): those never touch a network."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith(INTERNAL_SCHEMES):
                urls.append(url)
    return urls


INTERNAL_SCHEMES = ("chrome://", "chrome-untrusted://", "chrome-extension://", "about:")


def _assert_loopback_only(urls: list[str], base_url: str, *, expected: tuple[str, ...]) -> None:
    """Every request went to the server (or is inline data:), and the page's own ones are
    among them (so an empty or truncated log cannot pass)."""
    outside = [u for u in urls if not (u.startswith(base_url + "/") or u.startswith("data:"))]
    assert not outside, f"requests that left {base_url}: {outside}"
    paths = {u[len(base_url) :].split("?")[0] for u in urls if u.startswith(base_url)}
    assert set(expected) <= paths, (expected, sorted(paths))


def _wait(driver: Any, css: str) -> Any:
    return WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element(By.CSS_SELECTOR, css))


def _fill(driver: Any, fields: dict[str, Any]) -> None:
    """Type the job as a user would: choose from the selects, retype the numbers."""
    for name, value in fields.items():
        element = driver.find_element(By.ID, f"f-{name}")
        if element.tag_name == "select":
            Select(element).select_by_value(str(value))
        else:
            element.clear()
            element.send_keys(str(value))


def test_page_shows_the_estimate_offline(browser: Any, base_url: str, tmp_path: Path) -> None:
    browser.get(base_url + "/")
    _wait(browser, "body[data-ready=true]")
    # The form is the estimate request model: one input per field of the schema.
    schema = httpx.get(base_url + "/openapi.json").json()
    properties = schema["components"]["schemas"]["EstimateRequest"]["properties"]
    names = list(properties)
    shown = [
        e.get_attribute("name") for e in browser.find_elements(By.CSS_SELECTOR, "#fields [name]")
    ]
    assert shown == names
    choices = Select(browser.find_element(By.ID, "f-precision")).options
    assert [o.get_attribute("value") for o in choices] == properties["precision"]["enum"]

    _fill(browser, JOB)
    browser.find_element(By.ID, "submit").click()
    _wait(browser, "#result[data-state=done]")
    assert browser.find_element(By.ID, "error").get_attribute("hidden"), browser.find_element(
        By.ID, "error"
    ).text

    sent = json.loads(browser.find_element(By.ID, "body").get_attribute("textContent"))
    # only what differs from the schema's defaults
    assert sent == {k: v for k, v in JOB.items() if v != properties[k].get("default")}
    report = httpx.post(base_url + "/v1/estimate", json=sent, timeout=60).json()
    expected = {
        **report["breakdown_at_peak"],
        "peak_device_bytes": report["peak_device_bytes"],
        "peak_reserved_bytes": report["peak_reserved_bytes"],
        "peak_allocated_bytes": report["peak_allocated_bytes"],
        "usable_bytes": report["gpu"]["usable_bytes"],
        "headroom_bytes": report["headroom_bytes"],
    }
    rows = browser.find_elements(By.CSS_SELECTOR, "#numbers tr")
    got = {r.get_attribute("data-key"): r for r in rows}
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert int(got[key].get_attribute("data-bytes")) == value, key
        assert got[key].find_elements(By.TAG_NAME, "td")[2].text == f"{value / GIB:.2f}", key
    verdict = browser.find_element(By.ID, "verdict").text
    assert verdict.startswith("FITS" if report["fits"] else "DOES NOT FIT"), verdict
    assert f"{abs(report['headroom_bytes']) / GIB:.2f} GiB" in verdict
    step = browser.find_element(By.CSS_SELECTOR, "#timing tr[data-key=step_time_s]").text
    assert step.endswith(f"{report['time']['step_time_s']:.3f}")
    # The stacked bar has one rectangle per non-zero component, the phases one bar per phase.
    bars = browser.find_elements(By.CSS_SELECTOR, "#bar rect")
    assert len(bars) == sum(1 for v in report["breakdown_at_peak"].values() if v > 0)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#phases rect")) == len(report["phases"])

    # The heatmap: micro-batch 1..32 x seq 1024..16384, the job's own cell as /v1/estimate says.
    heat = browser.find_element(By.CSS_SELECTOR, "#heatmap table")
    header = [c.text for c in heat.find_elements(By.CSS_SELECTOR, "thead td")][1:]
    assert header == ["1024", "2048", "4096", "8192", "16384"]
    cells = heat.find_elements(By.CSS_SELECTOR, "tbody tr")[1].find_elements(By.TAG_NAME, "td")
    own = cells[1 + header.index("4096")]
    assert own.text == f"{report['peak_device_bytes'] / GIB:.2f}"
    assert own.get_attribute("class") == ("fits" if report["fits"] else "nofit")
    classes = {c.get_attribute("class") for c in heat.find_elements(By.CSS_SELECTOR, "tbody td")}
    assert {"fits", "nofit"} <= classes

    launch = browser.find_element(By.ID, "launch").get_attribute("textContent")
    assert "torchrun" in launch, launch[:300]
    assert browser.find_elements(By.CSS_SELECTOR, "#plan tr")

    page = ("/", "/static/page.js", "/static/page.css", "/openapi.json", "/v1/estimate")
    _assert_loopback_only(_requested_urls(browser), base_url, expected=(*page, "/v1/recommend"))
    _screenshot(browser, tmp_path / "serve-page.png")


def _screenshot(driver: Any, path: Path) -> None:
    """The whole page as a PNG at `path` (and at $TRAINMEM_PAGE_SCREENSHOT when set)."""
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    data = base64.b64decode(shot["data"])
    path.write_bytes(data)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    print(f"screenshot: {path}")
    if os.environ.get("TRAINMEM_PAGE_SCREENSHOT"):
        shutil.copyfile(path, os.environ["TRAINMEM_PAGE_SCREENSHOT"])


def test_docs_are_offline(browser: Any, base_url: str) -> None:
    browser.get(base_url + "/docs")
    _wait(browser, "body[data-ready=true]")
    schema = httpx.get(base_url + "/openapi.json").json()
    operations = sum(len(methods) for methods in schema["paths"].values())
    assert len(browser.find_elements(By.CSS_SELECTOR, "#ops .op")) == operations
    assert "micro_batch_size" in browser.find_element(By.ID, "ops").text
    _assert_loopback_only(
        _requested_urls(browser), base_url, expected=("/docs", "/static/docs.js", "/openapi.json")
    )


def test_no_asset_names_another_host(base_url: str) -> None:
    """The page, the docs and every shipped asset: no http(s) URL but this server's."""
    from trainmem.serve._page import ASSETS, CSP

    for path in ("/", "/docs", "/redoc", *(f"/static/{name}" for name in ASSETS)):
        answer = httpx.get(base_url + path)
        assert answer.status_code == 200, path
        assert answer.headers["content-security-policy"] == CSP
        text = answer.text.replace("http://www.w3.org/2000/svg", "")  # a namespace, not a fetch
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path
    assert httpx.get(base_url + "/static/_page.py").status_code == 404
