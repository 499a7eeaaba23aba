"""The decision table: why the run goes where it goes, one row per placement, written to the run folder.

At every decision point the controller prices each placement (:mod:`controller.prices`), estimates what
finishing there would cost (:mod:`controller.cost`), picks one (:func:`choose`) and writes the whole table
as ``decisions/<UTC time>.json`` (:func:`layout.decision_key`), so that ``ops status``, the dashboard
and ``ops synth`` can say why the run is where it is:

    {"time": "2026-12-06T02:30:00Z", "policy": "cheapest", "active": 0, "chosen": 1,
     "reason": "saves 12.40 USD (31 %) over placement 0", "rows": [
       {"index": 0, "label": "aws us-east-1", "price": 0.41, "price_source": "aws", "price_age_s": 120.0,
        "score": 7, "rate": 20000.0, "rate_source": "measured", "lam": 0.04, "load": 0.02,
        "transfer_usd": 0.0, "cost": 40.1, "hours": 3.1, "feasible": true, "why": "", "work_usd": null,
        "boot_s": 600.0, "boot_source": "prior"}, ...]}

(``work_usd``: USD per hour of a T4's work, where the rate is unknown: what ranks a first launch; the first
launch's table also says ``"first_launch": true``, with ``active`` null.)

``choose`` with ``policy`` ``inOrder`` keeps the listed order (the first placement the waiting rules allow);
with ``cheapest`` it takes the feasible placement of least expected cost, and leaves the active one only
when the saving beats the move threshold (:func:`controller.cost.worth_moving`). At the run's first launch
(``first``) nothing runs anywhere, so nothing is moved: no threshold, the cheapest feasible placement; with no
E known anywhere (no measured rate yet), the least price per unit of GPU work (controller/cost.py's
``work_price``), else the listed order's first feasible one. Pure but for
:func:`write` and :func:`latest`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from controller import cost
from controller.cost import Estimate
from controller.prices import Quote
from runfolder import layout
from runfolder.storage.errors import NotFound

CHEAPEST, IN_ORDER = "cheapest", "inOrder"
POLICIES = (CHEAPEST, IN_ORDER)


@dataclass(frozen=True)
class Row:
    """One placement's line of the table."""

    index: int
    label: str
    price: float | None
    price_source: str
    price_age_s: float | None
    score: int | None
    rate: float | None
    rate_source: str
    lam: float
    load: float
    transfer_usd: float | None
    cost: float | None
    hours: float | None
    feasible: bool
    why: str
    work_usd: float | None = None
    """USD per hour of a T4's work where the rate is unknown (controller/cost.py's ``work_price``)."""
    boot_s: float | None = None
    """The replacement boot in its cloud (seconds; the active placement's estimate counts what is left of it)."""
    boot_source: str = ""
    """``measured`` (the run's own boots in that cloud) or ``prior`` (the stack's figure)."""


def labels(places: Sequence[tuple[str, str, str | None]]) -> list[str]:
    """Each placement's label in the table, from its (cloud, region, project): ``aws us-west-2``, as an operator
    types it, and where two placements share a cloud and region (GCP placements in several projects) its project
    too, else its index, so that no two rows read the same."""
    plain = [f"{cloud} {region}" for cloud, region, _ in places]
    return [label if plain.count(label) == 1 else f"{label} ({project or f'placement {i}'})"
            for i, (label, (_, _, project)) in enumerate(zip(plain, places, strict=True))]


def rows(labels: Sequence[str], quotes: Sequence[Quote], estimates: Sequence[Estimate], *, now: float,
         boots: Sequence[tuple[float, str]] | None = None) -> list[Row]:
    """The table's rows, one per placement in listed order (``labels``, ``quotes``, ``estimates`` and ``boots``, the
    boot each estimate used and its source, by index)."""
    out = []
    boots = boots if boots is not None else [(None, "")] * len(estimates)
    for label, q, e, (boot, boot_source) in zip(labels, quotes, estimates, boots, strict=True):
        age = q.age(now)
        why = e.why or (q.note if q.source in ("stale", "unknown", "estimate") else "")
        out.append(Row(index=e.index, label=label, price=q.price, price_source=q.source,
                       price_age_s=None if age is None else round(age, 1), score=q.score,
                       rate=None if e.rate is None else round(e.rate, 2), rate_source=e.rate_source,
                       lam=round(e.lam, 6), load=round(e.load, 4), transfer_usd=e.transfer_usd, cost=e.cost,
                       hours=None if e.hours is None else round(e.hours, 3), feasible=e.feasible, why=why,
                       work_usd=e.work_usd, boot_s=boot, boot_source=boot_source))
    return out


@dataclass(frozen=True)
class Choice:
    """Where the run should be, and why (the table's ``chosen`` and ``reason``)."""

    index: int | None
    """None: no placement is feasible now."""
    reason: str
    saving: float | None = None


def choose(estimates: Sequence[Estimate], *, active: int, policy: str = CHEAPEST,
           floor_usd: float = cost.DEFAULT_MOVE_FLOOR_USD, fraction: float = cost.DEFAULT_MOVE_FRACTION,
           restart_usd: float = 0.0, first: bool = False) -> Choice:
    """The placement to be in (``estimates`` in listed order; ``active``: where the run is now). ``restart_usd``:
    what leaving costs beyond E (a training machine stopped: :func:`controller.cost.restart_cost`). ``first``:
    the run's first launch (no placement is active: ``active`` is not weighed)."""
    if policy not in POLICIES:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
    by_index = {e.index: e for e in estimates}
    current = by_index.get(active)
    feasible = [e for e in estimates if e.feasible]
    if not feasible:
        return Choice(None, "no placement is feasible now")
    if policy == IN_ORDER:
        first = feasible[0]
        return Choice(first.index, "the first placement in the listed order the rules allow")
    best = min(feasible, key=cost.rank_key)
    if first:
        if best.cost is not None:
            return Choice(best.index, "the first launch: the cheapest feasible placement")
        priced = [e for e in feasible if e.work_usd is not None]
        if priced:
            least = min(priced, key=lambda e: (e.work_usd, e.index))
            return Choice(least.index, "the first launch: no measured rate yet, so no E; the least price per unit of "
                                       "GPU work (machines, restores and checkpoint writes, times the overhead, over "
                                       "the GPU's relative throughput)")
        return Choice(best.index, "the first launch: no placement has a known cost yet (no measured rate): the first "
                                  "feasible one in the listed order")
    if current is None or not current.feasible:
        why = current.why if current is not None else "not a placement"
        return Choice(best.index, f"placement {active} is not feasible ({why}): the cheapest feasible one"
                      if best.cost is not None else f"placement {active} is not feasible ({why}): no price is "
                      "known, the first feasible one in the listed order")
    if best.index == active:
        return Choice(active, "the cheapest feasible placement" if best.cost is not None else
                      "staying: no feasible placement has a known cost yet (no measured rate)")
    if current.cost is None or best.cost is None:
        return Choice(active, "staying: without a known cost for both, a price never moves the run")
    saving = current.cost - best.cost - restart_usd
    if cost.worth_moving(current.cost, best.cost, floor_usd=floor_usd, fraction=fraction, restart_usd=restart_usd):
        return Choice(best.index, f"saves {saving:.2f} USD ({saving / current.cost:.0%}) over placement {active}",
                      round(saving, 4))
    return Choice(active, f"placement {best.index} would save {saving:.2f} USD, under the move threshold "
                          f"(more than {floor_usd:.2f} USD and {fraction:.0%} of {current.cost:.2f})", round(saving, 4))


def document(table_rows: Sequence[Row], choice: Choice, *, now: float, active: int | None, policy: str) -> dict:
    """The table as written (module docstring); ``active`` None: the first launch, where none is."""
    return {"time": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "policy": policy,
            "active": active, "chosen": choice.index, "reason": choice.reason, "saving": choice.saving,
            "rows": [asdict(r) for r in table_rows]}


def write(store, doc: dict, *, now: float) -> str:
    """Write one decision's table to the run folder; its key (``decisions/<time>.json``)."""
    key = layout.decision_key(now)
    store.put_bytes(key, json.dumps(doc, sort_keys=True).encode())
    return key


def latest(store) -> dict | None:
    """The newest decision table in the run folder, None when there is none or it cannot be read."""
    keys = sorted(k for k in store.list(layout.DECISIONS_PREFIX) if k.endswith(".json"))
    for key in reversed(keys):
        try:
            return json.loads(store.get_bytes(key))
        except (NotFound, ValueError):
            continue
    return None
