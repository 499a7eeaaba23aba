"""The dashboard says why the run is where it is: each decision of the placement controller on the timeline with
its table, and the run's goodput on its page and in the runs table. Run folders are built by hand on files."""

from __future__ import annotations

import json
import re

from ops.dashboard import Dashboard, data
from runfolder import layout
from runfolder.storage import open_store
from tests.ops.test_status_why import a_run, decision, ts


def _bucket(tmp_path, decisions: int):
    uri, store, docs = a_run(tmp_path / "runs", decisions=decisions)
    return f"file://{tmp_path}", open_store(f"file://{tmp_path}"), store, docs


def test_each_decision_is_a_mark_on_the_timeline_with_its_table_below(tmp_path):
    bucket, store, _run, docs = _bucket(tmp_path, 3)
    code, body = Dashboard(bucket, store).respond("/run/run", now=ts(80))
    assert code == 200
    assert len(re.findall(r'class="mark decision"', body)) == 3
    for n in range(3):
        assert f'href="#decision-{n}"' in body and f'id="decision-{n}"' in body
    # The newest table is open, and every placement's row is in it.
    newest = body[body.index('id="decision-2"'):]
    assert newest.startswith('id="decision-2" open>')
    assert "cheapest: placement 0 (saves 12.40 USD (31 %) over placement 0)" in newest
    assert "* 0 aws us-east-1 (chosen, active): $0.4100/h aws, 2m 00s old" in newest.replace("&#x27;", "'")
    assert "not feasible: preempts too often to finish (L = 1.20 &gt;= 1)" in newest
    assert "<dt>decision</dt>" in body


def test_the_run_page_and_the_runs_table_show_the_goodput(tmp_path):
    bucket, store, _run, _docs = _bucket(tmp_path, 0)
    dash = Dashboard(bucket, store)
    code, page = dash.respond("/run/run", now=ts(80))
    assert code == 200 and 'data-goodput="0.8"' in page
    assert "80% of 1h 15m paid machine time kept; against it: boots 10m 00s, idle 5m 00s, lost 0s" in page
    assert "mark decision" not in page and "<h2>decisions</h2>" not in page
    code, runs = dash.respond("/?sort=goodput&order=desc", now=ts(80))
    assert code == 200 and re.search(r'<td class="num goodput" title="80% of [^"]*">80%</td>', runs)
    assert 'data-col="goodput"' in runs


def test_only_the_newest_tables_are_read_the_older_decisions_are_marks(tmp_path, monkeypatch):
    bucket, store, run, _docs = _bucket(tmp_path, 0)
    for n in range(data.DECISION_TABLES + 5):
        decision(run, 2 + n / 10)
    read: list[str] = []
    real = data.read_json

    def counting(s, key):
        read.append(key)
        return real(s, key)

    monkeypatch.setattr(data, "read_json", counting)
    page = data.run_page(store, "run", ts(80))
    tables = [k for k in read if k.startswith(layout.DECISIONS_PREFIX)]
    assert len(tables) == data.DECISION_TABLES
    assert len([m for m in page.marks if m.kind == data.DECISION]) == data.DECISION_TABLES + 5
    assert sum(1 for d in page.decisions if d.doc is None) == 5
    assert any("the newest 20 tables are shown" in n for n in page.notes)


def test_a_damaged_table_is_a_note_and_the_page_still_draws(tmp_path):
    bucket, store, run, _docs = _bucket(tmp_path, 1)
    run.put_bytes(layout.decision_key(ts(3)), b"{not json")
    code, body = Dashboard(bucket, store).respond("/run/run", now=ts(80))
    assert code == 200 and "could not be read (not a JSON object)" in body
    assert len(re.findall(r'class="mark decision"', body)) == 2
    assert json.loads(run.get_bytes(layout.decision_key(ts(1))))["chosen"] == 0


def test_the_timeline_draws_each_attempts_boot_and_its_lost_training(tmp_path):
    from tests.ops.test_status_why import ev, lines, started

    bucket, store, run, _docs = _bucket(tmp_path, 0)
    lines(run, started(10, 1), ev(layout.CHECKPOINT, 20, 1, step=200), ev(layout.EVALUATED, 28, 1, step=280, metrics={}),
          {"event": layout.SPOT_NOTICE, "time": ev("x", 30)["time"], "instance": "i-1"},
          started(40, 2), ev(layout.RESUMED, 42, 2, step=200), ev(layout.FINISHED, 70, 2, step=1000))
    page = data.run_page(store, "run", ts(80))
    first, second = page.spans
    assert (first.launch, first.first_step, first.kept_until, first.train_end) == (ts(0), ts(10), ts(20), ts(30))
    assert first.lost_steps == 80 and (second.launch, second.first_step) == (ts(30), ts(42))
    code, body = Dashboard(bucket, store).respond("/run/run", now=ts(80))
    assert code == 200 and body.count('<rect class="boot"') == 2 and body.count('<rect class="lost"') == 1
    assert "lost: trained after the last commit the run went on from (80 steps at least): 10m 00s" in body
