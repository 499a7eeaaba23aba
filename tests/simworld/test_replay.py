"""``python -m controller.replay``: the trace's format, its errors, and the example traces held to what their README
expected before they ran (examples/traces/README.md): ``cheapest`` finishes every run, never moves back within
``waitMinutes``, never costs more than ``inOrder`` beyond the move threshold, and ends where the README says."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from controller import record as records
from simworld import replay
from simworld.world import START

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "examples" / "traces"
def expected() -> dict[str, tuple[int, str]]:
    """The README's table: trace -> (where cheapest ends, what it costs against inOrder)."""
    rows = {}
    for line in (TRACES / "README.md").read_text().splitlines():
        found = re.match(r"\| `([\w-]+)\.jsonl`[^|]*\|[^|]*\| (\d+)\b[^|]*\| ([^|]*) \|$", line)
        if found:
            rows[found[1]] = (int(found[2]), found[3].strip())
    return rows


@cache
def outcome(name: str) -> tuple[dict, dict, list[dict], float]:
    """Both policies' results over a trace, cheapest's moves and the stack's wait (each trace runs once per session)."""
    trace = replay.read_trace(TRACES / f"{name}.jsonl")
    world = replay.Replay(trace, "cheapest")
    cheapest = world.replay()
    return cheapest, replay.replay(trace, "inOrder"), world.record().moves, world.config.wait_s


def test_the_readme_names_every_trace_and_at_least_eight():
    names = {p.stem for p in TRACES.glob("*.jsonl")}
    assert set(expected()) == names and len(names) >= 8


@pytest.mark.parametrize("name", sorted(expected()))
def test_cheapest_finishes_never_flaps_and_keeps_within_the_threshold_of_in_order(name):
    cheapest, in_order, moves, wait_s = outcome(name)
    assert cheapest["finished"], cheapest
    for a, b in zip(moves, moves[1:], strict=False):
        if a["from"] == b["to"]:
            gap = records.epoch_of(b["time"]) - records.epoch_of(a["time"])
            assert gap >= wait_s, f"{name}: {a['from']} -> {a['to']} -> {b['to']} within {gap:.0f} s"
    if in_order["finished"]:
        inputs = replay.Replay(replay.read_trace(TRACES / f"{name}.jsonl"), "cheapest").inputs
        threshold = max(inputs.move_floor_usd, inputs.move_fraction * in_order["cost_usd"])
        assert cheapest["cost_usd"] <= in_order["cost_usd"] + threshold, (cheapest, in_order)


@pytest.mark.parametrize("name", sorted(expected()))
def test_cheapest_ends_where_the_readme_expected(name):
    where, against = expected()[name]
    cheapest, in_order, _moves, _wait = outcome(name)
    assert cheapest["placement"] == where, (cheapest, in_order)
    if against == "the same cost":
        assert cheapest["cost_usd"] == pytest.approx(in_order["cost_usd"], rel=0.01)
    elif against.startswith("cheaper"):
        assert cheapest["cost_usd"] < in_order["cost_usd"]
    elif "does not finish" in against:
        assert not in_order["finished"]


def test_the_output_is_one_line_per_policy_and_the_same_for_the_same_trace(capsys):
    path = str(TRACES / "region-40-cheaper.jsonl")
    assert replay.main([path, "--policy", "cheapest"]) == 0
    first = capsys.readouterr().out
    assert replay.main([path, "--policy", "cheapest"]) == 0
    assert capsys.readouterr().out == first
    (doc,) = [json.loads(line) for line in first.splitlines()]
    assert list(doc) == ["policy", "cost_usd", "hours", "moves", "goodput", "finished", "placement"]
    assert doc == {**outcome("region-40-cheaper")[0]}


HEAD = '{"stack": "stacks/Pulumi.regions.yaml", "steps": 600, "steps_per_hour": {"0": 6000, "1": 6000}, ' \
       '"checkpoint_gib": 1.0}'


@pytest.mark.parametrize(("lines", "says"), [
    ([HEAD, '{"t": 60, "placement": 1, "prize": 0.3}'], ":2: prize: not a key of an event"),
    ([HEAD, '{"t": 60, "placement": 2, "price": 0.3}'], ":2: placement: expected one of [0, 1]"),
    ([HEAD, '{"t": 60, "placement": 0, "price": 0.3}', '{"t": 30, "placement": 0, "price": 0.4}'],
     ":3: t: 30 comes before the line above"),
    ([HEAD, '{"t": 60, "placement": 0, "capacity": "no"}'], ":2: capacity: expected true or false"),
    ([HEAD, '{"t": 60, "placement": 0, "price": 0.3, "preempt": true}'], ":2: price/preempt: expected exactly one"),
    ([HEAD, "{not json"], ":2: not JSON"),
    ([HEAD.replace('"steps": 600', '"steps": -1')], ":1: steps: expected a whole number"),
    ([HEAD.replace('"checkpoint_gib": 1.0', '"checkpoint_gb": 1.0')], ":1: checkpoint_gb: not a key of the run's line"),
    ([HEAD.replace("Pulumi.regions", "Pulumi.nowhere")], ":1: stack: no such file"),
    ([HEAD.replace('"checkpoint_gib": 1.0', '"checkpoint_gib": 1.0, "max_runtime_hours": 1000')],
     "stack stacks/Pulumi.regions.yaml: trainstack:compute.maxRuntimeHours: 1000.0: expected 720 or less"),
])
def test_a_bad_line_is_one_error_naming_the_line_and_the_key(tmp_path, capsys, lines, says):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert replay.main([str(path)]) == replay.EXIT_BAD_TRACE
    err = capsys.readouterr().err.strip()
    assert says in err and err.count("\n") == 0, err


def test_steps_per_hour_must_name_each_placement_of_the_stack(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(HEAD.replace(', "1": 6000', "") + "\n")
    assert replay.main([str(path)]) == replay.EXIT_BAD_TRACE
    assert "steps_per_hour: the stack has placements 0..1; missing [1]" in capsys.readouterr().err


def test_a_controller_that_breaks_an_invariant_exits_1_saying_which(monkeypatch, capsys):
    from controller import cost

    monkeypatch.setattr(cost, "worth_moving", lambda current, best, **k: best < current)  # any saving moves
    # noise: home launched first (us-west-2's checkpoint writes home make it dearer a unit of work), then small
    # savings at its restarts that only the threshold refuses.
    assert replay.main([str(TRACES / "noise.jsonl")]) == replay.EXIT_VIOLATION
    assert "cheapest: invariant 12 at t=" in capsys.readouterr().err


def test_the_trace_drives_prices_capacity_and_preemptions(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([HEAD, '{"t": 0, "placement": 1, "price": 0.3}',
                               '{"t": 600, "placement": 1, "price": null}', '{"t": 1200, "placement": 1, "price": 0.5}',
                               '{"t": 60, "placement": 0, "capacity": false}', '{"t": 900, "placement": 0, "capacity": true}',
                               '{"t": 300, "placement": 0, "preempt": true}']) + "\n")
    with pytest.raises(replay.TraceError, match=":5: t: 60 comes before"):
        replay.read_trace(path)
    path.write_text("\n".join([HEAD, '{"t": 0, "placement": 1, "price": 0.3}', '{"t": 60, "placement": 0, "capacity": false}',
                               '{"t": 600, "placement": 1, "price": null}', '{"t": 900, "placement": 0, "capacity": true}',
                               '{"t": 1200, "placement": 1, "price": 0.5}']) + "\n")
    world = replay.Replay(replay.read_trace(path), "cheapest")
    assert world.price_at(1, START + 599) == 0.3 and world.price_at(1, START + 1300) == 0.5
    assert world.outages[0] == [(START + 60, START + 900, "capacity")]
    assert world.capacity(0, START + 100) == "capacity" and world.capacity(0, START + 901) is None
    assert world.silent[1] == [(START + 600, START + 1200)]
