"""The input pipeline's threads take the cores the step leaves idle (Linux's `SCHED_IDLE`).

On a CPU the step is a chain of ops: TensorFlow's inter- and intra-op threads keep about 1.5 of
2 cores busy with it, and the step's speed is the chain's. A model's own `tf.data` pipeline runs
on threads of its own (the iterator's pool, the parallel map's, the prefetch's, autotuning's),
and the kernel shares the cores between them and the step's threads by turns: each time an input
thread holds the core the chain's next op wanted, the step waits. Measured on 2 cores with the
in-memory MNIST pipeline (`bench.mnist_memory`, `bench/RESULTS.md` round seven): the same run went
from 60-72k to 66-79k examples/s (medians +15 %) once the input threads were `SCHED_IDLE`;
`nice 19` and `SCHED_BATCH` gained less.

`SCHED_IDLE` threads run only when no other thread wants the core, so the input gets the time
the step leaves: when the step waits for a batch its threads sleep and the input runs. The
input is never starved by the step, but it is by any other busy process on the machine, even
one in another cgroup (a CPU's share of the trainer's group follows the weight of what runs
there): beside two busy loops the same run made 24k examples/s with the kernel's sharing and
2.2k with `SCHED_IDLE`; with the loops in a cgroup of their own and the trainer in another (two
containers), 50-60k and 24-25k. Nor can it be undone during the run:
leaving `SCHED_IDLE` takes `CAP_SYS_NICE` or an `RLIMIT_NICE` that containers do not give. So it
is a dedicated machine's choice, `--input-priority idle`; the default, `normal`, keeps the
kernel's sharing. With `idle`, the loop reads the machine's CPU (/proc/stat) at each look, and
the first time other processes take half a core or more and leave no core idle, it says so
once on stderr, with the way back for the next run.

Which threads: those made after `InputThreads` is created (before the pipeline is), found after
each call (`settle`), that are not Python threads. The trainer's own threads (the checkpoint's
upload, the lease, the signal and STOP watchers) are Python threads and keep their priority; a
thread the pipeline starts from one of its own inherits the policy, and one started from the
step's (a pipeline restarted at an epoch's end) is found at the end of the call that made it.
TensorFlow names neither kind apart (both are `python` or `tf_Compute`), so the threads that
existed before the pipeline, the step's pools among them, are what is left alone.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

TASKS = "/proc/self/task"
STAT = "/proc/stat"
# Other processes' average use over a call, with less than IDLE_CORES of the machine left idle, that the
# run is told of once: the idle input yields to them (see above).
NEIGHBOUR_CORES = 0.5
IDLE_CORES = 0.25
WINDOW_S = 0.5  # the shortest span judged


def thread_ids() -> set[int]:
    """This process's threads (Linux), or an empty set where /proc has none."""
    try:
        return {int(t) for t in os.listdir(TASKS)}
    except OSError:
        return set()


def machine_cpu_s() -> tuple[float, float] | None:
    """The machine's CPU seconds since boot, busy and idle, every core's (/proc/stat), or None."""
    try:
        with open(STAT) as fh:
            fields = fh.readline().split()
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / hz, (idle + iowait) / hz


def own_cpu_s() -> float:
    """This process's CPU seconds, every thread's."""
    t = os.times()
    return t.user + t.system


class InputThreads:
    """Moves the threads made since it was created (not Python's) to `SCHED_IDLE`, after each call,
    and says once when other processes take the cores the input was to have."""

    def __init__(self, enabled: bool, *, machine: Callable[[], tuple[float, float] | None] = machine_cpu_s,
                 own: Callable[[], float] = own_cpu_s, clock: Callable[[], float] = time.monotonic):
        self.unavailable = None if hasattr(os, "sched_setscheduler") else "this platform has no sched_setscheduler"
        self.enabled = enabled and self.unavailable is None
        self.known = thread_ids() if self.enabled else set()
        self.moved: set[int] = set()
        self.readers = (machine, own, clock)
        self.last: tuple | None = None  # (machine's busy and idle s, own s, when) at the last look
        self.neighbours: float | None = None  # other processes' cores when the run was told, else None

    def settle(self) -> int:
        """Move the threads made since the last look; returns how many were moved this time."""
        if not self.enabled:
            return 0
        count = self._move()
        if self.moved and self.neighbours is None:
            self._watch()
        return count

    def _watch(self) -> None:
        """Other processes' share of the cores since the last look: past NEIGHBOUR_CORES on a machine with
        less than IDLE_CORES left, the run is told once (stderr) that its input yields to them."""
        machine, own, clock = self.readers
        now = (machine(), own(), clock())
        last = self.last
        if last is None or last[0] is None or now[0] is None:
            self.last = now
            return
        wall = now[2] - last[2]
        if wall < WINDOW_S:
            return  # /proc/stat counts in ticks (10 ms): a short call's share is noise; the window grows
        self.last = now
        busy, idle = now[0][0] - last[0][0], now[0][1] - last[0][1]
        others = max(0.0, busy - (now[1] - last[1])) / wall
        if others >= NEIGHBOUR_CORES and idle / wall < IDLE_CORES:
            self.neighbours = others
            print(f"trainstack: other processes used {others:.1f} cores over the last {wall:.1f} s and left the "
                  "machine no idle core; the input pipeline's threads (--input-priority idle) yield to them, "
                  "and the run can slow many times over: --input-priority normal shares the cores", file=sys.stderr)

    def _move(self) -> int:
        now = thread_ids()
        new = now - self.known
        if not new:
            return 0
        python = {t.native_id for t in threading.enumerate()}
        count = 0
        for tid in sorted(new - python):
            try:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            except ProcessLookupError:
                continue  # it ended in between
            except OSError as e:  # a container's seccomp profile, a kernel without it: the kernel's sharing stays
                self.enabled = False
                self.unavailable = f"sched_setscheduler: {e}"
                print(f"trainstack: the input pipeline's threads keep their priority ({self.unavailable})",
                      file=sys.stderr)
                return count
            self.moved.add(tid)
            count += 1
        # Python threads made since are left alone for good; a thread that ended leaves the set.
        self.known = now
        return count
