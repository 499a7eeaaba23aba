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
kernel's sharing.

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

TASKS = "/proc/self/task"


def thread_ids() -> set[int]:
    """This process's threads (Linux), or an empty set where /proc has none."""
    try:
        return {int(t) for t in os.listdir(TASKS)}
    except OSError:
        return set()


class InputThreads:
    """Moves the threads made since it was created (not Python's) to `SCHED_IDLE`, after each call."""

    def __init__(self, enabled: bool):
        self.unavailable = None if hasattr(os, "sched_setscheduler") else "this platform has no sched_setscheduler"
        self.enabled = enabled and self.unavailable is None
        self.known = thread_ids() if self.enabled else set()
        self.moved: set[int] = set()

    def settle(self) -> int:
        """Move the threads made since the last look; returns how many were moved this time."""
        if not self.enabled:
            return 0
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
