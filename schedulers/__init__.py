"""Who runs a run's machines: the schedulers, sibling rooms behind one small seam.

The stack's own spot groups (the default, `trainstack:scheduler: groups`) are run by the
boot scripts and the controller; a managed service's training job is a room here:
`schedulers.sagemaker` (AWS) and `schedulers.vertex` (GCP). Each room answers the
same four things about a run, and nothing else crosses the seam:

- ``launch``: submit the run's job, at most one at a time, never again once the run has ended;
- ``state``: the job's own state (status, secondary status, billable seconds), as a
  :class:`JobState`;
- ``stop``: stop the job;
- ``price``: what an hour of the job costs, marked as an estimate where the service publishes none.

The run folder (``runfolder/``) is the only language a room shares with ``ops``, the dashboard
and the trainer: a job's ending becomes the run's marker there. This floor stands on
``runfolder/`` alone, so ``ops`` and the controller can both import it.
"""

from __future__ import annotations

import dataclasses

SCHEDULERS = ("groups", "sagemaker", "vertex")


@dataclasses.dataclass(frozen=True)
class JobState:
    """A managed job as its service reports it, in the words every room shares."""

    name: str
    status: str  # the service's own status (SageMaker: InProgress, Completed, Failed, Stopping, Stopped)
    secondary: str = ""  # the service's finer status (SageMaker: Training, Interrupted, Restarting, ...)
    message: str = ""  # the service's reason, e.g. why it failed or ended
    training_s: int | None = None  # seconds on machines, waiting and interruptions excluded
    billable_s: int | None = None  # seconds billed: below training_s by the managed-spot saving
    ended: bool = False  # the job will not run again
    interruptions: int = 0  # spot interruptions the service restarted the job after

    @property
    def saving(self) -> float | None:
        """The managed-spot saving, 1 - billable / training; None before the job has trained."""
        if not self.training_s or self.billable_s is None:
            return None
        return 1 - self.billable_s / self.training_s
