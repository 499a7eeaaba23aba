"""`ops dashboard` in a real browser: Debian's chromium, headless, driven by selenium through chromium-driver.

The pages are served from buckets on the emulators (moto_server's S3, the GCS emulator), written
by ``dashboard_scenarios``; the tests count what a person would see in the DOM (rows and states,
attempt bars, preemption marks, a curve's points, the cost total) and save a screenshot of each
page to the test's ``tmp_path`` (``dashboard-*.png``) to be looked at. One browser for the module.

chromium and chromium-driver come from Debian (``.ci/setup``); with no network here, the browser
starts with the flags that stop it from reaching for one, and a fresh profile.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ops.__main__ import main
from ops.dashboard import Dashboard, make_server
from runfolder.storage import open_store
from tests.ops import dashboard_scenarios as scenarios

pytestmark = pytest.mark.slow
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--window-size=1280,900")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, DRIVER):
        assert Path(path).exists(), f"{path} is missing: .ci/setup installs Debian's chromium and chromium-driver"
    profile = tempfile.mkdtemp(prefix="dashboard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def serve(bucket_uri: str):
    """The dashboard on 127.0.0.1 (any free port), on a thread; returns the server."""
    server = make_server(Dashboard(bucket_uri, open_store(bucket_uri)), 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# The texts of a chart drawn past its edge (cut by it), and how far the page runs past the window's width.
CUT = """return [...document.querySelectorAll('svg text')].filter(t => {
    const r = t.getBoundingClientRect(), s = t.closest('svg').getBoundingClientRect();
    return r.width > 0 && (r.left < s.left - 0.5 || r.right > s.right + 0.5 || r.top < s.top - 0.5
                           || r.bottom > s.bottom + 0.5); }).map(t => t.textContent)"""
WIDER = "return document.documentElement.scrollWidth - document.documentElement.clientWidth"


def shot(driver, url: str, out: Path) -> None:
    """Open ``url`` and save the whole page as ``out``; nothing on it is cut at 1280 px."""
    driver.get(url)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(600, height + 20))
    driver.save_screenshot(str(out))
    assert out.stat().st_size > 10_000, f"{out}: an empty screenshot"
    assert driver.execute_script(WIDER) <= 0, f"{url}: wider than the window"
    assert driver.execute_script(CUT) == [], f"{url}: texts cut by their chart's edge"


def test_a_preempted_and_moved_run_on_s3_tells_its_story(browser, s3_run, tmp_path, capsys):
    from selenium.webdriver.common.by import By

    bucket_uri = s3_run.uri.rsplit("/runs/", 1)[0]
    states = scenarios.bucket(bucket_uri, tmp_path / "src", start=time.time() - 9 * 3600)
    # A long run id, as dated ones are: the runs table still fits the window.
    long = "mnist-resnet50-lr-sweep-0.003-2026-12-04"
    scenarios.story(f"{bucket_uri}/runs/{long}", tmp_path / "long", start=time.time() - 3 * 3600, steps=1000,
                    eval_every=250, checkpoint_every=500)
    states[long] = "COMPLETE"
    server = serve(bucket_uri)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        shot(browser, base + "/", tmp_path / "dashboard-runs.png")
        rows = browser.find_elements(By.CSS_SELECTOR, "tr.run")
        seen = {r.get_attribute("data-run"): r.find_element(By.CSS_SELECTOR, ".state").text for r in rows}
        assert seen == states
        # Sort by cost, dearest first: two clicks on the heading (the first sorts dearest first already).
        browser.find_element(By.CSS_SELECTOR, 'th[data-col="cost"] a').click()
        assert browser.find_elements(By.CSS_SELECTOR, "tr.run")[0].get_attribute("data-run") == "night"
        browser.find_element(By.CSS_SELECTOR, 'tr.run[data-run="night"] a.run-link').click()
        assert browser.current_url.endswith("/run/night")

        shot(browser, base + "/run/night", tmp_path / "dashboard-run.png")
        count = lambda css: len(browser.find_elements(By.CSS_SELECTOR, css))  # noqa: E731
        assert count("svg.timeline rect.attempt") == 3
        assert count("svg.timeline .mark.preempted") == 2 and count("svg.timeline .mark.spot-notice") == 2
        assert count("svg.timeline g.move") == 1 and count("svg.timeline rect.gap") == 2
        assert browser.find_element(By.CSS_SELECTOR, "svg.timeline g.end").get_attribute("data-end") == "COMPLETE"
        evaluations = count("svg.timeline line.tick.evaluation")
        curve = browser.find_element(By.CSS_SELECTOR, 'svg.curve[data-metric="val_accuracy"]')
        assert len(curve.find_elements(By.CSS_SELECTOR, "circle.point")) == evaluations == 11
        assert "moved aws us-east-1 -> aws us-west-2" in browser.find_element(By.CSS_SELECTOR, "g.move").text
        shown = browser.find_element(By.CSS_SELECTOR, ".cost-total")
        assert main(["status", "--run-uri", f"{bucket_uri}/runs/night", "--json"]) == 0
        st = json.loads(capsys.readouterr().out)
        assert float(shown.get_attribute("data-usd")) == st["cost_usd"] > 0
        assert shown.text.startswith(f"${st['cost_usd']:,.2f} for ")
        assert count("svg.cost polyline.cost-line") == 3  # all placements, and each of the two

        shot(browser, base + "/run/failed", tmp_path / "dashboard-failed.png")
        end = browser.find_element(By.CSS_SELECTOR, "svg.timeline g.end")
        assert end.get_attribute("data-end") == "FAILED" and "the trainer failed 5 times" in end.text
    finally:
        server.shutdown()
        server.server_close()


def test_a_gcs_bucket_with_a_damaged_run_shows_notes_not_an_error(browser, gs_run, tmp_path):
    from selenium.webdriver.common.by import By

    from tests.ops.test_status import build

    bucket_uri = gs_run.uri.rsplit("/runs/", 1)[0]
    store = open_store(f"{bucket_uri}/runs/resumed")
    build("resumed", store, tmp_path)
    store.put_bytes("events.jsonl", store.get_bytes("events.jsonl") + b"{torn line\n")
    server = serve(bucket_uri)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        shot(browser, base + "/", tmp_path / "dashboard-gcs-runs.png")
        assert [r.get_attribute("data-state") for r in browser.find_elements(By.CSS_SELECTOR, "tr.run")] == ["RUNNING"]
        # A run not over: the page refreshes itself.
        assert browser.find_elements(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')
        shot(browser, base + "/run/resumed", tmp_path / "dashboard-gcs-run.png")
        notes = [n.text for n in browser.find_elements(By.CSS_SELECTOR, "li.note")]
        assert "events.jsonl: 1 damaged line skipped (not JSON, or not an event)" in notes
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.attempt")) == 2
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.timeline .mark.preempted")) == 1
    finally:
        server.shutdown()
        server.server_close()
