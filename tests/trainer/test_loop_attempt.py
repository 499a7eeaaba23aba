"""The loop's attempt in process: the order of its phases, each ending's events, markers and exit
code (finished, preempted, cancelled), the loop's own failures, and the several-worker paths (a
peer missing at start, a stop while waiting, a peer lost, a worker's failed event).

`LoopAttempt` is driven here with a stand-in for `TrainLoop` (no model, no step) and stand-ins for
the cluster's clocks; the trainer tests run the same endings as whole processes.
"""

from __future__ import annotations

import io
import json
import os
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("tensorflow")

from runfolder import exits, layout  # noqa: E402
from runfolder.events import read_events  # noqa: E402
from runfolder.storage import open_store  # noqa: E402
from trainer import loop_attempt  # noqa: E402
from trainer.config import TrainConfig, as_dict  # noqa: E402
from trainer.loop import RunState  # noqa: E402
from trainer.loop_attempt import LoopAttempt  # noqa: E402
from trainer.metrics import MetricError  # noqa: E402
from trainer.models import NoData  # noqa: E402
from trainer.tf_checkpoint import ResumeMismatch  # noqa: E402

ADDRESSES = ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]


class _Loop:
    """What `LoopAttempt` asks of its `TrainLoop`, recorded."""

    def __init__(self, ckstore, *, restored=0, stopped=False, cancelled=False, error=None, fail_in="train"):
        self.ckstore = ckstore
        self.state = RunState()
        self.calls: list[str] = []
        self.restored, self.stopped, self.cancelled = restored, stopped, cancelled
        self.error, self.fail_in = error, fail_in
        self.global_batch = 64
        self.checkpointer = SimpleNamespace(last_committed=30)
        self.spec = SimpleNamespace(model="the model")
        self.summaries = SimpleNamespace(sync=lambda: self.calls.append("sync"))
        self.best_exported = "ckpt-20"
        self.lease_when_restored = None
        self.commit_seconds = 0.0

    def _call(self, name):
        self.calls.append(name)
        if self.error is not None and name == self.fail_in:
            raise self.error

    def use(self, strategy):
        self._call("use")
        self.strategy = strategy

    def build(self):
        self._call("build")

    def restore(self):
        self._call("restore")
        self.lease_when_restored = self.ckstore.lease
        self.state.step = self.restored

    def train(self):
        self._call("train")
        self.state.step, self.state.examples_seen, self.state.loss = 40, 2560, 0.25
        return self.stopped

    def commit_current(self):
        self.calls.append(f"commit {self.state.step}")
        time.sleep(self.commit_seconds)

    def final_evaluation(self):
        self.calls.append("final_evaluation")

    def load_best(self):
        self.calls.append("load_best")
        return self.best_exported

    def speed(self):
        return {"examples_per_s": 100.0}


class _Strategy:
    num_replicas_in_sync = 2

    def __init__(self, cluster):
        self.cluster = cluster


class _Watchdog:
    made: list[_Watchdog] = []

    def __init__(self, timeout, on_expire, *, native_grace=None):
        self.timeout, self.on_expire, self.native_grace = timeout, on_expire, native_grace
        self.started_at = 1000.0
        self.disarmed = False
        _Watchdog.made.append(self)

    def start(self):
        return self

    def disarm(self):
        self.disarmed = True

    @property
    def armed(self):
        return not self.disarmed


@pytest.fixture
def exported(monkeypatch):
    """The SavedModel export, recorded instead of made (tests/trainer/test_catch_export_model.py makes one)."""
    made = []
    monkeypatch.setattr(loop_attempt.export_mod, "export_model", lambda model, d, store: made.append((model, d, store)))
    monkeypatch.setattr(loop_attempt.export_mod, "saved_model_signature", lambda d: {"endpoint": "serve", "dir": d})
    monkeypatch.setattr(loop_attempt, "make_strategy", _Strategy)
    return made


@pytest.fixture
def make(file_run, monkeypatch, exported):
    _Watchdog.made = []
    monkeypatch.setattr(loop_attempt.cluster_mod, "StartupWatchdog", _Watchdog)

    def build(*, workers=1, index=0, loop=None, **options):
        if workers > 1:
            monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ADDRESSES[:workers]},
                                                        "task": {"type": "worker", "index": index}}))
        else:
            monkeypatch.delenv("TF_CONFIG", raising=False)
        cfg = TrainConfig(run_uri=file_run.uri, **{"steps": 40, **options})
        out = io.StringIO()
        attempt = LoopAttempt(cfg, stream=out)
        attempt.real_loop = attempt.loop
        attempt.loop = _Loop(attempt.loop.ckstore, **(loop or {}))
        return attempt, attempt.loop, out

    return build


def _stored(attempt) -> list[dict]:
    return read_events(open_store(attempt.cfg.run_uri))


def _kinds(events) -> list[str]:
    return [e["event"] for e in events]


def _printed(out) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


def test_a_run_trains_its_steps_then_exports_and_completes(make, exported):
    attempt, loop, _ = make()
    assert attempt.run() == exits.OK
    assert loop.calls == ["use", "build", "restore", "train", "final_evaluation", "commit 40", "sync"]
    assert loop.lease_when_restored is attempt.lease  # the commits are fenced by the lease
    assert isinstance(loop.strategy, _Strategy) and loop.strategy.cluster is attempt.cluster
    assert exported == [("the model", os.path.join(attempt.work, "model"), attempt.store)]
    events = _stored(attempt)
    assert _kinds(events) == [layout.STARTED, layout.FINISHED]
    started, finished = events
    assert started["config"] == as_dict(attempt.cfg) and started["workers"] == 1 and started["worker"] == 0
    assert started["replicas"] == 2 and started["global_batch"] == 64 and started["precision"] == "float32"
    assert {k: finished[k] for k in ("step", "metrics", "examples_seen", "examples_per_s")} == {
        "step": 40, "metrics": {"loss": 0.25}, "examples_seen": 2560, "examples_per_s": 100.0}
    assert "best" not in finished and "eval_seconds" not in finished
    complete = json.loads(attempt.store.get_bytes(layout.COMPLETE))
    assert complete[layout.MARKER_STEP] == 40 and complete["metrics"] == {"loss": 0.25}
    assert complete["signature"] == {"endpoint": "serve", "dir": os.path.join(attempt.work, "model")}
    assert complete["examples_seen"] == 2560 and complete[layout.MARKER_ATTEMPTS] == 1


def test_a_run_restored_at_its_last_step_completes_without_training(make):
    attempt, loop, _ = make(loop={"restored": 40})
    assert attempt.run() == exits.OK
    assert "train" not in loop.calls and loop.calls[-2:] == ["commit 40", "sync"]
    assert _kinds(_stored(attempt)) == [layout.STARTED, layout.FINISHED]


def test_the_best_is_the_exported_model_and_complete_names_it(make):
    attempt, loop, _ = make()
    best = {"metric": "val_loss", "mode": "min", "step": 20, "value": 0.1, "metrics": {"val_loss": 0.1}}

    def train():
        loop.calls.append("train")
        st = loop.state
        st.step, st.loss, st.eval_seconds = 40, 0.25, 1.23456
        st.evaluated = {"step": 40, "metrics": {"val_loss": 0.2}}
        st.best = best
        return False

    loop.train = train
    assert attempt.run() == exits.OK
    assert "load_best" in loop.calls
    finished = _stored(attempt)[-1]
    assert finished["best"] == {**best, "exported": "ckpt-20"} and finished["eval_seconds"] == 1.235
    assert finished["metrics"] == {"loss": 0.25, "val_loss": 0.2}
    assert loop.state.best == best  # the run's state keeps the best as it was
    complete = json.loads(attempt.store.get_bytes(layout.COMPLETE))
    assert complete["best"] == {**best, "exported": "ckpt-20"}


def test_a_signal_commits_the_step_and_exits_preempted(make):
    attempt, loop, _ = make(loop={"stopped": True})
    loop.commit_seconds = 0.0105  # the commit's time is reported to the millisecond
    attempt.stop.signal_name = "SIGTERM"
    assert attempt.run() == exits.PREEMPTED
    assert loop.calls[-1] == "commit 40" and "final_evaluation" not in loop.calls
    preempted = _stored(attempt)[-1]
    assert preempted["event"] == layout.PREEMPTED and preempted["step"] == 40
    assert preempted["signal"] == "SIGTERM" and preempted["examples_seen"] == 2560
    assert 0.01 <= preempted["seconds"] < 1 and preempted["seconds"] == round(preempted["seconds"], 3)
    assert not attempt.store.exists(layout.COMPLETE) and not attempt.store.exists(layout.CANCELLED)


@pytest.mark.parametrize(("reason", "said"), [
    ("budget reached", "budget reached"),
    (None, "stop requested by the chief (STOP in the run folder)"),
])
def test_a_stop_request_commits_and_writes_cancelled(make, reason, said):
    attempt, loop, _ = make(loop={"stopped": True, "cancelled": True})
    attempt.stop_key.reason = reason
    assert attempt.run() == exits.OK
    assert loop.calls[-1] == "commit 40"
    cancelled = _stored(attempt)[-1]
    assert cancelled["event"] == layout.CANCELLED_EVENT and cancelled["step"] == 40
    assert cancelled["reason"] == said and cancelled["examples_seen"] == 2560
    doc = json.loads(attempt.store.get_bytes(layout.CANCELLED))
    assert doc[layout.MARKER_STEP] == 40 and doc[layout.MARKER_REASON] == said and doc["examples_seen"] == 2560


def test_a_worker_commits_its_ending_but_writes_no_marker(make, monkeypatch):
    monkeypatch.setattr(loop_attempt.cluster_mod, "wait_for_peers", lambda *a, **k: [])
    attempt, loop, out = make(workers=2, index=1, loop={"stopped": True, "cancelled": True})
    assert attempt.chief is False and attempt.lease is None
    assert attempt.run() == exits.OK
    assert loop.calls[-1] == "commit 40"
    assert not attempt.store.exists(layout.CANCELLED)
    assert _kinds(_printed(out))[-1] == layout.CANCELLED_EVENT and _stored(attempt) == []

    attempt, loop, _ = make(workers=2, index=1)
    assert attempt.run() == exits.OK
    assert loop.calls[-2:] == ["final_evaluation", "commit 40"]  # every worker evaluates and commits
    assert not attempt.store.exists(layout.COMPLETE)


def test_gpus_not_seen_end_the_attempt_as_unusable_with_the_details(make):
    attempt, loop, _ = make(gpus_per_node=7)
    assert attempt.run() == exits.UNUSABLE
    assert loop.calls == []
    [failed] = _stored(attempt)
    assert failed["event"] == layout.FAILED_EVENT and failed["step"] == 0
    assert "7" in failed["reason"] and failed["expected_gpus"] == 7 and "devices" in failed


@pytest.mark.parametrize("error", [
    ResumeMismatch("the checkpoints are another model's"), NoData("no data at all"),
    MetricError("--keep-best val_auc (run.keepBest): the evaluation records val_loss; name one of them")])
def test_what_no_retry_can_help_ends_as_unusable_in_one_line(make, error):
    attempt, _, _ = make(loop={"error": error, "fail_in": "build"})
    assert attempt.run() == exits.UNUSABLE
    failed = _stored(attempt)[-1]
    assert failed["event"] == layout.FAILED_EVENT and failed["reason"] == str(error) and failed["step"] == 0


def test_any_other_error_fails_the_attempt(make):
    import tensorflow as tf

    attempt, _, _ = make(loop={"error": tf.errors.UnavailableError(None, None, "socket closed"), "fail_in": "train"})
    assert attempt.run() == exits.FAILED  # one machine: not a lost peer
    assert _stored(attempt)[-1]["reason"] == "UnavailableError: socket closed"


def _printed_failures(attempt):
    """A worker's failed events: kept in its own log in the run folder."""
    raw = attempt.store.get_bytes(layout.worker_events_key(attempt.cluster.address)).decode()
    return [json.loads(line) for line in raw.splitlines()]


def _unavailable(text="Collective ops is aborted by: /job:worker/replica:0/task:1 is gone"):
    import tensorflow as tf

    return tf.errors.UnavailableError(None, None, text)


def test_a_peer_lost_after_the_cluster_formed_exits_76_naming_it(make, monkeypatch):
    monkeypatch.setattr(loop_attempt.cluster_mod, "wait_for_peers", lambda *a, **k: [])
    error = _unavailable("Collective ops is aborted by: /job:worker/replica:0/task:2 is gone, "
                         "/job:worker/replica:0/task:1 too")
    attempt, loop, _ = make(workers=3, index=1, loop={"error": error, "fail_in": "train", "restored": 25})
    assert attempt.run() == exits.PEER_LOST
    assert _Watchdog.made[0].disarmed
    failed = _stored(attempt) or _printed_failures(attempt)
    failed = failed[-1]
    assert failed["reason"] == ("a peer was lost after step 25 (10.0.0.3:2222): UnavailableError: Collective ops is "
                                "aborted by: /job:worker/replica:0/task:2 is gone, /job:worker/replica:0/task:1 too. "
                                "Not this machine's failure: the run resumes from its newest committed checkpoint")
    assert failed["exit_code"] == exits.PEER_LOST and failed["lost"] == ["10.0.0.3:2222"]  # not itself
    assert failed["step"] == 25
    assert failed["committed_step"] == 30 and failed["worker"] == 1 and failed["address"] == "10.0.0.2:2222"


def test_the_chief_names_every_peer_it_lost(make, monkeypatch):
    monkeypatch.setattr(loop_attempt.cluster_mod, "wait_for_peers", lambda *a, **k: [])
    error = _unavailable("/job:worker/replica:0/task:2 and /job:worker/replica:0/task:1 are gone")
    attempt, _, _ = make(workers=3, index=0, loop={"error": error, "fail_in": "train"})
    assert attempt.run() == exits.PEER_LOST
    failed = _stored(attempt)[-1]
    assert failed["lost"] == ["10.0.0.3:2222", "10.0.0.2:2222"]
    assert failed["reason"].startswith("a peer was lost after step 0 (10.0.0.3:2222, 10.0.0.2:2222): ")


def test_a_peer_lost_while_the_cluster_forms_exits_75(make, monkeypatch):
    monkeypatch.setattr(loop_attempt.cluster_mod, "wait_for_peers", lambda *a, **k: [])
    attempt, loop, _ = make(workers=2, index=0, loop={"error": _unavailable("no task named"), "fail_in": "build"})
    loop.checkpointer = None
    assert attempt.run() == exits.NO_CLUSTER
    failed = _stored(attempt)[-1]
    assert failed["reason"].startswith("a peer was lost while the cluster formed (a worker): UnavailableError: ")
    assert failed["exit_code"] == exits.NO_CLUSTER and failed["lost"] == [] and failed["committed_step"] is None


def test_peers_missing_at_start_end_the_attempt_as_no_cluster(make, monkeypatch):
    asked = {}

    def wait_for_peers(own, peers, deadline, stop):
        asked.update(own=own, peers=peers, deadline=deadline, stop=stop())
        return ["10.0.0.2:2222", "10.0.0.3:2222"]

    monkeypatch.setattr(loop_attempt.cluster_mod, "wait_for_peers", wait_for_peers)
    attempt, loop, _ = make(workers=3, index=0, startup_timeout=120.0)
    assert attempt.run() == exits.NO_CLUSTER
    assert loop.calls == []
    assert asked == {"own": "10.0.0.1:2222", "peers": ["10.0.0.2:2222", "10.0.0.3:2222"], "deadline": 1120.0,
                     "stop": False}
    [dog] = _Watchdog.made
    assert dog.timeout == 125.0 and dog.native_grace == 5 + loop_attempt.cluster_mod.RECORD_TIMEOUT_S + 5
    assert dog.disarmed and dog.on_expire == attempt._no_cluster_exit
    failed = _stored(attempt)[-1]
    assert failed["reason"] == (
        "the 3 workers did not form a cluster within --startup-timeout 120 s; waited for 10.0.0.2:2222, "
        "10.0.0.3:2222 (no trainer listening at 10.0.0.2:2222, 10.0.0.3:2222). Not this machine's failure: the machines form a "
        "new cluster and the run resumes from its newest committed checkpoint")
    assert failed["exit_code"] == exits.NO_CLUSTER and failed["waited_for"] == ["10.0.0.2:2222", "10.0.0.3:2222"]
    assert failed["unreachable"] == ["10.0.0.2:2222", "10.0.0.3:2222"] and failed["worker"] == 0
    assert failed["address"] == "10.0.0.1:2222" and failed["step"] == 0


def test_a_stop_while_waiting_for_peers_ends_preempted_at_the_committed_step(make, monkeypatch):
    def wait_for_peers(own, peers, deadline, stop):
        attempt.stop.signal_name = "SIGTERM"
        attempt.stop.event.set()
        assert stop() is True
        return ["10.0.0.2:2222"]

    monkeypatch.setattr(loop_attempt.cluster_mod, "wait_for_peers", wait_for_peers)
    attempt, loop, _ = make(workers=2, index=0)
    attempt.loop.ckstore.committed_steps = lambda: [10, 20, 30]
    assert attempt.run() == exits.PREEMPTED
    assert loop.calls == [] and _Watchdog.made[0].disarmed
    preempted = _stored(attempt)[-1]
    assert {k: preempted[k] for k in ("event", "step", "signal", "seconds", "examples_seen")} == {
        "event": layout.PREEMPTED, "step": 30, "signal": "SIGTERM", "seconds": 0.0, "examples_seen": None}


def test_a_stop_while_waiting_before_any_commit_names_step_zero(make, monkeypatch):
    def wait_for_peers(own, peers, deadline, stop):
        attempt.stop.event.set()
        return []

    monkeypatch.setattr(loop_attempt.cluster_mod, "wait_for_peers", wait_for_peers)
    attempt, _, _ = make(workers=2, index=0)
    assert attempt.run() == exits.PREEMPTED
    assert _stored(attempt)[-1]["step"] == 0


def test_the_start_up_watchdog_records_the_missing_peers_and_exits_75(make, monkeypatch):
    ended = []
    monkeypatch.setattr(loop_attempt.cluster_mod, "unreachable", lambda peers: list(peers))
    monkeypatch.setattr(loop_attempt.cluster_mod, "hard_exit", ended.append)
    attempt, _, _ = make(workers=2, index=0, startup_timeout=30.0)
    work = attempt.work
    flushed = []
    flush = attempt.events.flush
    monkeypatch.setattr(attempt.events, "flush", lambda *a, **kw: flushed.append((a, kw)) or flush(*a, **kw))
    attempt._no_cluster_exit()
    # Bounded: the store may hang, and the process must still end.
    assert flushed == [((), {"timeout": loop_attempt.cluster_mod.RECORD_TIMEOUT_S})]
    assert ended == [exits.NO_CLUSTER] and not os.path.exists(work)
    attempt._no_cluster_exit()  # its folder already gone (the main thread's cleanup ran first)
    assert ended == [exits.NO_CLUSTER] * 2
    attempt.events.close()
    failed = _stored(attempt)[-1]
    assert failed["unreachable"] == ["10.0.0.2:2222"] and failed["exit_code"] == exits.NO_CLUSTER


def test_the_start_up_watchdog_keeps_a_given_work_folder(make, monkeypatch, tmp_path):
    monkeypatch.setattr(loop_attempt.cluster_mod, "unreachable", lambda peers: [])
    monkeypatch.setattr(loop_attempt.cluster_mod, "hard_exit", lambda code: None)
    attempt, _, _ = make(workers=2, index=0, work_dir=str(tmp_path / "work"))
    attempt._no_cluster_exit()
    assert (tmp_path / "work").is_dir()
    attempt.events.close()
    assert _stored(attempt)[-1]["reason"] == (
        "the 2 workers did not form a cluster within --startup-timeout 600 s; waited for 10.0.0.2:2222. Not this "
        "machine's failure: the machines form a new cluster and the run resumes from its newest committed checkpoint")


def test_a_workers_failure_is_kept_in_its_own_log(make):
    attempt, _, _ = make(workers=2, index=1)
    ev = attempt.emit(layout.FAILED_EVENT, reason="boom", step=3)
    lines = attempt.store.get_bytes(layout.worker_events_key("10.0.0.2:2222")).decode().splitlines()
    assert [json.loads(line) for line in lines] == [ev]
    attempt.emit(layout.CHECKPOINT, step=4)  # only failures go there
    assert len(attempt.store.get_bytes(layout.worker_events_key("10.0.0.2:2222")).decode().splitlines()) == 1
    attempt.events.close()


def test_the_chiefs_failure_is_not_copied_to_a_worker_log(make):
    attempt, _, _ = make(workers=2, index=0)
    attempt.emit(layout.FAILED_EVENT, reason="boom", step=3)
    assert not attempt.store.exists(layout.worker_events_key("10.0.0.1:2222"))
    attempt.events.close()


@pytest.mark.parametrize(("key", "stored"), [
    (layout.EVENTS_KEY, False), (layout.PROGRESS_KEY, False), ("checkpoints/ckpt-10/COMMITTED", True)])
def test_a_store_retry_on_the_logs_own_writes_is_only_printed(make, key, stored):
    attempt, _, out = make()
    attempt._store_event("store_retry", {"key": key, "retry": 2})
    attempt.events.close()
    assert _kinds(_printed(out)) == ["store_retry"] and _printed(out)[0]["key"] == key
    assert _printed(out)[0]["retry"] == 2
    assert [(e["event"], e["key"]) for e in _stored(attempt)] == ([("store_retry", key)] if stored else [])
    assert (attempt.own_events != []) is stored


def test_a_checkpoint_upload_retry_is_logged_under_the_runs_attempt(make, file_run):
    # The run's second attempt retries a checkpoint upload for the third time: the log must say
    # attempt 2 (what ops status and the time lost to preemption group events by), retry 3.
    store = open_store(file_run.uri)
    store.put_bytes(layout.EVENTS_KEY, json.dumps({"event": layout.STARTED, "attempt": 1}).encode() + b"\n")
    attempt, _, _ = make()
    attempt.store.on_retry("put", "checkpoints/ckpt-10/variables.index", 3, OSError("connection reset"))
    attempt.events.close()
    [retry] = _stored(attempt)[1:]
    assert retry["event"] == layout.UPLOAD_RETRY and retry["attempt"] == 2 and retry["retry"] == 3
    assert retry["key"] == "checkpoints/ckpt-10/variables.index" and retry["op"] == "put"


def test_a_lost_lease_stops_the_loop_after_its_step(make):
    attempt, _, _ = make()
    attempt._lease_lost("another machine took the run")
    assert attempt.stop.requested and attempt.stop.signal_name == layout.LEASE_LOST
    attempt.events.close()


def test_the_complete_line_names_the_steps_asked_for(make):
    attempt, _, _ = make(steps=300)
    assert attempt._complete_message({layout.MARKER_STEP: 100}).startswith(
        "run already COMPLETE at 100 steps; --steps 300 does not extend it")
    assert attempt._step_now() == 0
    attempt.events.close()


def test_train_ends_a_complete_run_at_once_and_keeps_the_attempt(file_run, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    open_store(file_run.uri).put_bytes(layout.COMPLETE, json.dumps({layout.MARKER_STEP: 40}).encode())
    keep, out = [], io.StringIO()
    assert loop_attempt.train(TrainConfig(run_uri=file_run.uri, steps=40), stream=out, keep=keep) == exits.OK
    [attempt] = keep
    assert isinstance(attempt, LoopAttempt) and _kinds(_printed(out)) == [layout.ALREADY_COMPLETE]
    assert loop_attempt.train(TrainConfig(run_uri=file_run.uri, steps=40), stream=io.StringIO()) == exits.OK


def test_train_uses_the_stop_installed_early(file_run, monkeypatch):
    from trainer.signals import StopRequest

    monkeypatch.delenv("TF_CONFIG", raising=False)
    open_store(file_run.uri).put_bytes(layout.COMPLETE, b"{}")
    stop, keep = StopRequest(), []
    loop_attempt.train(TrainConfig(run_uri=file_run.uri), stream=io.StringIO(), stop=stop, keep=keep)
    assert keep[0].stop is stop


def test_the_loop_is_built_from_the_attempts_own_parts(make):
    attempt, _, _ = make(workers=3, index=2, keep_checkpoints=4)
    real = attempt.real_loop
    ck = real.ckstore
    assert ck.store is attempt.store and ck.keep == 4 and ck.emit == attempt._store_event
    assert real.cfg is attempt.cfg and real.store is attempt.store and real.events is attempt.events
    assert real.emit == attempt.emit and real.stop is attempt.stop and real.stop_key is attempt.stop_key
    assert real.chief is False and real.multi_worker is True and real.work == attempt.work
    assert (real.workers, real.worker) == (3, 2)
    attempt.events.close()


def test_train_that_cannot_start_fails(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    out = io.StringIO()
    keep = []
    assert loop_attempt.train(TrainConfig(run_uri="nope://bucket/run"), stream=out, keep=keep) == exits.FAILED
    assert keep == [] and _kinds(_printed(out)) == [layout.FAILED_EVENT]
