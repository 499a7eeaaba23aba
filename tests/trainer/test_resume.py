"""Stopping and resuming real trainer processes: SIGTERM, SIGKILL, damaged checkpoints, a failing store."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.trainer.helpers import Trainer, kinds, run_trainer, store_events, trainer_env, waiting_model

pytestmark = pytest.mark.slow

# Long enough that a signal always lands mid-training; the resumed attempt is then given a
# nearby --steps so it finishes quickly (the step budget may change between attempts).
LONG = ["--synthetic", "--steps", "100000", "--batch-size", "32", "--log-every", "10"]


def _args(steps: int, every: int) -> list[str]:
    args = list(LONG)
    args[args.index("--steps") + 1] = str(steps)
    return [*args, "--checkpoint-every-steps", str(every)]


def _ckstore(uri):
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    return CheckpointStore(open_store(uri))


def test_sigterm_mid_training_commits_then_resume_finishes(file_run):
    t = Trainer(file_run.uri, *_args(100000, 50), env=trainer_env(file_run.env))
    t.wait_event("checkpoint", pred=lambda e: e["step"] >= 50)
    t.signal(signal.SIGTERM)
    assert t.wait() == 143, t.stderr[-3000:]
    pre = t.events[-1]
    assert pre["event"] == "preempted" and pre["signal"] == "SIGTERM", kinds(t.events)
    stopped = pre["step"]
    assert stopped > 50 and pre["examples_seen"] == stopped * 32
    # The step it stopped at is committed, and the preempted event came after its commit.
    assert _ckstore(file_run.uri).committed_steps()[-1] == stopped
    assert any(e["event"] == "checkpoint" and e["step"] == stopped for e in t.events)

    rc, events, err = run_trainer(file_run.uri, *_args(stopped + 30, 50), env=trainer_env(file_run.env))
    assert rc == 0, err[-3000:]
    resumed = [e for e in events if e["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] == stopped and resumed[0]["examples_seen"] == stopped * 32
    assert events[0]["attempt"] == 2 and events[-1]["event"] == "finished" and events[-1]["step"] == stopped + 30
    from runfolder.storage import open_store

    done = json.loads(open_store(file_run.uri).get_bytes("COMPLETE"))
    assert done["attempts"] == 2 and done["step"] == stopped + 30
    assert done["examples_seen"] == (stopped + 30) * 32  # none repeated, none skipped
    assert done["seconds_lost_to_preemption"] > 0
    assert kinds(store_events(file_run.uri)).count("started") == 2


def _forge(uri, base_step: int, step: int, *, marker: bool, corrupt: bool) -> None:
    """A checkpoint folder `ckpt-<step>` made from a real one: no marker, or a bad checksum."""
    root = Path(uri[len("file://"):]) / "checkpoints"
    src, dst = root / f"ckpt-{base_step}", root / f"ckpt-{step}"
    shutil.copytree(src, dst)
    if marker:
        doc = json.loads((dst / "COMMITTED").read_text())
        doc["step"] = step
        (dst / "COMMITTED").write_text(json.dumps(doc))
    else:
        (dst / "COMMITTED").unlink()
    if corrupt:
        data = next(dst.glob("ckpt.data-*"))
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF  # same size, different content
        data.write_bytes(bytes(raw))


def test_sigkill_loses_only_uncommitted_steps_and_damaged_checkpoints_are_skipped(file_run):
    t = Trainer(file_run.uri, *_args(100000, 20), env=trainer_env(file_run.env))
    seen = t.wait_event("checkpoint", pred=lambda e: e["step"] >= 60)["step"]
    t.signal(signal.SIGKILL)
    assert t.wait() == -signal.SIGKILL
    last = _ckstore(file_run.uri).committed_steps()[-1]
    assert last >= seen  # everything reported committed survived the kill

    _forge(file_run.uri, last, last + 1, marker=False, corrupt=False)  # upload cut short: no marker
    _forge(file_run.uri, last, last + 2, marker=True, corrupt=True)  # marker, but the bytes changed
    rc, events, err = run_trainer(file_run.uri, *_args(last + 10, 20), env=trainer_env(file_run.env))
    assert rc == 0, err[-3000:]
    skipped = {e["step"] for e in events if e["event"] == "checkpoint_skipped"}
    assert last + 2 in skipped, [e for e in events if e["event"] == "checkpoint_skipped"]
    resumed = [e for e in events if e["event"] == "resumed"]
    assert [e["step"] for e in resumed] == [last]  # the newest *complete* checkpoint, nothing newer
    assert events[-1]["event"] == "finished" and events[-1]["examples_seen"] == (last + 10) * 32


def test_failing_store_training_continues_and_sigterm_during_upload_commits(faulty_s3, tmp_path):
    proxy = faulty_s3.proxy
    env = trainer_env(faulty_s3.env)
    # Each batch 25 ms late: it trains on through the store's failures at a small part of a core.
    slow = [*waiting_model(tmp_path / "code"), *[a for a in LONG if a != "--synthetic"]]
    t = Trainer(faulty_s3.uri, *slow, "--checkpoint-every-steps", "25", env=env)
    first = t.wait_event("checkpoint")["step"]

    # The store fails every request for a while: uploads retry, training goes on, and
    # the next commits land once it recovers.
    proxy.fail_for(3.0, "503")
    t.wait_event("upload_retry", pred=lambda e: "checkpoints/" in e.get("key", ""))
    later = t.wait_event("checkpoint", pred=lambda e: e["step"] > first + 25)["step"]
    assert proxy.failed > 0

    # Now a SIGTERM while an upload is failing: the trainer waits it out, commits, exits 143.
    proxy.fail_for(3.0, "drop")
    n = len(t.events)
    t.wait_event("upload_retry", pred=lambda e: t.events.index(e) >= n)
    signalled = time.monotonic()
    t.signal(signal.SIGTERM)
    t.wait_event("preempted", timeout=30)
    said = time.monotonic()
    assert t.wait() == 143, t.stderr[-3000:]
    took = time.monotonic() - signalled
    # The promise itself, not a speed: GCE takes the machine 30 s after its notice (AWS 120 s),
    # and 20 s leaves the machine's own shutdown its share.
    assert took < 20, took
    # After a long run, freeing the input pipeline waits for tf.data's autotuning thread
    # (7-22 s measured): the trainer ends without that teardown. 6 s is below the shortest
    # teardown seen and far above an exit's own time on a loaded machine.
    assert time.monotonic() - said < 6, time.monotonic() - said
    stopped = t.events[-1]["step"]
    assert t.events[-1]["event"] == "preempted" and stopped > later

    ck = _ckstore(faulty_s3.uri)
    assert ck.committed_steps()[-1] == stopped
    proxy.heal()
    slow[slow.index("--steps") + 1] = str(stopped + 5)
    rc, events, err = run_trainer(faulty_s3.uri, *slow, "--checkpoint-every-steps", "25", env=env)
    assert rc == 0, err[-3000:]
    assert [e["step"] for e in events if e["event"] == "resumed"] == [stopped]
    assert events[-1]["event"] == "finished" and events[-1]["examples_seen"] == (stopped + 5) * 32


@pytest.mark.parametrize("run_root", ["s3"], indirect=True)
def test_100mb_checkpoint_is_committed_within_20s_of_sigterm(run_root):
    # ~9M parameters with Adam's two slots: a checkpoint of about 110 MB.
    args = ["--model", "transformer-lm", "--synthetic", "--steps", "100000", "--batch-size", "2",
            "--lm-vocab", "16384", "--lm-dim", "256", "--lm-layers", "1", "--lm-seq-len", "16",
            "--checkpoint-every-steps", "10", "--log-every", "10"]
    t = Trainer(run_root.uri, *args, env=trainer_env(run_root.env))
    first = t.wait_event("checkpoint", timeout=240)
    assert first["bytes"] >= 100e6, first
    signalled = time.monotonic()
    t.signal(signal.SIGTERM)
    assert t.wait(timeout=120) == 143, t.stderr[-3000:]
    took = time.monotonic() - signalled
    stopped = t.events[-1]
    assert stopped["event"] == "preempted"
    assert _ckstore(run_root.uri).committed_steps()[-1] == stopped["step"]
    print(f"checkpoint of {first['bytes'] / 1e6:.0f} MB: SIGTERM to committed and exited in {took:.1f} s")
    assert took < 20, f"signal to committed checkpoint took {took:.1f} s"
