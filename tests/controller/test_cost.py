"""The expected cost to finish (controller/cost.py): E_p's parts, feasibility, the move threshold, and the
preemption overhead 1 / (1 - L) against seeded Monte Carlo runs of preemptions."""

from __future__ import annotations

import random

import pytest

from controller import cost
from controller.cost import Estimate, PlacementFacts, RunFacts

NOW = 1_765_000_000.0


def _run(**kw) -> RunFacts:
    base = dict(nodes=1, remaining_steps=60_000, checkpoint_interval_s=1800, checkpoint_bytes=2 * 10**9,
                measured_rates={"A10G": 20_000.0}, now=NOW)
    return RunFacts(**{**base, **kw})


# -- 1 / (1 - L), checked against preemptions drawn at random -----------------------------------------

def _paid_hours_fixed_loss(rng: random.Random, work_h: float, rate: float, interval_h: float, boot_h: float) -> float:
    """Paid hours to keep ``work_h`` when the group is preempted at ``rate`` per paid hour and each preemption loses
    a uniform share of a checkpoint interval plus a boot, lost time that is paid and preempted like any other."""
    left, paid = work_h, 0.0
    while True:
        gap = rng.expovariate(rate)
        if gap >= left:
            return paid + left
        paid += gap
        left += -gap + rng.uniform(0, interval_h) + boot_h


def _paid_hours_trainer(rng: random.Random, work_h: float, rate: float, interval_h: float, boot_h: float) -> float:
    """The trainer's mechanics: a commit every ``interval_h`` of training, a preemption loses what was trained since
    the last one and costs a boot (which a preemption may interrupt too)."""
    kept = since = paid = 0.0
    booting = 0.0  # the first boot is E's boot_p, not the overhead's
    while True:
        gap = rng.expovariate(rate)
        if booting:
            if gap < booting:
                paid, booting = paid + gap, boot_h
                continue
            paid, gap, booting = paid + booting, gap - booting, 0.0
        while True:
            step = min(interval_h - since, work_h - kept - since)
            if gap < step:
                paid, since, booting = paid + gap, 0.0, boot_h
                break
            paid, gap, since = paid + step, gap - step, since + step
            if kept + since >= work_h - 1e-12:
                return paid
            kept, since = kept + since, 0.0


@pytest.mark.parametrize("load", [0.2, 0.5])
def test_the_overhead_is_one_over_one_minus_the_load_not_one_plus_it(load):
    rng = random.Random(43)
    interval_h, boot_h, work_h = 1.0, 0.25, 20.0
    rate = load / (interval_h / 2 + boot_h)
    runs = [_paid_hours_fixed_loss(rng, work_h, rate, interval_h, boot_h) for _ in range(2000)]
    mean = sum(runs) / len(runs)
    factor = cost.overhead(1, rate, interval_h, boot_h)
    assert factor == pytest.approx(1 / (1 - load))
    assert mean == pytest.approx(work_h * factor, rel=0.03)
    if load >= 0.5:
        assert abs(mean - work_h * (1 + load)) > 0.15 * mean  # where it matters, 1 + L is far off


def test_for_the_trainers_fixed_cadence_one_over_one_minus_l_bounds_the_cost_from_above():
    rng = random.Random(7)
    interval_h, boot_h, work_h, load = 1.0, 0.25, 20.0, 0.5
    rate = load / (interval_h / 2 + boot_h)
    runs = [_paid_hours_trainer(rng, work_h, rate, interval_h, boot_h) for _ in range(2000)]
    mean = sum(runs) / len(runs)
    assert work_h * (1 + load) * 1.03 < mean < work_h / (1 - load) * 0.97


def test_the_load_counts_every_machine_and_a_load_of_one_never_finishes():
    # Any machine's preemption stops all of them: four machines load four times one.
    assert cost.loss_load(4, 0.05, 1.0, 0.25) == pytest.approx(4 * cost.loss_load(1, 0.05, 1.0, 0.25))
    assert cost.overhead(1, 1 / 0.75, 1.0, 0.25) is None  # L = 1
    assert cost.overhead(1, 0.999 / 0.75, 1.0, 0.25) == pytest.approx(1000)


# -- rate and preemptions -----------------------------------------------------------------------------

def test_the_runs_own_rate_wins_and_other_gpus_scale_it_by_the_table():
    assert cost.rate_for("A10G", {"A10G": 20_000.0}) == (20_000.0, "measured")
    rate, why = cost.rate_for("L4", {"A10G": 22_000.0, "H100": 1.0})
    assert (rate, why) == (pytest.approx(22_000 * 1.9 / 2.2), "scaled from A10G")
    assert cost.rate_for("L4", {}) == (None, "no measured rate yet")
    assert cost.rate_for("K80", {"A10G": 1.0}) == (None, "no throughput figure for K80")


def test_the_preemption_rate_starts_at_the_prior_and_follows_the_runs_own_count():
    assert cost.preemption_rate(0, 0) == pytest.approx(1 / 24)
    assert cost.preemption_rate(30, 100) == pytest.approx((30 + 1 / 24) / 101)
    assert cost.preemption_rate(0, 2400) < 0.0005


def test_a_placement_preempted_every_few_minutes_is_seen_so_within_its_first_hour():
    # Six preemptions in the first machine-hour there (a machine taken every 10 minutes): the run's own count,
    # not the prior of one a machine-day, says how often it preempts (controller/cost.py's prior weighs an hour).
    assert cost.preemption_rate(6, 1.0) > 3.0
    assert cost.preemption_rate(2, 0.25) > 1.5


# -- E_p and feasibility --------------------------------------------------------------------------------

def test_the_expected_cost_adds_machines_restores_and_checkpoint_writes():
    run = _run()
    p = PlacementFacts(index=1, price=0.5, gpu="A10G", boot_s=360, restore_per_gb=0.02, writes_per_gb=0.02)
    e = cost.estimate(run, p)
    lam = 1 / 24
    factor = 1 / (1 - lam * (0.25 + 0.1))
    train_h = 3 * factor
    hours = train_h + 0.1
    machines = 0.5 * hours
    transfer = 0.02 * 2 * (1 + lam * hours) + 0.02 * 2 * 2 * train_h  # two restores... and two writes an hour
    assert e.feasible and e.why == ""
    assert (e.machines_usd, e.transfer_usd, e.cost) == (round(machines, 4), round(transfer, 4),
                                                        round(machines + transfer, 4))
    assert e.hours == pytest.approx(hours) and e.finish_at == pytest.approx(NOW + hours * 3600)
    # Training there now: no boot and no first restore.
    running = cost.estimate(run, PlacementFacts(**{**p.__dict__, "running": True}))
    assert running.hours == pytest.approx(train_h) and running.cost < e.cost


def test_a_200_gib_checkpoint_to_the_other_cloud_costs_more_than_its_cheaper_machines_save():
    run = _run(checkpoint_bytes=200 * 2**30, remaining_steps=20_000)
    home = cost.estimate(run, PlacementFacts(0, price=1.0, gpu="A10G"))
    other = cost.estimate(run, PlacementFacts(1, price=0.6, gpu="A10G", restore_per_gb=0.09, writes_per_gb=0.12))
    assert other.machines_usd < home.machines_usd and other.cost > home.cost
    assert sorted([other, home], key=cost.rank_key)[0] is home


def test_each_machine_stages_the_data_again_at_each_start_where_the_data_is_not():
    # 50 GB of data on each of two machines, a 2 GB checkpoint: each start there reads 102 GB from home's side.
    run, data = _run(nodes=2), _run(nodes=2, data_bytes=50 * 10**9)
    away = PlacementFacts(1, price=0.5, gpu="A10G", restore_per_gb=0.02, writes_per_gb=0.02)
    plain, staged = cost.estimate(run, away), cost.estimate(data, away)
    starts = 1 + 2 * (1 / 24) * staged.hours  # the first start and each expected preemption of the group
    assert staged.transfer_usd - plain.transfer_usd == pytest.approx(0.02 * 100 * starts, abs=1e-3)
    assert staged.cost - plain.cost == pytest.approx(0.02 * 100 * starts, abs=1e-3)
    # Home reads it in its own region: the same E with data or without; training there now: no first start.
    home = PlacementFacts(0, price=0.5, gpu="A10G")
    assert cost.estimate(data, home).cost == cost.estimate(run, home).cost
    running = PlacementFacts(**{**away.__dict__, "running": True})
    gone = 0.02 * 100 * 2 * (1 / 24) * cost.estimate(data, running).hours
    assert cost.estimate(data, running).transfer_usd - cost.estimate(run, running).transfer_usd == pytest.approx(
        gone, abs=1e-3)
    # Before any rate: the first launch's price per unit of work counts the restaging after preemptions too.
    unknown = _run(nodes=2, measured_rates={}, data_bytes=50 * 10**9)
    assert cost.work_price(unknown, away, 1 / 24, 1.0) > cost.work_price(_run(nodes=2, measured_rates={}), away,
                                                                          1 / 24, 1.0)


@pytest.mark.parametrize(("placement", "run", "why"), [
    (PlacementFacts(0, price=0.5, gpu="A10G", allowed=False, not_allowed="failed 3 min ago"), {}, "failed 3 min ago"),
    (PlacementFacts(0, price=0.5, gpu="A10G", preemptions=200, machine_hours=40), {},
     "preempts too often to finish (L = 2.03 >= 1)"),
    (PlacementFacts(0, price=0.9, gpu="A10G", max_price=0.8), {}, "price 0.9000 above the maximum 0.8000"),
    (PlacementFacts(0, price=0.5, gpu="A10G", boot_s=0), {"deadline": NOW + 2 * 3600},
     "would finish 1.0 h after the deadline"),
])
def test_an_infeasible_placement_says_why(placement, run, why):
    e = cost.estimate(_run(**run), placement)
    assert (e.feasible, e.cost, e.why) == (False, None, why)


def test_a_deadline_only_the_fastest_placement_meets():
    run = _run(deadline=NOW + 2.5 * 3600, measured_rates={"L4": 15_000.0})
    slow = cost.estimate(run, PlacementFacts(0, price=0.3, gpu="L4"))
    fast = cost.estimate(run, PlacementFacts(1, price=2.0, gpu="A100 40GB"))
    assert (slow.feasible, fast.feasible) == (False, True)
    assert sorted([slow, fast], key=cost.rank_key)[0] is fast


def test_an_unknown_price_or_rate_ranks_after_every_known_cost_and_before_the_infeasible():
    run = _run()
    known = cost.estimate(run, PlacementFacts(2, price=5.0, gpu="A10G"))
    no_price = cost.estimate(run, PlacementFacts(0, price=None, gpu="A10G"))
    no_rate = cost.estimate(run, PlacementFacts(1, price=0.1, gpu="K80"))
    no_transfer = cost.estimate(run, PlacementFacts(4, price=0.1, gpu="A10G", restore_per_gb=None))
    infeasible = cost.estimate(run, PlacementFacts(3, price=0.1, gpu="A10G", allowed=False))
    assert (no_price.why, no_rate.why, no_transfer.why) == ("price unknown", "rate unknown: no throughput figure for K80",
                                                           "transfer price unknown")
    ranked = sorted([infeasible, no_rate, no_transfer, no_price, known], key=cost.rank_key)
    assert [e.index for e in ranked] == [2, 0, 1, 4, 3]


# -- the move threshold ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("current", "best", "restart", "moves"), [
    (100.0, 89.0, 0.0, True),   # saves 11: above $1 and 10 %
    (100.0, 90.0, 0.0, False),  # saves exactly 10 %: not above it
    (5.0, 3.9, 0.0, True),      # saves 1.10: above $1 and 10 % of 5
    (5.0, 4.05, 0.0, False),    # saves 0.95: under the floor
    (100.0, 80.0, 10.5, False),  # the restart eats the saving down to 9.5
])
def test_a_run_moves_only_when_the_saving_beats_the_floor_and_the_fraction(current, best, restart, moves):
    assert cost.worth_moving(current, best, floor_usd=1.0, fraction=0.1, restart_usd=restart) is moves


def test_the_restart_costs_the_new_boot_and_the_steps_since_the_commit():
    assert cost.restart_cost(nodes=2, price_to=1.2, boot_s=600, price_from=0.9, steps_since_commit=5000,
                             rate_from=20_000) == pytest.approx(2 * (1.2 * 600 / 3600 + 0.9 * 0.25))


def test_the_estimate_is_a_plain_record():
    assert Estimate(0, None, True, "").cost is None  # the table (controller/table.py) writes its fields


def test_before_a_measured_rate_the_work_price_ranks_the_placements_as_e_does_for_a_long_run():
    """The first launch's rank (work_price) against E with the rate known as k x relative throughput, over seeded
    placements: for a run of many hours they order the same, and with no rate E is unknown but work_price is not."""
    rng = random.Random(7)
    gpus = ["T4", "A10G", "L4", "A100 40GB"]
    checked = 0
    for _ in range(200):
        facts = [PlacementFacts(index=i, price=rng.uniform(0.2, 4.0), gpu=rng.choice(gpus),
                                preemptions=rng.randint(0, 3), machine_hours=rng.uniform(0, 10),
                                writes_per_gb=rng.choice((0.0, 0.02, 0.09)), restore_per_gb=0.02) for i in range(3)]
        unknown = RunFacts(nodes=2, remaining_steps=10**7, checkpoint_interval_s=600, checkpoint_bytes=2 * 10**9,
                           measured_rates={}, now=0.0)
        blind = [cost.estimate(unknown, f) for f in facts]
        assert all(e.cost is None and e.work_usd is not None for e in blind if e.feasible)
        known = RunFacts(**{**unknown.__dict__, "measured_rates": {"T4": 1000.0}})
        seen = [cost.estimate(known, f) for f in facts]
        feasible = [i for i in range(3) if seen[i].feasible and seen[i].cost is not None]
        if len(feasible) < 2:
            continue
        assert min(feasible, key=lambda i: seen[i].cost) == min(feasible, key=lambda i: blind[i].work_usd)
        checked += 1
    assert checked > 100
