"""`ops dashboard` without a browser: what each page says, its notes, its status codes, the server's guard.

The bucket is ``dashboard_scenarios.bucket``'s (a preempted-and-moved COMPLETE run, and
``test_status.build``'s resumed, failed and complete runs) on ``file://``; the browser tests
(``test_dashboard_browser.py``) look at the same pages on the emulators.
"""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from ops.__main__ import main
from ops.dashboard import Dashboard, bucket_of, data, make_server
from runfolder import layout
from runfolder.storage import open_store
from tests.ops import dashboard_scenarios as scenarios
from tests.ops.helpers import ctrl_c_reaches_it

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bucket(tmp_path):
    uri = f"file://{tmp_path}/bucket"
    states = scenarios.bucket(uri, tmp_path / "src", start=time.time() - 9 * 3600)
    return uri, states


def _rows(body: str) -> dict[str, str]:
    return dict(re.findall(r'<tr class="run" data-run="([^"]+)" data-state="([^"]+)"', body))


def test_the_runs_table_shows_every_run_with_its_state_and_sorts(bucket):
    uri, states = bucket
    dash = Dashboard(uri, open_store(uri))
    code, body = dash.respond("/")
    assert code == 200 and _rows(body) == states
    night = body[body.index('data-run="night"'):].split("</tr>")[0]
    assert ">3<" in night and ">2<" in night  # attempts, preemptions
    assert "aws us-east-1<br>aws us-west-2" in night and 'val_accuracy <span class="nowrap">0.9372 @5500</span>' in night
    _code, by_cost = dash.respond("/?sort=cost&order=desc")
    assert list(_rows(by_cost))[0] == "night"  # the only priced run is the dearest
    _code, by_cost_up = dash.respond("/?sort=cost&order=asc")
    assert list(_rows(by_cost_up))[-1] == "night"
    # A run not over makes the page refresh itself; once all are over, it does not.
    assert 'http-equiv="refresh"' in body


def test_the_table_keeps_the_rows_of_ended_runs_until_their_folder_changes(bucket):
    uri, states = bucket
    store, cache = open_store(uri), {}
    first, _notes = data.table(store, time.time(), cache)
    assert set(cache) == {r for r, s in states.items() if s in layout.END_MARKERS}  # not the RUNNING one
    again, _notes = data.table(store, time.time() + 60, cache)
    kept = {r.id: r for r in again}
    assert all(kept[r] is cache[r][1] for r in cache) and kept["failed"].age_seconds >= 60
    assert kept["resumed"] is not {r.id: r for r in first}["resumed"]  # read again: it may have moved on
    time.sleep(0.01)
    failed = open_store(f"{uri}/runs/failed")
    doc = json.loads(failed.get_bytes("FAILED"))
    failed.put_bytes("FAILED", json.dumps({**doc, "reason": "the run's deadline moved"}).encode())
    # An ended run's folder is not listed again at every refresh: its change is seen within RELIST_S.
    rows, _notes = data.table(store, time.time() + 60, cache)
    assert {r.id: r.detail for r in rows}["failed"] == "the trainer failed 5 times in a row (last exit 1)"
    rows, _notes = data.table(store, time.time() + data.RELIST_S, cache)
    assert {r.id: r.detail for r in rows}["failed"] == "the run's deadline moved"


class Listings:
    """A store that records the prefixes listed in it."""

    def __init__(self, store) -> None:
        self.store, self.listed = store, []

    def stat(self, prefix: str = "") -> dict:
        self.listed.append(prefix)
        return self.store.stat(prefix)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_refresh_of_the_runs_table_lists_only_the_folders_of_runs_not_over(bucket):
    uri, states = bucket
    store = Listings(open_store(uri))
    dash = Dashboard(uri, store)
    now = time.time()
    assert dash.respond("/", now=now)[0] == 200
    assert sorted(store.listed) == sorted(f"runs/{r}/" for r in states)
    store.listed.clear()
    code, body = dash.respond("/", now=now + 15)
    assert code == 200 and _rows(body) == states and store.listed == ["runs/resumed/"]
    # A run folder removed is gone from the table at once: the bucket's listing of run folders says so.
    open_store(uri).delete_prefix("runs/complete/")
    code, body = dash.respond("/", now=now + 30)
    assert code == 200 and set(_rows(body)) == set(states) - {"complete"}


def test_a_run_not_over_whose_folder_stays_unchanged_stops_refreshing_until_something_changes(bucket):
    # A stack destroyed under a running run: no end marker ever comes, and nothing is written any more.
    uri, _states = bucket
    dash = Dashboard(uri, open_store(uri))
    later = time.time() + data.QUIET_S + 120
    code, body = dash.respond("/run/resumed", now=later)
    assert code == 200 and 'http-equiv="refresh"' not in body
    assert "not refreshing: nothing in the run's folder changed for 32m 00s" in body
    code, table = dash.respond("/", now=later)
    assert 'http-equiv="refresh"' not in table and "1 run is not over but nothing in its folder changed" in table
    assert 'http-equiv="refresh"' in dash.respond("/run/resumed", now=later - 240)[1]
    # A run waiting for capacity: the controller's events and a machine's are changes of the run's folder too.
    folder = Path(uri.removeprefix("file://")) / "runs" / "resumed"
    lines = {layout.PLACEMENT_EVENTS_KEY: {"event": "waiting", "reason": "no spot capacity in aws us-east-1",
                                           "placement": "aws us-east-1", "key": "capacity"},
             layout.MACHINE_EVENTS_PREFIX + "i-0new.jsonl": {"event": "rebalance", "instance": "i-0new"},
             layout.PLACEMENT_KEY: None}
    seen = []
    for key, line in lines.items():
        path = folder / key
        path.write_text(json.dumps({**line, "time": scenarios_iso(later - 60)}) + "\n" if line else '{"active": 0}')
        os.utime(path, (later - 60, later - 60))
        for page in ("/run/resumed", "/"):
            code, body = dash.respond(page, now=later)
            assert code == 200 and 'http-equiv="refresh"' in body and "not refreshing" not in body, (key, page)
        seen.append(key)
        path.unlink()
    assert len(seen) == 3


def scenarios_iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


class Counting:
    """A store that records the objects fetched from it."""

    def __init__(self, store) -> None:
        self.store, self.fetched = store, []

    def get_bytes(self, key: str) -> bytes:
        self.fetched.append(key)
        return self.store.get_bytes(key)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_refresh_fetches_only_what_changed_since(bucket):
    uri, _states = bucket
    store = Counting(open_store(uri))
    dash = Dashboard(uri, store)
    assert dash.respond("/")[0] == 200 and len(store.fetched) > 10
    # Nothing asked for that the listing says is absent (three of the four end markers, a worker's events).
    assert not any(k.endswith(("/FAILED", "/TIMED_OUT", "/CANCELLED")) for k in store.fetched if "/failed/" not in k)
    # Nor a checkpoint's marker: the listing names the newest committed step, and no row shows its time.
    assert not any(k.endswith("/" + layout.COMMITTED) for k in store.fetched)
    assert any(k.startswith("runs/resumed/checkpoints/") for k in store.store.list("runs/resumed/"))
    store.fetched.clear()
    assert dash.respond("/")[0] == 200 and store.fetched == []
    time.sleep(0.01)
    resumed = open_store(f"{uri}/runs/resumed")
    resumed.put_bytes(layout.EVENTS_KEY, resumed.get_bytes(layout.EVENTS_KEY) + b"\n")
    assert dash.respond("/")[0] == 200 and store.fetched == ["runs/resumed/events.jsonl"]


def test_the_run_page_draws_its_story_with_the_figures_of_ops_status(bucket, capsys):
    uri, _states = bucket
    page = data.run_page(open_store(uri), "night", time.time())
    assert [s.lane for s in page.spans] == ["i-0aaa (aws us-east-1)", "i-0bbb (aws us-east-1)",
                                             "i-0ccc (aws us-west-2)"]
    kinds = [m.kind for m in page.marks]
    assert kinds.count("preempted") == 2 and kinds.count("spot_notice") == 2 and kinds.count("moved") == 1
    assert page.end is not None and page.end.kind == "COMPLETE"
    # The idle gaps: nothing trained between attempts (the move is not a machine's time).
    gaps = [b.start - a.end for a, b in zip(page.spans, page.spans[1:], strict=False)]
    assert gaps[0] > 24 * 60 and gaps[1] > 20 * 60, gaps
    evaluations = sum(1 for m in page.marks if m.kind == "evaluated")
    assert len(page.curves["val_accuracy"]) == evaluations == 11  # 500 to 5500
    assert page.curve_source["train/loss"] == "TensorBoard" and len(page.curves["train/loss"]) == 60
    assert page.notes == []
    assert main(["status", "--run-uri", f"{uri}/runs/night", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert page.st.cost_usd == st["cost_usd"] and st["cost_usd"] > 0
    assert round(sum(s.cost_usd for s in page.spans), 2) == st["cost_usd"]  # the chart's total is the status's
    code, body = Dashboard(uri, open_store(uri)).respond("/run/night")
    assert code == 200 and f'data-usd="{st["cost_usd"]}"' in body
    assert "price table 2026-11-30" in html.unescape(body) and "http-equiv" not in body  # over: no refresh
    assert body.count('class="attempt"') == 3 and body.count('class="mark preempted"') == 2
    assert "python -m ops pull --run-uri" in body and "SavedModel endpoint serve" in body


@pytest.mark.parametrize("run_id", ["a b;touch pwned", "it's $(id)", "plain-1"])
def test_the_pull_line_pastes_into_a_shell_as_one_command_whatever_the_run_id(tmp_path, run_id):
    import shlex

    uri = f"file://{tmp_path}/bucket"
    scenarios.story(f"{uri}/runs/{run_id}", tmp_path / "src", start=time.time() - 3600, steps=200, eval_every=100,
                    checkpoint_every=100)
    code, body = Dashboard(uri, open_store(uri)).respond("/run/" + quote(run_id))
    [line] = re.findall(r'<code class="pull">([^<]*)</code>', body)
    argv = shlex.split(html.unescape(line))
    assert code == 200 and argv == ["python", "-m", "ops", "pull", "--run-uri", f"{uri}/runs/{run_id}", f"./{run_id}",
                                    "--checkpoint"]
    # What the shell runs: one command, the run id one word of it.
    echoed = subprocess.run(["bash", "-c", html.unescape(line).replace("python -m ops pull", "printf '%s\\n'", 1)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=10)
    assert echoed.returncode == 0 and echoed.stdout.splitlines()[-2] == f"./{run_id}", echoed
    assert not (tmp_path / "pwned").exists()


def test_damaged_and_missing_files_are_notes_not_errors(bucket):
    uri, _states = bucket
    store = open_store(f"{uri}/runs/resumed")
    store.put_bytes(layout.EVENTS_KEY, store.get_bytes(layout.EVENTS_KEY) + b"{not json\n[1, 2]\n")
    store.delete_prefix(layout.PROGRESS_KEY)
    store.put_bytes(layout.TENSORBOARD_PREFIX + "events.out.tfevents.9", b"\x05\x00\x00\x00\x00\x00\x00\x00"
                    + b"\x00" * 4 + b"\xff\xff\xff\xff\xff" + b"\x00" * 4)
    code, body = Dashboard(uri, open_store(uri)).respond("/run/resumed")
    notes = re.findall(r'<li class="note">([^<]*)</li>', body)
    assert code == 200, body
    assert "events.jsonl: 2 damaged lines skipped (not JSON, or not an event)" in notes
    assert "progress.json is missing: no heartbeat from the trainer yet" in notes
    assert any("damaged record" in n for n in notes), notes
    assert body.count('class="attempt"') == 2  # the rest of the page is still drawn


class Unreadable:
    """A bucket whose every read fails, as one without credentials does."""

    uri = "s3://nowhere"

    def stat(self, prefix=""):
        raise PermissionError("AccessDenied: no credentials")

    def __getattr__(self, name):
        return self.stat


def test_pages_that_cannot_be_read_say_why_with_404_or_503(bucket):
    uri, _states = bucket
    code, body = Dashboard(uri, open_store(uri)).respond("/run/no-such-run")
    assert code == 404 and "no run &#x27;no-such-run&#x27;" in body
    code, body = Dashboard("s3://nowhere", Unreadable()).respond("/")
    assert code == 503 and "AccessDenied: no credentials" in body and "check your credentials" in body
    assert 'http-equiv="refresh"' in body  # it tries again by itself


def _get(port: int, path: str, host: str, method: str = "GET", **headers: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, headers={"Host": host, **{k.replace("_", "-"): v for k, v in headers.items()}})
    r = conn.getresponse()
    return r.status, r.read().decode()


def test_the_server_listens_on_127_0_0_1_answers_only_to_it_and_only_reads(bucket):
    uri, _states = bucket
    server = make_server(Dashboard(uri, open_store(uri)), 0)
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_port
        assert server.server_address[0] == "127.0.0.1"
        assert _get(port, "/", f"127.0.0.1:{port}")[0] == 200
        assert _get(port, "/run/night", f"localhost:{port}")[0] == 200
        # A page elsewhere whose own name points at 127.0.0.1 (DNS rebinding) is refused.
        code, text = _get(port, "/", f"evil.example:{port}")
        assert code == 403 and "answers only on 127.0.0.1" in text
        assert _get(port, "/", f"127.0.0.1:{port}", method="POST")[0] == 405
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def served(bucket):
    """The dashboard of ``bucket`` on a free port, on a thread; yields the port."""
    import threading

    uri, _states = bucket
    server = make_server(Dashboard(uri, open_store(uri)), 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def test_a_host_that_only_begins_or_ends_like_127_0_0_1_or_localhost_is_refused(served):
    # DNS rebinding: a name of the attacker's, made to resolve to 127.0.0.1, arrives with its own name as Host.
    hosts = ["localhost.evil.example", "127.0.0.1.attacker.test", "localhost.", "127.0.0.10", "evil.localhost",
             "xlocalhost", "127.0.0.1@evil.example", "[::1]"]
    seen = []
    for host in hosts:
        for sent in (f"{host}:{served}", host):
            code, text = _get(served, "/run/night", sent)
            assert code == 403 and "answers only on 127.0.0.1" in text and "night" not in text, (sent, code)
            seen.append(sent)
    assert len(seen) == 2 * len(hosts)
    assert _get(served, "/run/night", "127.0.0.1")[0] == _get(served, "/run/night", "localhost")[0] == 200


def test_a_request_another_website_makes_the_browser_send_is_refused(served):
    # Any page the user opens can point an image, a form or a fetch at the dashboard: each answer would read the
    # bucket with the user's credentials. Browsers say where such a request comes from.
    refused = []
    for site in ("cross-site", "same-site", "Cross-Site", "something-new"):
        for path in ("/", "/run/night", "/run/no-such-run"):
            code, text = _get(served, path, f"127.0.0.1:{served}", Sec_Fetch_Site=site)
            assert code == 403 and f"Sec-Fetch-Site: {site}" in text and "night" not in text, (site, path, code)
            refused.append((site, path))
    assert len(refused) == 12


def test_the_dashboards_own_links_an_address_typed_in_and_clients_without_a_browser_are_served(served):
    for site in ("same-origin", "none", None):
        headers = {} if site is None else {"Sec_Fetch_Site": site}
        code, body = _get(served, "/run/night", f"localhost:{served}", **headers)
        assert code == 200 and "<h1>night</h1>" in body, site


def test_another_host_is_refused_on_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["dashboard", "--bucket-uri", f"file://{tmp_path}", "--host", "0.0.0.0"])
    assert e.value.code == 2 and "unknown option --host" in capsys.readouterr().err


def test_a_bucket_uri_may_name_the_runs_folder():
    assert bucket_of("file://./runs") == "file://."
    assert bucket_of("s3://b/runs/") == "s3://b"
    assert bucket_of("s3://b") == "s3://b"
    assert bucket_of("gs://runs") == "gs://runs"  # a bucket named runs


def test_the_readme_demo_folder_is_served_and_the_url_printed(tmp_path):
    # The README's demo writes file://./runs/demo; `ops dashboard --bucket-uri file://./runs` shows it.
    scenarios.story(f"file://{tmp_path}/runs/demo", tmp_path / "src", start=time.time() - 3 * 3600,
                    steps=1000, eval_every=250, checkpoint_every=500)
    proc = subprocess.Popen([sys.executable, "-m", "ops", "dashboard", "--bucket-uri", "file://./runs", "--port", "0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}, preexec_fn=ctrl_c_reaches_it)
    try:
        line = proc.stdout.readline()
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(m.group(1))
        code, body = _get(port, "/", f"127.0.0.1:{port}")
        assert code == 200 and _rows(body) == {"demo": "COMPLETE"}
        code, body = _get(port, "/run/demo", f"127.0.0.1:{port}")
        assert code == 200 and 'data-metric="val_accuracy" data-points="3"' in body
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
    assert rc == 130


def test_the_pages_need_only_what_requirements_txt_installs(bucket):
    # The curves' TensorBoard reader uses TensorBoard's protocol buffers, not TensorFlow.
    from tests.test_requirements import GUARD, OWN, install_set, top_level_modules

    uri, _states = bucket
    allowed = top_level_modules(install_set(ROOT / "requirements.txt")) | OWN
    page = ("from ops.dashboard import Dashboard\nfrom runfolder.storage import open_store\n"
            "code, body = Dashboard(sys.argv[2], open_store(sys.argv[2])).respond('/run/night')\n"
            "print(code, body.count('class=\"point\"'))\n")
    script = GUARD.replace("from ops.__main__ import main\nsys.exit(main(sys.argv[2:]))\n", page)
    assert script != GUARD
    got = subprocess.run([sys.executable, "-c", script, json.dumps(sorted(allowed)), uri], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.split() == ["200", str(60 + 11 + 11)]  # train/loss from TensorBoard, val_* from the events


def test_the_stack_names_its_runs_bucket_and_a_taken_port_is_one_line(bucket, tmp_path, monkeypatch, capsys):
    import os

    import ops.dashboard
    from tests.ops.test_status import fake_pulumi

    uri, states = bucket
    fake_pulumi(tmp_path / "bin", {"runUri": f"{uri}/runs/night"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    served = []

    class Once:
        """The server, answering one page and stopping (the command serves until Ctrl-C)."""

        def __init__(self, dashboard, port):
            self.dashboard, self.server_port = dashboard, port

        def serve_forever(self):
            served.append(self.dashboard.respond("/"))

        def shutdown(self):
            pass

        server_close = shutdown

    monkeypatch.setattr(ops.dashboard, "make_server", Once)
    assert main(["dashboard", "--stack", "dev", "--port", "6081"]) == 0
    assert capsys.readouterr().out.startswith(f"ops dashboard: {uri} at http://127.0.0.1:6081/")
    [(code, body)] = served
    assert code == 200 and _rows(body) == states

    monkeypatch.undo()
    taken = make_server(Dashboard(uri, open_store(uri)), 0)
    try:
        assert main(["dashboard", "--bucket-uri", uri, "--port", str(taken.server_port)]) == 2
    finally:
        taken.server_close()
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{taken.server_port}" in err and "choose another port with --port" in err


def test_documents_damaged_every_way_still_make_a_page(tmp_path):
    # Fields of the wrong type everywhere a hand edit, a foreign writer or a torn write could leave them.
    uri = f"file://{tmp_path}"
    bad = open_store(f"{uri}/runs/bad")
    events = [
        {"event": "started", "time": "2026-12-04T10:00:00+00:00", "attempt": "x", "workers": "two",
         "config": {"price_per_hour": "1", "placement": 5, "steps": "many"}},
        {"event": "evaluated", "time": "2026-12-04T10:01:00+00:00", "step": "abc", "metrics": [1, 2]},
        {"event": "evaluated", "time": "2026-12-04T10:02:00+00:00", "step": 10,
         "metrics": {"val_acc": "high", "val_loss": float("nan")}},
        {"event": "evaluated", "time": "not a time", "step": 20, "metrics": {"val_loss": 1e308}},
        {"event": "moved", "time": "2026-12-04T10:03:00+00:00", "from": None, "reason": ["x"]},
        {"event": "preempted", "time": "2026-12-04T10:04:00Z", "step": None},
        {"event": "spot_notice"},
        {"event": "checkpoint", "time": 12345, "step": 5},
    ]
    bad.put_bytes("events.jsonl", "\n".join(json.dumps(e) for e in events).encode() + b"\n\xff\xfe\n")
    bad.put_bytes("progress.json", json.dumps({"step": "5", "total": [1], "loss": "x", "best": {"metric": 3},
                                               "metrics": {"a": None}}).encode())
    bad.put_bytes("placement.json", json.dumps({"active": "one", "moves": [1, {"time": "bad"}]}).encode())
    bad.put_bytes("COMPLETE", json.dumps({"step": "x", "best": "val", "finished_at": 7,
                                          "signature": {"inputs": [1], "outputs": {"a": {"shape": "?"}}}}).encode())
    bad.put_bytes("machine-events/i-1.jsonl", b'{"event": "spot_notice", "time": "2026-12-04T10:03:50Z", "instance": 7}\n[]\n')
    bad.put_bytes("tensorboard/events.out.tfevents.x", b"\x00" * 3)
    torn = open_store(f"{uri}/runs/torn")
    torn.put_bytes("COMPLETE", b"not json")
    torn.put_bytes("progress.json", b"[]")
    dash = Dashboard(uri, open_store(uri))
    for path in ("/", "/?sort=best&order=desc", "/?sort=no-such-column", "/run/bad"):
        code, body = dash.respond(path)
        assert code == 200, (path, body)
    code, body = dash.respond("/run/torn")
    assert code == 200 and "COMPLETE could not be read (not a JSON object): its reason is not known" in body
    assert "progress.json could not be read (not a JSON object)" in body
    for path in ("/run/..", "/run/%2e%2e", "/run/../../etc"):
        assert dash.respond(path)[0] == 404, path


def test_a_run_moved_to_another_cloud_says_its_cost_there_includes_the_checkpoint_transfer(tmp_path):
    """An hour at home on AWS, then an hour on GCP: the machines' recorded price there (the stack's
    ``price_env``) carries the checkpoint writes back to home's S3 bucket, and the page's cost per
    placement says so, with ``ops status``'s figures."""
    from components import placement
    from components.settings import load_settings
    from components.userdata import price_env
    from ops import status
    from ops.dashboard import render
    from tests.components.test_pricing import GCP_FROM_AWS_HOME

    s = load_settings({**GCP_FROM_AWS_HOME, "compute": {"nodes": 2}}, stack="moves")
    envs = {i: price_env(placement.settings_at(s, i)) for i in (0, 2)}
    where = {i: f"{s.placement_list[i].cloud} {s.placement_list[i].region}" for i in (0, 2)}
    assert where == {0: "aws us-east-1", 2: "gcp us-central1"}

    def started(hour: int, attempt: int, i: int) -> dict:
        return {"event": "started", "time": f"2026-12-01T{hour:02d}:00:00+00:00", "attempt": attempt, "workers": 2,
                "config": {"steps": 1000, "price_per_hour": float(envs[i]["TRAINSTACK_PRICE_PER_HOUR"]),
                           "price_note": envs[i]["TRAINSTACK_PRICE_NOTE"], "placement": where[i]}}

    events = [started(0, 1, 0), {"event": "preempted", "time": "2026-12-01T01:00:00+00:00", "attempt": 1, "step": 400},
              {"event": "moved", "time": "2026-12-01T01:00:10+00:00", "from_placement": where[0],
               "to_placement": where[2], "reason": "no spot capacity", "step": 400},
              started(1, 2, 2), {"event": "checkpoint", "time": "2026-12-01T02:00:00+00:00", "attempt": 2,
                                 "step": 800, "seconds": 3.0, "bytes": 1 << 30}]
    uri = f"file://{tmp_path}/bucket"
    store = open_store(f"{uri}/runs/moved")
    store.put_bytes(layout.EVENTS_KEY, "".join(json.dumps(e) + "\n" for e in events).encode())
    now = time.time()

    st = status.read_status(f"{uri}/runs/moved", now=now, events=0)
    page = data.run_page(open_store(uri), "moved", now)
    body = render.run_page(uri, page, refresh=15)

    shown = {m.group(1): (m.group(2), m.group(3), html.unescape(m.group(4))) for m in re.finditer(
        r'<li class="placement-cost" data-placement="([^"]*)" data-usd="([^"]*)" data-transfer-per-hour="([^"]*)">'
        r"([^<]*)</li>", body)}
    assert list(shown) == [p["placement"] for p in st.placement_costs] == [where[0], where[2]]
    # The same figures as ops status, placement by placement.
    assert [float(shown[p["placement"]][0]) for p in st.placement_costs] == [p["cost_usd"] for p in st.placement_costs]
    home, away = shown[where[0]], shown[where[2]]
    assert away[1] == "0.72" and "transfer included: its checkpoint writes to home's bucket, $0.72/h" in away[2]
    assert away[2].startswith(f"{where[2]}: ${st.placement_costs[1]['cost_usd']:,.2f} for 2h")
    assert home[1] == "" and "transfer" not in home[2]
    # Its hour there: 2 machines at their price, which holds the writes ($0.72/h spread over the 2).
    bare = float(envs[2]["TRAINSTACK_PRICE_PER_HOUR"]) - 0.72 / 2
    assert st.placement_costs[1]["cost_usd"] == pytest.approx(2 * bare + 0.72, abs=0.01)


def test_a_job_runs_lanes_name_each_pod_though_its_replacement_writes_seconds_after_it_ended(tmp_path):
    """A Job's pods (trainer/pod.py's `pod` events): each replacement starts seconds after the evicted pod's
    attempt ended, and each attempt's lane is still its own pod's."""
    from datetime import UTC, datetime

    def at(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")

    store = open_store(f"file://{tmp_path}/b/runs/eks")
    t0, where = time.time() - 3600, "kubernetes aws us-east-1"
    events, pods = [], [f"train-0-0000{i}" for i in (1, 2, 3)]
    for i, pod in enumerate(pods):
        start = t0 + 530 * i  # the replacement pod runs 27 s after the evicted one's attempt ended
        store.put_bytes(layout.machine_events_key(pod), (json.dumps({
            "event": layout.POD_STARTED, "time": at(start - 3), "instance": pod, "node": f"node-{i}",
            "namespace": "trainstack-eks", "index": 0}) + "\n").encode())
        events.append({"event": "started", "time": at(start), "attempt": i + 1, "workers": 1, "worker": 0,
                       "config": {"steps": 300, "placement": where}})
        end = {"event": "preempted", "step": 100 * (i + 1), "signal": "SIGTERM"} if i < 2 else {
            "event": "finished", "step": 300, "metrics": {"loss": 0.1}}
        events.append({**end, "time": at(start + 500), "attempt": i + 1})
    store.put_bytes(layout.EVENTS_KEY, "".join(json.dumps(e) + "\n" for e in events).encode())
    store.put_bytes(layout.COMPLETE, json.dumps({"step": 300, "attempts": 3}).encode())
    page = data.run_page(open_store(f"file://{tmp_path}/b"), "eks", time.time())
    assert [s.lane for s in page.spans] == [f"{pod} ({where})" for pod in pods]
    # A pod's wait to start is no attempt's machine time: each attempt ends at its own last event.
    assert [round(s.end - s.start) for s in page.spans] == [500, 500, 500]
    assert [m.kind for m in page.marks].count("preempted") == 2
