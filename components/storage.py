"""The storage a run's checkpoints take in the bucket over time: the plan `ops synth` prints.

The bucket is versioned. The trainer keeps the newest `run.keepCheckpoints` checkpoints and
prunes older ones; a pruned checkpoint stays a noncurrent version until the bucket's checkpoint
rule removes it (`runfolder.layout.CHECKPOINT_NONCURRENT_DAYS`, see `components/*/bucket.py`).
On GCS a file of `runfolder.storage.gcs.PARALLEL_THRESHOLD` bytes or more goes up as parts
composed into one object, and the deleted parts are noncurrent versions too, so every such
checkpoint written leaves its size again for the same window.

So at any moment a run's checkpoints take `keep x size` (kept) plus the pruned checkpoints
(and, on GCS, parts) of the last `billed_days`. S3 expires a noncurrent version at the first
midnight UTC at least `noncurrentDays` after it became noncurrent, so up to one day more; GCS
deletes it once the days have passed, with soft delete off (up to a day of GCS's own lag,
which the plan does not count). The rate is the time trigger (`run.checkpointEverySeconds`);
step-triggered checkpoints come on top at the model's speed, which synth cannot know. The
checkpoint's size is an input; without one the plan assumes `ASSUMED_CHECKPOINT_BYTES` and
says so (every figure scales with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.settings import Settings
from runfolder import layout
from runfolder.storage.gcs import PARALLEL_THRESHOLD

GIB = 1024**3
# Without a measured size: a 1 GiB checkpoint (weights and optimizer state), a round figure to scale from.
ASSUMED_CHECKPOINT_BYTES = GIB


@dataclass(frozen=True)
class StoragePlan:
    """The checkpoint storage of one run, as the bucket's rules keep it (see the module docstring)."""

    cloud: str
    checkpoint_bytes: int
    """Bytes of one checkpoint (all its files)."""
    size_assumed: bool
    """True when `checkpoint_bytes` is `ASSUMED_CHECKPOINT_BYTES`, not a size given."""
    keep: int
    """Committed checkpoints the trainer keeps (`run.keepCheckpoints`)."""
    per_day: float | None
    """Checkpoints a day from the time trigger; None when the run checkpoints by steps only."""
    written_max: int
    """Checkpoints the run writes at most: its step checkpoints plus the time trigger's until `compute.maxRuntimeHours`."""
    billed_days: float
    """Days a pruned checkpoint (or GCS part) bills at most after it was deleted."""
    parts_too: bool
    """GCS, with checkpoints large enough to go up as parallel parts: each write leaves its size again as parts."""
    noncurrent_days: int
    """Days every other replaced or deleted object stays restorable (`storage.noncurrentDays`)."""

    @property
    def kept_bytes(self) -> int:
        """The kept checkpoints: `keep` x the checkpoint's size."""
        return min(self.keep, self.written_max) * self.checkpoint_bytes

    def _in_window(self, written: int) -> int:
        """Checkpoints written within `billed_days` at most, of `written`."""
        if self.per_day is None:
            return written
        return min(written, math.ceil(self.per_day * self.billed_days))

    @property
    def noncurrent_bytes_max(self) -> int:
        """Pruned checkpoints (and GCS parts) still billed at one time, at most, while the run checkpoints."""
        return self.noncurrent_bytes_left(written=self.written_max, days_after=0.0)

    @property
    def peak_bytes(self) -> int:
        """Kept plus noncurrent checkpoint bytes at most, while the run checkpoints."""
        return self.kept_bytes + self.noncurrent_bytes_max

    def noncurrent_bytes_left(self, *, written: int, days_after: float) -> int:
        """Noncurrent checkpoint bytes still billed `days_after` days after the last of `written` checkpoints.

        At most: every checkpoint pruned (and, on GCS, every set of parts deleted) within the
        last `billed_days` is counted; none is left once `billed_days` have passed.
        """
        if days_after >= self.billed_days:
            return 0
        pruned = max(written - self.keep, 0)
        count = min(pruned, self._in_window(written))
        if self.parts_too:
            count += self._in_window(written)
        return count * self.checkpoint_bytes

    def checkpoint_bytes_left(self, *, written: int, days_after: float) -> int:
        """All checkpoint bytes billed `days_after` days after a run that wrote `written` checkpoints.

        What the bucket holds for the run's checkpoints then: the kept ones, plus the
        noncurrent bytes of :meth:`noncurrent_bytes_left` (none after `billed_days`).
        """
        return min(self.keep, written) * self.checkpoint_bytes + self.noncurrent_bytes_left(
            written=written, days_after=days_after)


def storage_plan(settings: Settings, *, checkpoint_bytes: int | None = None) -> StoragePlan:
    """The checkpoint storage plan of a stack's run; `checkpoint_bytes` is one checkpoint's size when known."""
    run = settings.run
    steps_checkpoints = math.ceil(run.steps / run.checkpoint_every_steps) if run.checkpoint_every_steps else 0
    timed = run.checkpoint_every_seconds
    per_day = 86_400 / timed if timed else None
    time_checkpoints = math.floor(settings.compute.max_runtime_hours * 3600 / timed) if timed else 0
    size = checkpoint_bytes if checkpoint_bytes is not None else ASSUMED_CHECKPOINT_BYTES
    days = layout.CHECKPOINT_NONCURRENT_DAYS
    return StoragePlan(
        cloud=settings.cloud,
        checkpoint_bytes=size,
        size_assumed=checkpoint_bytes is None,
        keep=run.keep_checkpoints,
        per_day=per_day,
        written_max=max(steps_checkpoints + time_checkpoints, 1),
        # S3 rounds the expiry up to the next midnight UTC: up to a day more.
        billed_days=days + 1 if settings.cloud == "aws" else days,
        parts_too=settings.cloud == "gcp" and size >= PARALLEL_THRESHOLD,
        noncurrent_days=settings.storage.noncurrent_days,
    )


def size_text(n: float) -> str:
    """Bytes as a person reads them: 1.0 GiB."""
    return _size(n)


def _size(n: float) -> str:
    for unit, scale in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n)} B"


def plan_lines(plan: StoragePlan) -> list[str]:
    """The plan's storage section."""
    size = _size(plan.checkpoint_bytes) + (" (assumed; scale every figure by your checkpoint's size)"
                                           if plan.size_assumed else "")
    rate = (f"up to {plan.per_day:g} a day from run.checkpointEverySeconds (step-triggered ones add to it)"
            if plan.per_day is not None else "by steps only")
    parts = "; GCS parallel-upload parts of each checkpoint count once more" if plan.parts_too else ""
    return [
        f"Checkpoint storage: one checkpoint {size}; {plan.keep} kept ({_size(plan.kept_bytes)}); "
        f"at most {plan.written_max} written, {rate}",
        f"  pruned checkpoints stop billing within {plan.billed_days:g} day(s){parts}: at most "
        f"{_size(plan.noncurrent_bytes_max)} of them at once, {_size(plan.peak_bytes)} in all while the run "
        f"checkpoints, {_size(plan.kept_bytes)} once it is {plan.billed_days:g} day(s) past its last checkpoint",
        f"  model/, events and logs: replaced or deleted versions kept {plan.noncurrent_days} days "
        "(storage.noncurrentDays)",
    ]
