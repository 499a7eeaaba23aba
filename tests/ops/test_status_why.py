"""`ops status` says why the run is where it is: the controller's newest decision table, and the run's goodput.

Run folders are built by hand (events as the trainer and the machines write them, a decision table as
controller/table.py writes it), on files: no trainer, no TensorFlow.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

from controller import table
from ops import runstate, status, why
from ops.__main__ import main
from runfolder import layout
from runfolder.storage import open_store

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat(timespec="milliseconds")


def ts(minutes: float) -> float:
    return (T0 + timedelta(minutes=minutes)).timestamp()


def ev(kind: str, minutes: float, attempt: int | None = None, **fields) -> dict:
    return {layout.EVENT: kind, layout.TIME: at(minutes), layout.ATTEMPT: attempt, **fields}


def started(minutes: float, attempt: int) -> dict:
    return ev(layout.STARTED, minutes, attempt, config={"steps": 1000, "price_per_hour": 1.0}, workers=1)


def row(index: int, label: str, *, price, source="aws", age=120.0, cost=None, feasible=True, why_not="") -> table.Row:
    return table.Row(index=index, label=label, price=price, price_source=source, price_age_s=age, score=None,
                     rate=20000.0, rate_source="measured", lam=0.04, load=0.02, transfer_usd=0.5 if index else 0.0,
                     cost=cost, hours=3.0, feasible=feasible, why=why_not)


def decision(store, minutes: float, *, chosen: int = 1) -> dict:
    rows = [row(0, "aws us-east-1", price=0.41, cost=40.1), row(1, "aws us-west-2", price=0.25, cost=27.7),
            row(2, "gcp us-central1", price=None, source="stale", age=None, feasible=False,
                why_not="preempts too often to finish (L = 1.20 >= 1)")]
    doc = table.document(rows, table.Choice(chosen, "saves 12.40 USD (31 %) over placement 0", 12.4),
                         now=ts(minutes), active=0, policy=table.CHEAPEST)
    table.write(store, doc, now=ts(minutes))
    return doc


def lines(store, *kinds: dict) -> None:
    store.put_bytes(layout.EVENTS_KEY, b"".join(json.dumps(k).encode() + b"\n" for k in kinds))


def a_run(tmp_path, *, decisions: int = 1):
    uri = f"file://{tmp_path}/run"
    store = open_store(uri)
    lines(store, started(10, 1), ev(layout.CHECKPOINT, 40, 1, step=400), ev(layout.FINISHED, 70, 1, step=1000))
    store.put_bytes(layout.COMPLETE, json.dumps({"step": 1000, "finished_at": at(75)}).encode())
    store.put_bytes(layout.DEADLINE_KEY, b"0\n")
    os.utime(tmp_path / "run" / layout.DEADLINE_KEY, (ts(0), ts(0)))  # the first machine wrote it at minute 0
    docs = [decision(store, 1 + n, chosen=n % 2) for n in range(decisions)]
    return uri, store, docs


def test_status_shows_the_newest_decision_and_every_placements_row(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich's width: one row a line
    uri, _store, docs = a_run(tmp_path, decisions=2)
    assert main(["status", "--run-uri", uri]) == 0
    out = capsys.readouterr().out
    assert f"{docs[-1]['time'][:19].replace('T', ' ')} cheapest: placement 1 (saves 12.40 USD (31 %) over placement 0)" in out
    assert "* 1 aws us-west-2 (chosen): $0.2500/h aws, 2m 00s old;" in out and "E $27.70" in out
    assert "0 aws us-east-1 (active): $0.4100/h aws" in out and "E $40.10" in out
    assert "2 gcp us-central1: price unknown (stale)" in out
    assert "not feasible: preempts too often to finish (L = 1.20 >= 1)" in out

    assert main(["status", "--run-uri", uri, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decision"] == docs[-1]


def test_status_shows_no_decision_when_the_run_folder_has_none(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    uri, _store, _docs = a_run(tmp_path / "r", decisions=0)
    assert main(["status", "--run-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "\ndecision " not in out and "\ngoodput " in out
    assert main(["status", "--run-uri", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"] is None


def test_status_shows_the_goodput_with_the_boot_and_the_export_against_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    uri, _store, _docs = a_run(tmp_path, decisions=0)
    assert main(["status", "--run-uri", uri, "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["goodput"]
    # Booted 0..10 (the deadline's write to the trainer's start), trained 10..70, exported 70..75.
    assert (g["paid_h"], g["boot_h"], g["idle_h"], g["lost_h"]) == (1.25, round(10 / 60, 4), round(5 / 60, 4), 0.0)
    assert g["goodput"] == 0.8
    assert main(["status", "--run-uri", uri]) == 0
    assert ("80% of 1h 15m paid machine time kept; against it: boots 10m 00s, idle 5m 00s, lost 0s"
            in capsys.readouterr().out)


def test_goodput_text_names_lost_steps_and_what_is_not_committed_yet():
    g = {"paid_h": 2.0, "goodput": 0.5, "boot_h": 0.25, "idle_h": 0.25, "lost_h": 0.25, "uncommitted_h": 0.25,
         "lost_steps": 80}
    assert why.goodput_text(g) == ("50% of 2h 00m paid machine time kept; against it: boots 15m 00s, idle 15m 00s, "
                                   "lost 15m 00s (80 steps), not committed yet 15m 00s")
    assert why.goodput_text(None) == "" and why.decision_lines(None) == []


def test_a_table_with_fields_missing_or_odd_still_reads():
    rows = why.decision_lines({"policy": "inOrder", "chosen": None, "rows": [{"index": 0, "price": "x"}, "junk"]})
    assert rows == [("decision", " inOrder: nowhere (no reason recorded)"), ("", "  0: price unknown; E unknown")]


def test_runs_list_the_goodput(tmp_path):
    from ops import runs

    uri, _store, _docs = a_run(tmp_path / "runs", decisions=0)
    got = runs.list_runs(f"file://{tmp_path}")
    assert [r["goodput"] for r in got] == [0.8]


def test_the_first_boot_and_the_decisions_are_read_from_the_listing(tmp_path):
    uri, store, _docs = a_run(tmp_path, decisions=2)
    facts = status.read_facts(store, uri)
    assert facts.first_boot == ts(0)
    assert facts.decision_times == (ts(1), ts(2))
    st = runstate.classify(facts, ts(80))
    # The first machine was launched after the decision at minute 2, not when the deadline was written.
    assert st.goodput["boot_h"] == round(8 / 60, 4) and st.goodput["goodput"] == round(60 / 73, 4)


def test_a_row_says_the_boot_it_used_and_a_first_launch_its_price_per_unit_of_work():
    from ops import why

    first = {**asdict(row(0, "aws us-east-1", price=0.41)), "rate": None, "boot_s": 400.0, "boot_source": "measured",
             "work_usd": 0.1865}
    text = why.row_text(first, chosen=0, active=None)
    assert "boot 6m 40s (measured)" in text and "E unknown; $0.1865 per T4-hour of work" in text
    assert "boot" not in why.row_text(asdict(row(1, "aws us-west-2", price=0.25, cost=1.0)), chosen=0, active=0)
