"""The run's validation passes and its best: what the loop does when the cadence says evaluate.

`Validation` sets up the model's metrics and, when there is a validation set, the
`trainer.metrics.Evaluator` (once per attempt, with the training data's label spec), runs a
pass at the current step (TensorBoard's `validation/…` scalars, the `evaluated` event, an
`eval_slow` warning when validation eats the training time, from the attempt's second pass on), and decides the best by
--keep-best. A new best's checkpoint is kept out of the pruning from the moment it is
chosen; the previous best stays protected until the new one is committed
(`committed`). When to evaluate is `trainer.cadence`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from runfolder import layout
from trainer import data as data_mod
from trainer.checkpoint_store import CheckpointStore
from trainer.config import TrainConfig
from trainer.metrics import EVAL_WARN_SHARE, Evaluator, KeepBest, MetricError, MetricSet, validation_names
from trainer.models import ModelSpec
from trainer.step import per_example_loss


class Validation:
    """The metrics, the evaluator and the best of one attempt."""

    def __init__(self, cfg: TrainConfig, *, ckstore: CheckpointStore, emit: Callable[..., dict]):
        self.cfg = cfg
        self.ckstore = ckstore
        self.emit = emit
        self.metrics: MetricSet | None = None
        self.evaluator: Evaluator | None = None
        self.keep_best = KeepBest(cfg.keep_best) if cfg.keep_best else None
        self.since_eval = 0.0  # training seconds since the last evaluation (or the attempt's start)
        self.pending_best: int | None = None  # a best's step whose checkpoint is not committed yet
        self.passes = 0  # validation passes in this attempt

    def setup(self, spec: ModelSpec, strategy, global_batch: int, y_spec, *, workers: int, worker: int) -> None:
        """The model's metrics and, when there is a validation set, the evaluator (once per attempt)."""
        if self.metrics is not None:
            return
        cfg = self.cfg
        try:
            validation = data_mod.make_validation(spec, cfg, global_batch)
        except ValueError as e:
            raise MetricError(str(e)) from None
        if y_spec is None and validation is not None:
            y_spec = validation.element_spec[1]
        outputs = getattr(spec.model, "outputs", None)
        out_shape = tuple(outputs[0].shape) if outputs else None
        self.metrics = MetricSet(spec.metrics, y_spec, out_shape)
        if validation is not None:
            self.evaluator = Evaluator(strategy, spec.model, lambda y, pred: per_example_loss(spec, y, pred),
                                       self.metrics, validation, workers=workers, worker=worker)
        if self.keep_best is not None:
            if self.evaluator is None:
                raise MetricError(f"--keep-best {cfg.keep_best} (run.keepBest) needs a validation set: give "
                                  "--validation-data-uri (run.validationDataUri) or ModelSpec.make_validation")
            self.keep_best.check([f"val_{n}" for n in ("loss", *self.metrics.names)])
        elif cfg.eval_every_steps and self.evaluator is None:
            raise MetricError(f"--eval-every-steps {cfg.eval_every_steps} (run.evalEverySteps) needs a validation "
                              "set: give --validation-data-uri (run.validationDataUri) or ModelSpec.make_validation")

    def evaluate(self, st, scalars: Callable[[int, dict], None]) -> bool:
        """One validation pass at `st.step` (a `RunState`, updated): TensorBoard through `scalars`,
        the `evaluated` event, the best; True for a new best."""
        results, examples, seconds = self.evaluator.run()
        st.eval_seconds += seconds
        named = validation_names(results)
        st.evaluated = {"step": st.step, "metrics": named, "examples": examples, "seconds": round(seconds, 3)}
        new_best = False
        kb = self.keep_best
        if kb is not None and kb.better(named[kb.metric], st.best):
            st.best = {"metric": kb.metric, "mode": kb.mode, "step": st.step, "value": named[kb.metric],
                       "metrics": named}
            new_best = True
            # Kept out of the pruning from its commit on; the previous best stays until then.
            self.ckstore.protect = set(self.ckstore.protect) | {st.step}
            self.pending_best = st.step
        scalars(st.step, {**{f"validation/{k}": v for k, v in results.items()}, "eval_s": seconds})
        trained = self.since_eval
        # The attempt's first pass traces the pass (the share leaves that out) and runs the new graph
        # for the first time: one-off costs that evaluating less often would not save, so that pass
        # is not judged (the README's demo evaluates once, at its end).
        traced = getattr(self.evaluator, "trace_seconds", 0.0)
        share = max(0.0, seconds - traced) / trained if trained > 0 else None
        judged, self.passes = self.passes > 0, self.passes + 1
        self.emit(layout.EVALUATED, step=st.step, metrics=named, examples=examples, seconds=round(seconds, 3),
                  trace_seconds=round(traced, 3), train_seconds=round(trained, 3),
                  share=None if share is None else round(share, 4),
                  eval_seconds_total=round(st.eval_seconds, 3), **({"best": st.best} if st.best else {}))
        if judged and share is not None and share > EVAL_WARN_SHARE:
            self.emit(layout.EVAL_SLOW, step=st.step, seconds=round(seconds, 3), train_seconds=round(trained, 3),
                      share=round(share, 4),
                      message=f"the validation pass took {share:.0%} of the training time since the last one "
                              f"(over {EVAL_WARN_SHARE:.0%}): evaluate less often (--eval-every-steps, "
                              "run.evalEverySteps) or on a smaller validation set")
        self.since_eval = 0.0
        return new_best

    def due_at_end(self, st) -> bool:
        """The run's end evaluates, unless there is no validation set or this step was already evaluated."""
        return self.evaluator is not None and (st.evaluated is None or st.evaluated.get("step") != st.step)

    def committed(self, step: int) -> None:
        """A checkpoint was committed: once it is the new best's, the previous best may be pruned."""
        if self.pending_best is not None and step == self.pending_best:
            self.ckstore.protect = {self.pending_best}
            self.pending_best = None
