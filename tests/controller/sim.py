"""The placement controller's simulator as a test: its schedules, its plants, its command line.

The world (the store, the groups, the machines, the virtual clock, the prices) and the invariants it checks
after every event live in :mod:`simworld.world`, which ships (``python -m controller.replay`` runs it over a
price trace); its docstring describes both. Here: the plants, each of which puts one fix back to show an
invariant catches it (:data:`PLANTS`), and the sweep over seeded schedules.

``python -m tests.controller.sim --schedules 2000`` runs schedules 0..1999 and prints the figures;
a failing schedule prints its seed, and ``--seed N --trace`` replays it event by event.
``--plant NAME`` puts one of the fixes back (:data:`PLANTS`) to show the invariants catch it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator

from controller import choice as choices
from controller import cost as costs
from controller import decide as decides
from controller import record as records
from controller import tick as ticks
from runfolder import layout
from runfolder.lease import RunLease
from simworld import world
from simworld.world import (  # noqa: F401 - the simulator's names, as test_sim.py and the seeds' tests use them
    CKPT_DIR,
    FAILURE_WORDS,
    NOTICE_S,
    START,
    STEPS_PER_MIN,
    TICK_S,
    Actor,
    Group,
    Machine,
    SimClouds,
    SimStore,
    Unavailable,
    Violation,
    shown,
)
from trainer.checkpoint_store import CheckpointStore

# The fixes each plant puts back: "stale" sizes from the record a tick read first; "order" reads the
# record again before the end markers (a pause between them made it stale: the simulator's own find);
# "liveness" leaves an active group below nodes; "cap" gives the controller no deadline.
# The others break what the invariants guard, to show each can fail: "others" leaves the non-active
# groups up (7), "restart" resumes below the newest committed step (2), "twice" writes a move's moved
# event again (6), "broken" keeps no count of a placement whose API fails at every tick (8), "hung" never
# replaces a machine that is up and makes no progress (7), "eager" replaces after 10 min without
# progress: machines still booting, staging or exporting (9), "stop" leaves a stop no trainer heeds (10),
# "margin" cuts the launch margin to 5 minutes (11).
# "threshold" moves for any saving at all (12), "infeasible" prices as if the waiting rules allowed every placement (13),
# "training" prices a run while a trainer holds its lease, without rebalance (14).
PLANTS = ("stale", "order", "liveness", "cap", "others", "restart", "twice", "broken", "hung", "eager", "stop",
          "margin", "threshold", "infeasible", "training")


@contextlib.contextmanager
def planted(plant: str | None) -> Iterator[None]:
    """Put one fix back (:data:`PLANTS`), to show the invariants catch it."""
    if plant is None:
        yield
        return
    if plant not in PLANTS:
        raise ValueError(f"unknown plant {plant!r}; expected one of {', '.join(PLANTS)}")
    saved = (ticks.current_record, ticks.decide, ticks.read_deadline, ticks.ensure_deadline, ticks._zero,
             RunLease._read, CheckpointStore.committed_steps, records.append_moved_once, ticks._resize,
             records.note_waiting, ticks._note_health, decides._hung, decides.HUNG_S, ticks.stop_unheeded,
             decides.LAUNCH_MARGIN_S, costs.worth_moving, choices.table.choose, ticks.trainer_holds, choices.price_tables)
    try:
        if plant == "stale":  # size from the record the tick read first, whatever happened since
            ticks.current_record = _stale_record
        elif plant == "order":
            ticks.current_record = _record_then_markers
        elif plant == "liveness":  # a group found below nodes stays there
            ticks.decide = lambda *a, **k: _without_size(saved[1](*a, **k))
        elif plant == "cap":  # the controller knows no deadline
            ticks.read_deadline = lambda store: None
            ticks.ensure_deadline = lambda config, store, run, now: run
        elif plant == "others":  # the controller puts no group to zero but at the run's end
            ticks._zero = lambda clouds, placements, done, errors=None: (
                saved[4](clouds, placements, done, errors)
                if len(placements) == len(sim_config_placements(clouds)) else None)
            ticks._resize = lambda clouds, p, n, done: None if n == 0 else saved[8](clouds, p, n, done)
        elif plant == "restart":  # the newest committed checkpoint is not offered
            CheckpointStore.committed_steps = lambda self: saved[6](self)[:-1]
        elif plant == "twice":  # a moved event appended whether or not it is there
            def twice(store, event, *, tries=8):
                events, version = records.read_events(store)
                body = "".join(json.dumps(e) + "\n" for e in [*events, event]).encode()
                store.put_bytes_if(layout.PLACEMENT_EVENTS_KEY, body, version=version)
                return True
            records.append_moved_once = twice
        elif plant == "broken":  # a group's failures are raised, never counted: no placement is ever broken
            ticks._note_health = lambda *a, **k: None
        elif plant == "hung":  # all the run's machines up: it stays, whatever their progress
            decides._hung = lambda *a, **k: None
        elif plant == "eager":
            decides.HUNG_S = 10 * 60
        elif plant == "stop":  # a stop waits for a trainer, whether one runs or not
            ticks.stop_unheeded = lambda *a, **k: None
        elif plant == "margin":
            decides.LAUNCH_MARGIN_S = 5 * 60
        elif plant == "threshold":  # any saving moves the run
            costs.worth_moving = lambda current, best, **k: best < current
        elif plant == "infeasible":  # the price decision forgets the waiting rules (a failed placement is allowed)
            choices.price_tables = lambda *a, allowed, active, **k: saved[18](
                *a, allowed={i: why for i, why in allowed.items() if i == active}, active=active, **k)
        elif plant == "training":  # the run priced as if no trainer held its lease
            ticks.trainer_holds = lambda run, now: False
        yield
    finally:
        (ticks.current_record, ticks.decide, ticks.read_deadline, ticks.ensure_deadline, ticks._zero,
         RunLease._read, CheckpointStore.committed_steps, records.append_moved_once, ticks._resize,
         records.note_waiting, ticks._note_health, decides._hung, decides.HUNG_S, ticks.stop_unheeded,
         decides.LAUNCH_MARGIN_S, costs.worth_moving, choices.table.choose, ticks.trainer_holds, choices.price_tables) = saved


def sim_config_placements(clouds) -> tuple:
    return getattr(clouds, "clouds", clouds).sim.config.placements


def _stale_record(store: SimStore, version: str | None) -> records.Record | None:
    """The record as it was at ``version``, the one the tick read first (the store keeps each)."""
    if any(store.exists(name) for name in layout.END_MARKERS):
        return None
    return records.Record() if version is None else records.Record.parse(store.history[version])


def _record_then_markers(store: SimStore, version: str | None) -> records.Record | None:
    """``current_record`` reading the record before the end markers (a pause between makes it stale)."""
    current, current_version = records.read(store)
    if current_version != version or any(store.exists(name) for name in layout.END_MARKERS):
        return None
    return current


def _without_size(d: decides.Decision) -> decides.Decision:
    return decides.Decision(d.action, d.reason, d.to, None)


class Sim(world.Sim):
    """One schedule of :class:`simworld.world.Sim`, run with its plant (if any) put in."""

    def planting(self) -> contextlib.AbstractContextManager:
        return planted(self.plant)


def run_one(seed: int, *, plant: str | None = None, trace: bool = False) -> dict:
    """Run schedule ``seed``; raises :class:`Violation` (naming the seed) when an invariant fails."""
    return Sim(seed, plant=plant, trace=trace).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.controller.sim", description=__doc__.splitlines()[0])
    p.add_argument("--schedules", type=int, default=2000, help="how many schedules (seeds start.. start+N-1)")
    p.add_argument("--start", type=int, default=0, help="the first seed")
    p.add_argument("--seed", type=int, help="replay this one schedule")
    p.add_argument("--trace", action="store_true", help="print every event (with --seed)")
    p.add_argument("--plant", choices=PLANTS, help="put this fix back")
    p.add_argument("--every", type=int, default=0, help="print the figures so far every N schedules")
    args = p.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.schedules)
    t0 = time.process_time()
    failed, idle, moves, ended, hung, replaced, price_moves, cheapest = [], 0.0, 0, {}, 0, 0, 0, 0
    for seed in seeds:
        try:
            out = run_one(seed, plant=args.plant, trace=args.trace)
        except Violation as e:
            print(f"FAIL {e}  (replay: python -m tests.controller.sim --seed {seed} --trace"
                  f"{' --plant ' + args.plant if args.plant else ''})", flush=True)
            failed.append(seed)
            continue
        idle += out["idle_machine_min"]
        moves += out["moves"]
        hung += out["hung"]
        replaced += out["replaced"]
        price_moves += out["price_moves"]
        cheapest += out["policy"] == "cheapest"
        ended[out["ended"]] = ended.get(out["ended"], 0) + 1
        done = seed - seeds[0] + 1
        if args.every and done % args.every == 0:
            cpu = time.process_time() - t0
            print(f"{done} schedules in {cpu:.0f} CPU-s ({done / cpu:.1f}/s), {len(failed)} failed", flush=True)
        if args.seed is not None:
            print(json.dumps(out))
    cpu = time.process_time() - t0
    n = len(seeds)
    # A replay (--seed) prints no CPU time: two replays of one seed print the same bytes.
    took = "" if args.seed is not None else f" in {cpu:.1f} CPU-s ({n / max(cpu, 1e-9):.0f}/s)"
    print(f"{n} schedules{took}: {n - len(failed)} hold every invariant; "
          f"{moves} moves ({price_moves} for price, in the {cheapest} schedules with cheapest); ends {ended}; "
          f"{idle / 60:.1f} idle machine-hours; {hung} machines hung, {replaced} replacements")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
