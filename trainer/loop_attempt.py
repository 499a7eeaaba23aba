"""One attempt of a run: what happens around the training loop, from start to exit code.

`train(cfg)` runs a whole attempt and returns the process exit code: 0 finished
(COMPLETE written) or cancelled (the run folder's STOP found: a checkpoint committed,
CANCELLED written), 143 stopped by SIGTERM/SIGINT after a committed checkpoint, 1 failed,
75 the workers did not form their cluster, 76 a peer was lost, 77 another machine's
trainer holds the run's lease (`runfolder.lease`: one writer per run), 78 this machine
cannot run the run (the GPUs asked for are not seen: `trainer.devices`, or another
model's checkpoints).

A `LoopAttempt` is a `trainer.run_attempt.RunAttempt` (the run's store and events, the lease, the
first read, exception → exit code, the end markers: shared with script mode) that also
waits for its peers and forms the cluster (several workers), knows the loop's own failures
(the GPUs, another model's checkpoints, a lost peer) and writes the loop's endings:
`finished` and COMPLETE (with the SavedModel), `cancelled` and CANCELLED, `preempted`. The
training itself (the model, the step, the loop's cadence and pacing, its checkpoints) is
`trainer.loop.TrainLoop`'s.
"""

from __future__ import annotations

import os
import shutil
import time

from runfolder import exits, layout
from trainer import cluster as cluster_mod
from trainer import export as export_mod
from trainer.checkpoint_store import CheckpointStore
from trainer.config import TrainConfig, as_dict
from trainer.devices import DeviceMismatch, check_gpus
from trainer.loop import TrainLoop
from trainer.metrics import MetricError
from trainer.models import NoData, resolve_precision
from trainer.run_attempt import RunAttempt, loop_complete_message, start
from trainer.signals import StopRequest
from trainer.strategy import Cluster, make_strategy, read_cluster
from trainer.tf_checkpoint import ResumeMismatch


class LoopAttempt(RunAttempt):
    """One attempt of a run around a `TrainLoop`: the shared lifecycle (`RunAttempt`) plus the cluster."""

    def __init__(self, cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None):
        self.cluster: Cluster = read_cluster()
        super().__init__(cfg, stream=stream, stop=stop, chief=self.cluster.is_chief)
        ckstore = CheckpointStore(self.store, keep=cfg.keep_checkpoints, emit=self._store_event)
        # A cancel reaches the other workers through the step's all-reduced request.
        self.loop = TrainLoop(cfg, store=self.store, ckstore=ckstore, events=self.events, emit=self.emit,
                              stop=self.stop, stop_key=self.stop_key, chief=self.chief,
                              multi_worker=self.cluster.multi_worker, work=self.work,
                              workers=self.cluster.workers, worker=self.cluster.index)
        self.startup: cluster_mod.StartupWatchdog | None = None

    def _lease_lost(self, reason: str) -> None:
        # Another machine took the run: stop after this step; the final commit's fence refuses.
        self.stop.signal_name = layout.LEASE_LOST
        self.stop.event.set()

    def emit(self, event: str, **fields) -> dict:
        ev = super().emit(event, **fields)
        if event == layout.FAILED_EVENT and not self.chief:
            # Not the chief's: events.jsonl is not this worker's to write (see trainer.cluster).
            cluster_mod.record_worker_event(self.store, self.cluster.address, ev)
        return ev

    def _store_event(self, kind: str, fields: dict) -> None:
        # A retry of the log's own writes is printed, not appended to the log it failed to
        # write (that would queue one more write per retry while the store is down).
        own = fields.get("key") in (layout.EVENTS_KEY, layout.PROGRESS_KEY)
        if own:
            self.events.emit(kind, local_only=True, **fields)
        else:
            self.emit(kind, **fields)

    # -- phases --

    def _step_now(self) -> int:
        return self.loop.state.step

    def _holding_lease(self) -> None:
        self.loop.ckstore.lease = self.lease

    def _failure(self, error: Exception) -> int | None:
        if isinstance(error, DeviceMismatch):
            # This machine can never run this run: say why once, and let the supervisor end it.
            self.emit(layout.FAILED_EVENT, reason=str(error), step=self.loop.state.step, **error.details)
            return exits.UNUSABLE
        if isinstance(error, ResumeMismatch | NoData | MetricError):
            # Another model's checkpoints, no data at all, or a metric or validation set that cannot work: no
            # retry can help, and nothing was written to the run.
            self.emit(layout.FAILED_EVENT, reason=str(error), step=self.loop.state.step)
            return exits.UNUSABLE
        if self.cluster.multi_worker and cluster_mod.peer_loss(error):
            return self._peer_lost(error)
        return None

    def _cleanup(self) -> None:
        if self.startup is not None:
            self.startup.disarm()

    def _complete_message(self, done: dict) -> str:
        return loop_complete_message(done, self.cfg.steps)

    def _train(self) -> int:
        cfg, loop = self.cfg, self.loop
        check_gpus(cfg.gpus_per_node)
        if self.cluster.multi_worker:
            code = self._wait_for_peers()
            if code is not None:
                return code
        strategy = make_strategy(self.cluster)
        self.stop.reclaim()
        loop.use(strategy)
        self.emit(layout.STARTED, config=as_dict(cfg), workers=self.cluster.workers, worker=self.cluster.index,
                  replicas=strategy.num_replicas_in_sync, global_batch=loop.global_batch,
                  precision=resolve_precision(cfg))
        # The `started` write (and its retries) must be over before the generators are
        # seeded: see trainer.models.seeded_model.
        self.events.flush()
        loop.build()
        if self.startup is not None:
            # Every worker has passed the strategy's barrier and the variables' broadcast: the
            # cluster formed. From here a lost peer shows as a collective error (_peer_lost).
            self.startup.disarm()
        loop.restore()
        if loop.state.step >= cfg.steps:
            return self._finish()
        if loop.train():
            return self._cancel() if loop.cancelled else self._preempt()
        return self._finish()

    # -- several workers --

    def _wait_for_peers(self) -> int | None:
        """Wait for every peer's trainer before forming the cluster; an exit code when the attempt ends here."""
        cfg = self.cfg
        # A little later than the peers' wait below, so the two never race to report the same
        # wait; the native deadline later still, after the watchdog's time to record.
        self.startup = cluster_mod.StartupWatchdog(
            cfg.startup_timeout + 5, self._no_cluster_exit,
            native_grace=5 + cluster_mod.RECORD_TIMEOUT_S + 5).start()
        missing = cluster_mod.wait_for_peers(self.cluster.address, self.cluster.peers,
                                             self.startup.started_at + cfg.startup_timeout,
                                             stop=lambda: self.stop.requested)
        if self.stop.requested:
            # A notice while waiting for the peers: nothing trained in this attempt, so the
            # newest committed checkpoint is where the run stands; stop now, not at the timeout.
            self.startup.disarm()
            steps = self.loop.ckstore.committed_steps()
            self.emit(layout.PREEMPTED, step=steps[-1] if steps else 0, signal=self.stop.signal_name,
                      seconds=0.0, examples_seen=None)
            return exits.PREEMPTED
        if missing:
            self.startup.disarm()
            self._no_cluster(missing)
            return exits.NO_CLUSTER
        return None

    def _no_cluster(self, missing: list[str]) -> None:
        """The cluster did not form in time: the `failed` event naming the workers waited for."""
        cl = self.cluster
        reason = (f"the {cl.workers} workers did not form a cluster within --startup-timeout "
                  f"{self.cfg.startup_timeout:g} s; waited for {', '.join(cl.peers)}"
                  + (f" (no trainer listening at {', '.join(missing)})" if missing else "")
                  + ". Not this machine's failure: the machines form a new cluster and the run resumes "
                  "from its newest committed checkpoint")
        self.emit(layout.FAILED_EVENT, reason=reason, step=self.loop.state.step, exit_code=exits.NO_CLUSTER,
                  waited_for=cl.peers, unreachable=missing, worker=cl.index, address=cl.address)

    def _no_cluster_exit(self) -> None:
        """The start-up watchdog fired (its own thread; the main one is stuck in TensorFlow): record, exit 75."""
        self._no_cluster(cluster_mod.unreachable(self.cluster.peers))
        self.events.flush(timeout=cluster_mod.RECORD_TIMEOUT_S)
        if self._own_work:
            shutil.rmtree(self.work, ignore_errors=True)
        cluster_mod.hard_exit(exits.NO_CLUSTER)

    def _peer_lost(self, error: BaseException) -> int:
        """A collective failed because a peer went away: say which, exit 76 (75 before the cluster formed)."""
        cl = self.cluster
        forming = self.startup is not None and self.startup.armed
        code = exits.NO_CLUSTER if forming else exits.PEER_LOST
        lost = cluster_mod.lost_peers(error, cl.addresses, cl.index)
        checkpointer = self.loop.checkpointer
        committed = checkpointer.last_committed if checkpointer is not None else None
        what = "while the cluster formed" if forming else f"after step {self.loop.state.step}"
        reason = (f"a peer was lost {what} ({', '.join(lost) or 'a worker'}): {cluster_mod.brief_error(error)}. "
                  "Not this machine's failure: the run resumes from its newest committed checkpoint")
        self.emit(layout.FAILED_EVENT, reason=reason, step=self.loop.state.step, exit_code=code, lost=lost,
                  committed_step=committed, worker=cl.index, address=cl.address)
        return code

    # -- endings --

    def _preempt(self) -> int:
        """Stopped by a signal: commit the current step synchronously, emit `preempted`."""
        started = time.monotonic()
        self.loop.commit_current()
        self.events.flush()
        self.emit(layout.PREEMPTED, step=self.loop.state.step, signal=self.stop.signal_name,
                  seconds=round(time.monotonic() - started, 3), examples_seen=self.loop.state.examples_seen)
        return exits.PREEMPTED

    def _cancel(self) -> int:
        """Asked to end early (STOP): commit the current step, emit `cancelled`, write CANCELLED, exit 0."""
        self.loop.commit_current()
        self.events.flush()
        reason = self.stop_key.reason or "stop requested by the chief (STOP in the run folder)"
        st = self.loop.state
        self.emit(layout.CANCELLED_EVENT, step=st.step, reason=reason, examples_seen=st.examples_seen)
        if not self.chief:
            return exits.OK
        self.events.flush()
        # Written last, after the checkpoint it names is committed: one atomic object.
        self._write_cancelled(st.step, reason, st.examples_seen)
        return exits.OK

    def _finish(self) -> int:
        """All steps done: the last evaluation, final checkpoint, SavedModel (the best, with --keep-best),
        TensorBoard, then COMPLETE."""
        st = self.loop.state
        # Every worker evaluates (their results are reduced together), before the final commit
        # so that the checkpoint records the evaluation and the best.
        self.loop.final_evaluation()
        self.loop.commit_current()
        if not self.chief:
            return exits.OK
        self.events.flush()
        best = dict(st.best) if st.best else None
        if best is not None:
            # The run's model is its best checkpoint; the newest stays what a resume would use.
            best["exported"] = self.loop.load_best()
        model_dir = os.path.join(self.work, "model")
        export_mod.export_model(self.loop.spec.model, model_dir, self.store)
        signature = export_mod.saved_model_signature(model_dir)
        self.loop.summaries.sync()
        metrics = {"loss": st.loss, **self.loop.state.latest_metrics()}
        speed = self.loop.speed()
        evaluation = {"eval_seconds": round(st.eval_seconds, 3)} if st.evaluated else {}
        if best is not None:
            evaluation["best"] = best
        self.emit(layout.FINISHED, step=st.step, metrics=metrics, examples_seen=st.examples_seen, **speed,
                  **evaluation)
        self.events.flush()
        self._write_complete(step=st.step, metrics=metrics, examples_seen=st.examples_seen, signature=signature,
                             **evaluation)
        return exits.OK


def train(cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None, keep: list | None = None) -> int:
    """Run one attempt of the run `cfg` describes; returns the exit code.

    `stop` is the signal flag, when the caller installed it early (see `trainer.signals`).
    `keep`, when given, receives the `LoopAttempt`, so that its TensorFlow objects outlive
    the call: `python -m trainer` then ends without freeing them (see trainer/__main__.py).
    """
    attempt = start(LoopAttempt, cfg, stream=stream, stop=stop)
    if attempt is None:
        return exits.FAILED
    if keep is not None:
        keep.append(attempt)
    return attempt.run()
