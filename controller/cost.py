r"""The expected cost to finish a run in each placement, and when a saving is worth a move: pure functions.

For a placement *p* at a decision point (a restart: the first launch, a preemption, a failed launch, the
end of a move):

    E_p = price_p x nodes x (remaining_steps / rate_p x overhead_p + boot_p)
          + checkpoint_bytes x restore_p x (1 + expected preemptions)        (home bucket -> p, each start)
          + checkpoint writes back to home for the hours left                 (CheckpointWrites.per_hour)
          + data_bytes x restore_p x nodes x (1 + expected preemptions)     (the data, each machine, each start)

- **rate_p** (:func:`rate_for`): the run's own measured steps per hour on p's GPU type; elsewhere the
  measured rate scaled by :data:`RELATIVE_THROUGHPUT` (per GPU; every placement has the same GPUs per
  machine). With no measurement at all it is unknown, and so is E_p.
- **lambda_p** (:func:`preemption_rate`): the run's own preemptions per machine-hour there, with a prior
  of one preemption a machine-day weighing :data:`PRIOR_MACHINE_HOURS` machine-hour (a pseudo-count: the
  run's own count takes over within its first hours there).
- **overhead_p** (:func:`overhead`) = 1 / (1 - L), L = nodes x lambda_p x (checkpoint interval / 2 + boot_p).
- **data_bytes**: what each machine stages of the run's training data at each start (the newest
  ``data_staged`` event's bytes; 0 before the run first staged it, and for synthetic data). It is priced
  on the checkpoint's route, from the home bucket's side: where the data is the home bucket's (the usual
  ``run.dataUri``) that is exact; data in a bucket elsewhere is priced as if it were home's. Home itself
  reads it in its own region: free.

Why 1 / (1 - L) (and not 1 + L)
-------------------------------
Let W be the hours of kept progress the run still needs and T the paid hours it takes. With several
machines, any one's preemption stops them all, so the group is preempted at Lambda = nodes x lambda per
paid hour, Poisson. Each preemption throws away what was trained since the last commit, about half a
checkpoint interval c on average, and costs a boot b before training resumes: a loss of l = c/2 + b
paid hours. The paid time is the kept progress plus the losses: T = W + l x N(T), with N(T) the
preemptions during T. The redone work and the boots are paid time too, exposed to preemption like the
rest, so N counts over all of T: by Wald's identity E[N(T)] = Lambda x E[T], hence
E[T] = W + l x Lambda x E[T], that is E[T] = W / (1 - L) with L = Lambda x l. Equivalently: a loss
is redone, and the redo is itself preempted at the same rate, 1 + L + L^2 + ... = 1 / (1 - L).
1 + L is the first term of that series: it counts each loss once and never the losses of the redo.
The two agree for a small L and part ways exactly where it matters: at L = 0.5, 1 + L says the run
costs 1.5x its work, while it costs 2x; at L >= 1 the series diverges: a preemption comes, on average,
before the loss of the previous one is made good, and the run never finishes. Such a placement is
infeasible (:func:`overhead` answers None).

The trainer commits on a fixed cadence, so the loss is not quite independent of the arrivals: when
preemptions come often, they come early in an interval and lose less than c/2 on average. For that
mechanism 1 / (1 - L) is an upper bound (second order: it exceeds the exact expectation by
x^2/2 + xy/2 + y^2/12 with x = Lambda b, y = Lambda c, while 1 + L falls short of it by
x^2/2 + xy/2 + y^2/6): the estimate never undercounts a preempting placement's cost.
tests/controller/test_cost.py checks both against seeded Monte Carlo runs of preemptions.

Before any measured rate (the first launch)
-------------------------------------------
With rate_p unknown everywhere, E is unknown everywhere, yet the first launch must go somewhere. Writing the
unknown rate as rate_p = k x r_p (k steps per hour of a T4, r_p the GPU's :data:`RELATIVE_THROUGHPUT`, the
same k everywhere: every placement trains the same model on the same replicas), E_p is

    (steps left / k) x (price_p x nodes + restores_p per hour + writes_p per hour) x overhead_p / r_p
        + the first boot and restore,

and only the first term grows with the work left. Its bracket, :func:`work_price` (USD per hour of a T4's
work; the restores per hour are those after preemptions, nodes x lambda_p a paid hour), ranks the placements
as E would wherever the training outweighs one boot and one restore, which is
what a run long enough to be worth several placements is. The first launch takes the least of it when no
placement has a known E (controller/table.py's ``choose``); once the run has measured its rate, E decides.

Moving (:func:`worth_moving`): a run moves for price only when the saving E_current - E_best exceeds both
``moveFloorUsd`` and ``moveFraction`` x E_current (``trainstack:placement``): noise below either never moves
a run. While a machine trains (``rebalance``), the saving must also cover the restart (:func:`restart_cost`).

Standard library only: the controller's function imports it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# Training throughput per GPU relative to a T4, by GPU model as the stack names it (components/catalog.py's
# gpu_model: AWS families, GCE machine families, an N1 machine's accelerator). Coarse figures of mixed-precision
# training of mid-size vision and language models, as published GPU training benchmarks (MLPerf Training
# results, NVIDIA's and Lambda's GPU benchmark tables) rank these GPUs, rounded; not measured by trainstack. A
# run's own measured rate always wins: the table only scales it to a GPU type the run has not trained on.
RELATIVE_THROUGHPUT: dict[str, float] = {
    "T4": 1.0, "nvidia-tesla-t4": 1.0,
    "nvidia-tesla-p4": 0.6,
    "nvidia-tesla-p100": 1.2,
    "V100 16GB": 2.5, "V100 32GB": 2.6, "nvidia-tesla-v100": 2.5,
    "A10G": 2.2,
    "L4": 1.9,
    "L40S": 4.5,
    "A100 40GB": 5.0,
    "A100 80GB": 5.5,
    "H100": 10.0, "H100 Mega": 10.0,
    "H200": 11.0,
}
# The prior of a placement's preemption rate (module docstring): PRIOR_PREEMPTIONS in PRIOR_MACHINE_HOURS.
# Its mean, one a machine-day: above Google's published average for preemptible VMs (5-15 % of them a day) and
# AWS's Spot Instance Advisor's buckets (the highest, "> 20 %", is a month's share), since GPU types are the most
# reclaimed. Its weight, one machine-hour: the run's own count takes over within its first hours there. A prior
# weighing a machine-day (1 in 24) kept a placement that preempts every 10 minutes looking cheap for 7 hours in
# the replay (examples/traces/preempts-every-10-min.jsonl: 17.66 USD against inOrder's 9.48); weighing one hour
# it is left after 40 minutes (10.19 USD).
PRIOR_PREEMPTIONS = 1.0 / 24.0
PRIOR_MACHINE_HOURS = 1.0
# The move threshold's defaults (trainstack:placement moveFloorUsd / moveFraction, components/settings).
DEFAULT_MOVE_FLOOR_USD = 1.0
DEFAULT_MOVE_FRACTION = 0.1
GB = 1e9  # transfer prices are per GB (10^9 bytes)


def rate_for(gpu: str | None, measured: Mapping[str, float]) -> tuple[float | None, str]:
    """(steps per hour on ``gpu``, where it comes from): the run's own rate on that GPU type (``measured``, steps per
    hour by GPU model), else the best-known measured rate scaled by :data:`RELATIVE_THROUGHPUT`; (None, why) when
    neither can say."""
    own = measured.get(gpu or "")
    if own:
        return float(own), "measured"
    if gpu not in RELATIVE_THROUGHPUT:
        return None, f"no throughput figure for {gpu or 'an unknown GPU'}"
    scaled = [(rate * RELATIVE_THROUGHPUT[gpu] / RELATIVE_THROUGHPUT[other], other)
              for other, rate in sorted(measured.items()) if rate and other in RELATIVE_THROUGHPUT]
    if not scaled:
        return None, "no measured rate yet"
    # Of several GPUs measured, the one nearest in throughput: the shortest step on the table, the least error.
    rate, other = min(scaled, key=lambda s: abs(math.log(RELATIVE_THROUGHPUT[gpu] / RELATIVE_THROUGHPUT[s[1]])))
    return rate, f"scaled from {other}"


def preemption_rate(preemptions: int, machine_hours: float) -> float:
    """lambda: preemptions per machine-hour from the run's own count there, with the prior (module docstring)."""
    return (max(0, preemptions) + PRIOR_PREEMPTIONS) / (max(0.0, machine_hours) + PRIOR_MACHINE_HOURS)


def loss_load(nodes: int, lam: float, checkpoint_interval_h: float, boot_h: float) -> float:
    """L = nodes x lambda x (checkpoint interval / 2 + boot): the share of paid time a preemption's loss takes."""
    return nodes * lam * (checkpoint_interval_h / 2 + boot_h)


def overhead(nodes: int, lam: float, checkpoint_interval_h: float, boot_h: float) -> float | None:
    """Paid hours per hour of kept progress, 1 / (1 - L); None when L >= 1 (the run would never finish there)."""
    load = loss_load(nodes, lam, checkpoint_interval_h, boot_h)
    return None if load >= 1 else 1.0 / (1.0 - load)


@dataclass(frozen=True)
class RunFacts:
    """What the run says about itself at a decision point (the same for every placement)."""

    nodes: int
    remaining_steps: int
    checkpoint_interval_s: float
    """Seconds between commits (``run.checkpointEverySeconds``, or measured between the run's checkpoints)."""
    checkpoint_bytes: int
    """The newest committed checkpoint's size."""
    measured_rates: Mapping[str, float]
    """Steps per hour by GPU model where the run has trained."""
    now: float
    deadline: float | None = None
    """Epoch seconds by which the run must finish (None: no cap)."""
    data_bytes: int = 0
    """What each machine stages of the training data at each start (module docstring); 0: none known."""


@dataclass(frozen=True)
class PlacementFacts:
    """One placement as the decision sees it."""

    index: int
    price: float | None
    """USD per machine-hour (controller/prices.py); None: unknown."""
    gpu: str | None
    preemptions: int = 0
    """The run's preemptions there."""
    machine_hours: float = 0.0
    """The run's machine-hours there."""
    boot_s: float = 600.0
    """The replacement boot (boot to first step) for its cloud: what each preemption there costs (in L)."""
    boot_left_s: float | None = None
    """What is left of this restart's boot there (a replacement already booting has paid the rest); None: all of it."""
    restore_per_gb: float | None = 0.0
    """USD per GB to read the checkpoint from the home bucket there (components/pricing.py transfer_per_gb)."""
    writes_per_gb: float | None = 0.0
    """USD per GB to write a checkpoint from there to the home bucket (CheckpointWrites' transfer)."""
    max_price: float | None = None
    """The placement's maximum price per machine-hour (AWS's spot max price), None: none."""
    allowed: bool = True
    """Whether the failed-launch and waiting rules (controller/decide.py) let the run go there now."""
    not_allowed: str = ""
    running: bool = False
    """The run is training there now: no boot and no restore before it goes on."""


@dataclass(frozen=True)
class Estimate:
    """E_p and its parts (USD, hours), whether p is feasible, and why not."""

    index: int
    cost: float | None
    """E_p in USD; None when the price, the rate or a transfer price is unknown."""
    feasible: bool
    why: str
    rate: float | None = None
    rate_source: str = ""
    lam: float = 0.0
    load: float = 0.0
    overhead: float | None = None
    hours: float | None = None
    """Paid hours to finish there, boot included."""
    machines_usd: float | None = None
    transfer_usd: float | None = None
    """The restores (the first and one after each expected preemption) with the data each machine stages then,
    and the checkpoint writes."""
    finish_at: float | None = None
    work_usd: float | None = None
    """:func:`work_price`, where the rate is unknown and the rest is known: what ranks a first launch."""


def _start_gb(run: RunFacts) -> float:
    """GB read from the home bucket's side at each start of the group: the checkpoint, and the data on each machine."""
    return (run.checkpoint_bytes + run.data_bytes * run.nodes) / GB


def work_price(run: RunFacts, p: PlacementFacts, lam: float, overhead_factor: float) -> float | None:
    """USD per hour of a T4's work (module docstring: before any measured rate): an hour's machines, restores after
    preemptions and checkpoint writes home, times the overhead, over the GPU's relative throughput; None without a
    throughput figure for its GPU or a price."""
    relative = RELATIVE_THROUGHPUT.get(p.gpu or "")
    if not relative or p.price is None or p.writes_per_gb is None or p.restore_per_gb is None:
        return None
    gb = _start_gb(run)
    writes = p.writes_per_gb * run.checkpoint_bytes / GB * 3600 / run.checkpoint_interval_s \
        if run.checkpoint_interval_s else 0.0
    restores = p.restore_per_gb * gb * run.nodes * lam
    return round((p.price * run.nodes + restores + writes) * overhead_factor / relative, 6)


def estimate(run: RunFacts, p: PlacementFacts) -> Estimate:
    """E_p (module docstring) and p's feasibility: the waiting rules, the preemption load, the deadline and the
    maximum price; a placement with an unknown part is feasible but has no E (it ranks after every known one)."""
    rate, rate_source = rate_for(p.gpu, run.measured_rates)
    lam = preemption_rate(p.preemptions, p.machine_hours)
    boot_h = 0.0 if p.running else (p.boot_s if p.boot_left_s is None else p.boot_left_s) / 3600
    interval_h = run.checkpoint_interval_s / 3600
    load = loss_load(run.nodes, lam, interval_h, p.boot_s / 3600)
    factor = overhead(run.nodes, lam, interval_h, p.boot_s / 3600)
    base = dict(index=p.index, rate=rate, rate_source=rate_source, lam=lam, load=load, overhead=factor)
    if not p.allowed:
        return Estimate(cost=None, feasible=False, why=p.not_allowed or "not allowed now", **base)
    if factor is None:
        return Estimate(cost=None, feasible=False, why=f"preempts too often to finish (L = {load:.2f} >= 1)", **base)
    if p.max_price is not None and p.price is not None and p.price > p.max_price:
        return Estimate(cost=None, feasible=False, why=f"price {p.price:.4f} above the maximum {p.max_price:.4f}",
                        **base)
    if rate is None:
        return Estimate(cost=None, feasible=True, why=f"rate unknown: {rate_source}",
                        work_usd=work_price(run, p, lam, factor), **base)
    train_h = max(0, run.remaining_steps) / rate * factor
    hours = train_h + boot_h
    finish_at = run.now + hours * 3600
    if run.deadline is not None and finish_at > run.deadline:
        return Estimate(cost=None, feasible=False, hours=hours, finish_at=finish_at,
                        why=f"would finish {(finish_at - run.deadline) / 3600:.1f} h after the deadline", **base)
    if p.price is None:
        return Estimate(cost=None, feasible=True, hours=hours, finish_at=finish_at, why="price unknown", **base)
    if p.restore_per_gb is None or p.writes_per_gb is None:
        return Estimate(cost=None, feasible=True, hours=hours, finish_at=finish_at, why="transfer price unknown",
                        **base)
    preemptions = run.nodes * lam * hours
    restores = (0 if p.running else 1) + preemptions
    writes_per_hour = p.writes_per_gb * run.checkpoint_bytes / GB * 3600 / run.checkpoint_interval_s \
        if run.checkpoint_interval_s else 0.0
    transfer = p.restore_per_gb * _start_gb(run) * restores + writes_per_hour * train_h
    machines = p.price * run.nodes * hours
    cost = machines + transfer
    return Estimate(cost=round(cost, 4), feasible=True, why="", hours=hours, finish_at=finish_at,
                    machines_usd=round(machines, 4), transfer_usd=round(transfer, 4), **base)


def rank_key(e: Estimate) -> tuple[int, float, int]:
    """Feasible with a known E, cheapest first; then feasible with an unknown E; then the infeasible; by index."""
    if e.feasible and e.cost is not None:
        return (0, e.cost, e.index)
    return (1 if e.feasible else 2, 0.0, e.index)


def worth_moving(current: float, best: float, *, floor_usd: float = DEFAULT_MOVE_FLOOR_USD,
                 fraction: float = DEFAULT_MOVE_FRACTION, restart_usd: float = 0.0) -> bool:
    """Whether moving from E ``current`` to E ``best`` saves more than both ``floor_usd`` and ``fraction`` x
    ``current``, after ``restart_usd`` (what stopping a training machine costs: :func:`restart_cost`)."""
    saving = current - best - restart_usd
    return saving > floor_usd and saving > fraction * current


def restart_cost(*, nodes: int, price_to: float, boot_s: float, price_from: float, steps_since_commit: int,
                 rate_from: float) -> float:
    """What stopping a training machine for a move costs beyond E: the new placement's boot, and the steps
    trained since the last commit, thrown away."""
    return nodes * (price_to * boot_s / 3600 + price_from * max(0, steps_since_commit) / rate_from)
