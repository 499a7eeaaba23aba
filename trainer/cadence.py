"""When the training loop checkpoints, evaluates, reports and stops; the loop itself only trains.

As Model Garden's orbit `Controller` decides when and its trainer does what, `Cadence` holds
the rules and clocks and `trainer.loop.TrainLoop` asks it between two calls of the step:

- how many steps the next call runs: --steps-per-call, or about CALL_SECONDS' worth measured
  from the previous calls, never past a step checkpoint, a step evaluation or the last step;
- which --log-every steps a call covered (each gets its TensorBoard point), and whether the
  progress file is due (--progress-every-seconds);
- whether a checkpoint is due: every --checkpoint-every-steps, every --checkpoint-every-seconds
  (asked before the call, so that several workers agree on it inside the step), at once for
  a new best by --keep-best, and never at the last step (the ending commits that one);
- whether an evaluation is due (every --eval-every-steps, before the last step: the end's own
  evaluation is the attempt's);
- whether the run has trained all its steps.

No TensorFlow here, and no clock of its own: the loop passes `time.monotonic()` readings, so
the rules are unit-tested with plain numbers (tests/trainer/test_cadence.py).
"""

from __future__ import annotations

from trainer.config import TrainConfig

# --steps-per-call auto: a call lasts about this long (a stop request waits for the call to end)...
CALL_SECONDS = 1.0
# ...with several workers, a fixed count instead: every worker must run the same steps per call,
# and their clocks would choose differently.
MULTI_WORKER_STEPS_PER_CALL = 10


class Cadence:
    """The loop's timetable for one attempt: call sizes, log points, checkpoints, evaluations, the end."""

    def __init__(self, cfg: TrainConfig, *, chief: bool, multi_worker: bool):
        self.cfg = cfg
        self.chief = chief
        self.multi_worker = multi_worker
        self.evaluates = False  # a validation set exists: set once the loop has one
        self.auto_steps = 1  # --steps-per-call auto: grows from the calls' measured durations
        self.last_checkpoint = self.last_progress = 0.0

    def start(self, now: float) -> None:
        """The loop starts: the seconds-based clocks count from here."""
        self.last_checkpoint = self.last_progress = now

    def finished(self, step: int) -> bool:
        """True once the run has trained its last step."""
        return step >= self.cfg.steps

    def steps_this_call(self, step: int) -> int:
        """Steps for the next call: up to --steps-per-call (or auto), never past a step checkpoint,
        a step evaluation or the end."""
        cfg = self.cfg
        if cfg.steps_per_call is not None:
            want = cfg.steps_per_call
        elif self.multi_worker:
            want = MULTI_WORKER_STEPS_PER_CALL
        else:
            want = self.auto_steps
        n = min(want, cfg.steps - step)
        if cfg.checkpoint_every_steps:
            n = min(n, cfg.checkpoint_every_steps - step % cfg.checkpoint_every_steps)
        if cfg.eval_every_steps and self.evaluates:
            n = min(n, cfg.eval_every_steps - step % cfg.eval_every_steps)
        return max(1, n)

    def adapt(self, count: int, seconds: float) -> None:
        """--steps-per-call auto: as many steps as take about CALL_SECONDS, at most doubling per call.

        A call that took too long shrinks the next at once: a stop request waits for the call.
        """
        per_step = max(seconds / max(count, 1), 1e-6)
        self.auto_steps = max(1, min(2 * max(self.auto_steps, count), int(CALL_SECONDS / per_step)))

    def checkpoint_seconds_due(self, now: float) -> bool:
        """--checkpoint-every-seconds has passed since the last checkpoint (the chief's clock decides)."""
        every = self.cfg.checkpoint_every_seconds
        return bool(every) and self.chief and now - self.last_checkpoint >= every

    def logged_steps(self, first: int, last: int, *, ending: bool) -> list[int]:
        """The --log-every steps of a call that ran steps `first`..`last`, plus `last` when it ends the run."""
        logged = [s for s in range(first, last + 1) if s % self.cfg.log_every == 0]
        if ending and last not in logged:
            logged.append(last)
        return logged

    def progress_due(self, now: float) -> bool:
        """--progress-every-seconds has passed since the progress file was last written; restarts its clock."""
        if now - self.last_progress < self.cfg.progress_every_seconds:
            return False
        self.last_progress = now
        return True

    def evaluation_due(self, step: int) -> bool:
        """An --eval-every-steps step before the last (the end's evaluation is the attempt's own)."""
        every = self.cfg.eval_every_steps
        return self.evaluates and bool(every) and step % every == 0 and step < self.cfg.steps

    def checkpoint_due(self, step: int, *, requested: bool, new_best: bool) -> bool:
        """A checkpoint after this call: its step is a --checkpoint-every-steps step, the workers
        asked for one (seconds), or it holds a new best; never at the last step (the ending's)."""
        every = self.cfg.checkpoint_every_steps
        steps_due = bool(every) and step % every == 0
        return (steps_due or requested or new_best) and step < self.cfg.steps

    def checkpointed(self, now: float) -> None:
        """A checkpoint was taken: the seconds-based clock restarts."""
        self.last_checkpoint = now
