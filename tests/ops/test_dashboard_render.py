"""What the dashboard's charts say, read from their SVG: the axes' units and ticks, the labels whole, the
cost of a cheap run, and the example run the docs show telling one story.

No browser: each chart is parsed as the XML it is (``xml.etree``) and its texts compared; where a text's
width matters, a digit counts 7 px (DejaVu Sans at 11 px, the widest of the fonts the page names), so a
label inside by that count is inside on screen (the browser tests measure the drawn page).
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET

import pytest

from ops.dashboard import data, render
from runfolder import layout
from runfolder.storage import open_store
from tests.ops import dashboard_scenarios as scenarios
from tests.ops.test_dashboard_reads import scalars

CHAR_W = 7.0


def svgs(body: str, cls: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(rf'<svg class="{cls}".*?</svg>', body, re.S)]


def texts(svg: ET.Element, cls: str) -> list[ET.Element]:
    return [t for t in svg.iter("text") if t.get("class") == cls]


def extent(t: ET.Element) -> tuple[float, float]:
    """Where a one-line text's ink runs from and to, at CHAR_W a character."""
    x, w = float(t.get("x")), CHAR_W * len(t.text or "")
    anchor = t.get("text-anchor") or "start"
    return {"start": (x, x + w), "middle": (x - w / 2, x + w / 2), "end": (x - w, x)}[anchor]


def inside(svg: ET.Element, t: ET.Element) -> bool:
    lo, hi = extent(t)
    return lo >= 0 and hi <= float(svg.get("width"))


def iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def test_a_fit_scripts_epoch_curves_are_drawn_against_the_epoch_train_apart_from_validation(tmp_path):
    """Keras's TensorBoard callback writes ``epoch_loss`` to ``train/`` and ``validation/`` at epochs 0, 1, 2,
    and ``evaluation_loss_vs_iterations`` (the evaluations again, by step) to ``validation/``."""
    uri = f"file://{tmp_path}"
    run = open_store(f"{uri}/runs/fit")
    now = time.time()
    run.put_bytes(layout.EVENTS_KEY, "".join(json.dumps(e) + "\n" for e in [
        {"event": "started", "time": iso(now - 600), "attempt": 1, "config": {"steps": 300}},
        {"event": "evaluated", "time": iso(now - 300), "attempt": 1, "step": 100, "metrics": {"val_loss": 0.6}},
        {"event": "evaluated", "time": iso(now - 200), "attempt": 1, "step": 200, "metrics": {"val_loss": 0.3}}]).encode())
    run.put_bytes("tensorboard/train/events.out.tfevents.1.host.1.v2",
                  b"".join(scalars(e, epoch_loss=0.5 / (e + 1)) for e in range(3)))
    run.put_bytes("tensorboard/validation/events.out.tfevents.1.host.2.v2",
                  b"".join(scalars(e, epoch_loss=0.6 / (e + 1)) for e in range(3))
                  + b"".join(scalars(100 * (e + 1), evaluation_loss_vs_iterations=0.6 / (e + 1)) for e in range(2)))
    page = data.run_page(open_store(uri), "fit", now)
    for name, want in (("train/epoch_loss", [0.5, 0.25, 0.5 / 3]), ("validation/epoch_loss", [0.6, 0.3, 0.2])):
        assert [s for s, _v in page.curves[name]] == [0, 1, 2]
        assert [v for _s, v in page.curves[name]] == pytest.approx(want)  # float32
    assert "validation/evaluation_loss_vs_iterations" not in page.curves  # the events' val_loss holds its points
    charts = {c.get("data-metric"): c for c in svgs(render.run_page(uri, page, refresh=15), "curve")}
    assert set(charts) == {"train/epoch_loss", "validation/epoch_loss", "val_loss"}
    for name, unit, ticks in (("train/epoch_loss", "epoch", ["0", "1", "2"]),
                              ("validation/epoch_loss", "epoch", ["0", "1", "2"]),
                              ("val_loss", "step", ["100", "125", "150", "175", "200"])):
        chart = charts[name]
        assert chart.get("data-unit") == unit and [t.text for t in texts(chart, "unit")] == [f"{unit} →"]
        assert [t.text for t in texts(chart, "step-tick")] == ticks, name
        assert all(c.find("title").text.startswith(f"{unit} ") for c in chart.iter("circle"))


@pytest.mark.parametrize(("points", "ticks"), [
    ([(100000, 0.9372)], ["100000"]),  # one evaluation: its step, once
    ([(s, 1.0 / s) for s in range(1000, 200001, 1000)], ["50000", "100000", "150000", "200000"]),
    ([(0, 2.0), (123457, 0.1)], ["0", "50000", "100000"]),
    ([(0, 2.0), (3, 0.1)], ["0", "1", "2", "3"]),
])
def test_step_labels_are_whole_inside_the_chart_and_one_evaluation_has_one(points, ticks):
    chart = ET.fromstring(render.curve("val_accuracy", points, "evaluated events"))
    labels = texts(chart, "step-tick")
    assert [t.text for t in labels] == ticks
    assert all(inside(chart, t) for t in [*labels, *texts(chart, "value-tick")]), [
        (t.text, extent(t)) for t in labels if not inside(chart, t)]


@pytest.mark.parametrize(("name", "values"), [
    ("val_accuracy", [0.8333, 0.8333]),  # flat
    ("val_accuracy", [0.9372]),
    ("val_accuracy", [0.2, 0.999]),
    ("val_auc", [1.0, 1.0]),
])
def test_an_accuracys_axis_stays_between_0_and_1(name, values):
    chart = ET.fromstring(render.curve(name, list(enumerate(values, start=1)), "evaluated events"))
    ticks = [float(t.text) for t in texts(chart, "value-tick")]
    assert len(ticks) >= 2 and min(ticks) >= 0 and max(ticks) <= 1, ticks
    assert all(v - max(ticks) < 0.1 for v in values)


def test_a_loss_axis_does_not_run_below_0_and_its_labels_tell_the_ticks_apart():
    chart = ET.fromstring(render.curve("train/loss", [(1, 0.0021), (2, 0.0014), (3, 0.0012)], "TensorBoard"))
    labels = [t.text for t in texts(chart, "value-tick")]
    assert len(set(labels)) == len(labels) >= 2 and min(float(v) for v in labels) >= 0, labels


def _priced(tmp_path, seconds: float, price: float) -> data.RunPage:
    uri = f"file://{tmp_path}"
    t0 = time.time() - 7200
    open_store(f"{uri}/runs/cheap").put_bytes(layout.EVENTS_KEY, "".join(json.dumps(e) + "\n" for e in [
        {"event": "started", "time": iso(t0), "attempt": 1, "workers": 1,
         "config": {"steps": 300, "price_per_hour": price, "price_note": "spot estimate", "placement": "aws us-east-1"}},
        {"event": "finished", "time": iso(t0 + seconds - 5), "attempt": 1, "step": 300, "metrics": {"loss": 0.4}}]).encode())
    open_store(f"{uri}/runs/cheap").put_bytes(layout.COMPLETE, json.dumps(
        {"step": 300, "finished_at": iso(t0 + seconds), "metrics": {"loss": 0.4}}).encode())
    return data.run_page(open_store(uri), "cheap", time.time())


@pytest.mark.parametrize(("seconds", "price"), [(300, 0.16), (40, 0.35), (3 * 3600, 0.004)])
def test_a_cheap_runs_cost_ticks_differ_and_its_time_axis_ends_with_the_run(tmp_path, seconds, price):
    page = _priced(tmp_path, seconds, price)
    [chart] = svgs(render.cost_chart(page), "cost")
    ticks = [t.text for t in texts(chart, "cost-tick")]
    assert len(ticks) >= 2 and len(set(ticks)) == len(ticks) and ticks[0].startswith("$0.0"), ticks
    [span] = page.spans
    assert span.end - span.start == pytest.approx(seconds, abs=1)
    assert all(span.start - 1 <= float(t.get("data-t")) <= span.end for t in texts(chart, "time-tick"))
    # The line reaches the right end of the plot at the run's end: the axis is the run's time, no more.
    xs = [float(p.split(",")[0]) for line in chart.iter("polyline") for p in line.get("points").split()]
    assert max(xs) == pytest.approx(float(chart.get("width")) - 180, abs=0.2)
    assert all(inside(chart, t) for t in [*texts(chart, "cost-tick"), *texts(chart, "time-tick")])
    # The total beside the line, as precise as a cheap run needs.
    [total] = [t.text for t in chart.iter("text") if t.get("class") is None and "aws us-east-1" in (t.text or "")]
    cost = seconds / 3600 * price
    assert total == (f"aws us-east-1 ${cost:.2f}" if cost >= 0.01 else f"aws us-east-1 ${cost:.3f}"), total


def test_lane_names_and_move_reasons_are_drawn_whole(tmp_path):
    uri = f"file://{tmp_path}/bucket"
    scenarios.story(f"{uri}/runs/night", tmp_path / "src", start=time.time() - 9 * 3600)
    folder = tmp_path / "bucket" / "runs" / "night"
    long = {"i-0aaa": "i-0123456789abcdef0", "i-0bbb": "i-0fedcba9876543210", "i-0ccc": "i-0a1b2c3d4e5f60718"}
    for path in folder.rglob("*.jsonl"):
        text = path.read_text()
        for short, full in long.items():
            text = text.replace(short, full)
        path.write_text(text)
    page = data.run_page(open_store(uri), "night", time.time())
    [timeline] = svgs(render.run_page(uri, page, refresh=15), "timeline")
    lanes = [t for t in timeline.iter("text") if t.get("class") == "lane"]
    drawn = [" ".join(s.text for s in t.iter("tspan")) for t in lanes]
    assert drawn == [f"{long['i-0aaa']} (aws us-east-1)", f"{long['i-0bbb']} (aws us-east-1)",
                     f"{long['i-0ccc']} (aws us-west-2)"]
    # Each line fits left of the bars.
    assert all(8 + CHAR_W * len(s.text) <= 230 for t in lanes for s in t.iter("tspan"))
    [move] = [g for g in timeline.iter("g") if g.get("class") == "move"]
    lines = [s.text for s in move.iter("tspan")]
    assert " ".join(lines) == move.find("title").text and "(controller)" in lines[-1] and len(lines) > 1
    assert all(CHAR_W * len(line) <= float(timeline.get("width")) / 2 for line in lines)


def test_the_example_run_shows_as_its_best_one_of_its_evaluations(tmp_path):
    uri = f"file://{tmp_path}/bucket"
    scenarios.story(f"{uri}/runs/night", tmp_path / "src", start=time.time() - 9 * 3600)
    page = data.run_page(open_store(uri), "night", time.time())
    evaluations = dict(page.curves["val_accuracy"])
    best = page.st.best
    assert best["value"] == max(evaluations.values()) == evaluations[best["step"]]
    assert page.st.metrics["val_accuracy"] == evaluations[max(evaluations)]
