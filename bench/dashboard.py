"""How fast `ops dashboard` shows a long run and a full bucket: server time and a browser's load.

    python -m bench.dashboard [--runs 200] [--events 10000] [--rounds 5] [--s3]

Builds a bucket (``file://`` in a temporary folder; ``--s3`` also copies it to a moto_server
bucket) of ``--runs`` runs: one run of about ``--events`` events (``devtools.story_run``'s
preempted-and-moved run, evaluated every 10 steps), the rest copies of a shorter one. Then, for the runs table
(``/``) and the long run's page (``/run/long``):

- server: the median seconds ``Dashboard.respond`` takes to read the bucket and write the page, the
  first time (nothing read yet) and on a refresh (ended, unchanged runs' rows kept);
- browser: headless chromium (as the browser tests start it) loading the page from the server
  on 127.0.0.1, by the page's Navigation Timing ``loadEventEnd`` (answered, laid out and drawn):
  a fresh server's first page, and the median of its refreshes;
- the table's pieces (``pieces``): naming the runs, one listing of all of ``runs/``, each run's
  folder listed on its own, and the listings with the reads.

Prints one JSON line and a Markdown table (bench/RESULTS.md keeps them with the command).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def build_bucket(root: Path, runs: int, events: int) -> dict:
    """The bucket under ``root``: ``runs/long`` with about ``events`` events and ``runs - 1`` others.

    The others are copies of a shorter story: three of four as it ended (COMPLETE), one of four
    without its end marker (a run not over, which the table reads again on every refresh).
    """
    from devtools.story_run import story
    from runfolder import layout

    work = root.parent / "src"
    # An evaluation every 10 steps: nearly every event is one the page draws (a tick, a curve's point).
    long = story(f"file://{root}/runs/long", work / "long", start=time.time() - 60 * 3600,
                 steps=events // 101 * 1000, eval_every=10, checkpoint_every=1000)
    story(f"file://{root}/runs/night", work / "night", start=time.time() - 12 * 3600)
    for i in range(runs - 2):
        copy = root / "runs" / f"run-{i:03d}"
        shutil.copytree(root / "runs/night", copy)
        if i % 4 == 3:
            (copy / layout.COMPLETE).unlink()
            (copy / layout.machine_events_key("i-0ccc")).unlink()
    trainer_lines = len((root / "runs/long/events.jsonl").read_bytes().splitlines())
    machine_lines = sum(len(p.read_bytes().splitlines()) for p in (root / "runs/long/machine-events").glob("*.jsonl"))
    return {"runs": len(list((root / "runs").iterdir())), "long_run_events": trainer_lines + machine_lines,
            "long_run_evaluations": long.evaluations}


# As the browser tests start it (tests/ops/test_dashboard_browser.py): with no network here, the flags
# that keep it from reaching for one.
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--window-size=1280,900")


def browser(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service


    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(DRIVER))


def measure(bucket_uri: str, rounds: int, label: str) -> list[dict]:
    """Server and browser times of the runs table and the long run's page on ``bucket_uri``.

    First: a dashboard that has read nothing yet (a fresh ``Dashboard`` each round; the store's client
    is opened before the clock starts). Refresh: the same dashboard again, as the page's refresh asks it
    (the rows of ended, unchanged runs are kept).
    """
    from ops.dashboard import Dashboard, make_server
    from runfolder.storage import open_store

    store = open_store(bucket_uri)
    profile = tempfile.mkdtemp(prefix="bench-dashboard-chromium-")
    driver = browser(profile)
    out = []

    def timed(dash, path) -> float:
        t = time.perf_counter()
        code, body = dash.respond(path)
        assert code == 200, body[:500]
        return time.perf_counter() - t

    def load(port: int, path: str) -> tuple[float, float]:
        driver.get(f"http://127.0.0.1:{port}{path}")
        nav = driver.execute_script("const n = performance.getEntriesByType('navigation')[0];"
                                    "return [n.responseEnd, n.loadEventEnd];")
        return nav[0] / 1000, nav[1] / 1000

    try:
        for path in ("/", "/run/long"):
            first = [timed(Dashboard(bucket_uri, store), path) for _ in range(rounds)]
            dash = Dashboard(bucket_uri, store)
            timed(dash, path)
            refresh = [timed(dash, path) for _ in range(rounds)]
            # The browser: a fresh server's first page, then its refreshes.
            dash = Dashboard(bucket_uri, store)
            server = make_server(dash, 0)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            try:
                b_first = load(server.server_port, path)
                b_refresh = [load(server.server_port, path) for _ in range(rounds)]
            finally:
                server.shutdown()
                server.server_close()
            _code, body = dash.respond(path)
            nodes = driver.execute_script("return document.getElementsByTagName('*').length")
            out.append({"where": label, "page": path, "bytes": len(body.encode()), "dom_nodes": nodes,
                        "server_first_s": round(statistics.median(first), 3),
                        "server_refresh_s": round(statistics.median(refresh), 3),
                        "browser_first_load_s": round(b_first[1], 3),
                        "browser_refresh_load_s": round(statistics.median(r[1] for r in b_refresh), 3)})
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return out


def pieces(bucket_uri: str, rounds: int, label: str) -> dict:
    """The runs table's parts on their own, the median of ``rounds``: naming the runs (one delimited
    listing), one listing of all of ``runs/`` (what the table read before), each run's folder listed
    on its own side by side (what it reads now), and ``ops runs``'s reading of every run (listings
    and objects: ``ops.runs.read_runs``)."""
    from ops import runs, status
    from runfolder.storage import open_store

    store = open_store(bucket_uri)

    def timed(fn) -> float:
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return round(statistics.median(times), 3)

    def read(_run_id, view, keys, _changed):
        return status.read_status(view.uri, store=runs.Listed(view, keys), events=0, checkpoint_marker=False)

    return {"where": label, "objects": len(store.stat("runs/")),
            "run_ids_s": timed(lambda: runs.run_ids(store)),
            "one_listing_s": timed(lambda: store.stat("runs/")),
            "per_run_listings_s": timed(lambda: runs.run_listings(store)),
            "listed_and_read_s": timed(lambda: runs.read_runs(store, read))}


def to_s3(root: Path) -> str:
    """The bucket copied to a fresh moto_server bucket (its variables set for this process); its URI."""
    import os

    import boto3

    from devtools.servers import start_moto_server
    from runfolder.storage import open_store

    server = start_moto_server()
    os.environ.update(AWS_ENDPOINT_URL=server.url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    boto3.client("s3").create_bucket(Bucket="trainstack-bench-dashboard")
    uri = "s3://trainstack-bench-dashboard"
    open_store(uri).upload_dir(str(root / "runs"), "runs/")
    to_s3.server = server  # stopped at exit with the process
    return uri


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--s3", action="store_true", help="also measure the bucket copied to moto_server's S3")
    a = p.parse_args()
    import os

    work = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    try:
        t = time.perf_counter()
        made = build_bucket(work / "bucket", a.runs, a.events)
        made["build_s"] = round(time.perf_counter() - t, 1)
        rows = measure(f"file://{work / 'bucket'}", a.rounds, "file://")
        parts = [pieces(f"file://{work / 'bucket'}", a.rounds, "file://")]
        if a.s3:
            s3 = to_s3(work / "bucket")
            rows += measure(s3, a.rounds, "S3 (moto_server)")
            parts.append(pieces(s3, a.rounds, "S3 (moto_server)"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if getattr(to_s3, "server", None):
            to_s3.server.close()
    doc = {**made, "rounds": a.rounds, "cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2),
           "python": platform.python_version(), "results": rows, "pieces": parts}
    print(json.dumps(doc))
    print()
    print("| bucket | page | HTML | DOM nodes | server: first | server: refresh | browser: first load "
          "| browser: refresh load |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['where']} | `{r['page']}` | {r['bytes'] / 1024:.0f} KiB | {r['dom_nodes']} "
              f"| {r['server_first_s']:.3f} s | {r['server_refresh_s']:.3f} s | {r['browser_first_load_s']:.3f} s "
              f"| {r['browser_refresh_load_s']:.3f} s |")
    print()
    print("| bucket | objects | naming the runs | one listing of runs/ | each run listed, side by side "
          "| listed and read (ops runs) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in parts:
        print(f"| {r['where']} | {r['objects']} | {r['run_ids_s']:.3f} s | {r['one_listing_s']:.3f} s "
              f"| {r['per_run_listings_s']:.3f} s | {r['listed_and_read_s']:.3f} s |")


if __name__ == "__main__":
    main()
