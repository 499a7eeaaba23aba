"""A model's own make_dataset resumes from the input pipeline's state saved in the checkpoint, or skips, and says so.

The pipeline's state (`trainer.data_state`) is part of the committed checkpoint; a resume
restores it instead of reading the consumed batches again, and the run ends bit for bit
where a run never stopped ends. Where the state cannot be saved (a pipeline built from
Python, one over --data-state-max-mb) the resume skips the consumed batches, which an event
counts and times, and the run still ends where the uninterrupted one does.
"""

from __future__ import annotations

import json
import signal
import textwrap

import pytest

from runfolder import layout
from tests.trainer.helpers import Trainer, committed_weights, kinds, max_abs_diff, run_trainer, trainer_env
from trainer import data_state

USER_MODULE = textwrap.dedent('''
    """A user's model with its own make_dataset: shuffle + map + batch, as many pipelines are."""
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer.models import ModelSpec

    EXAMPLES = 2000  # 62 batches of 32 an epoch: a run of a few hundred steps crosses epochs


    def _arrays(seed):
        rng = np.random.default_rng(seed)
        x = rng.integers(0, 255, size=(EXAMPLES, 16)).astype("uint8")
        y = (x.astype("float32") @ rng.normal(size=(16, 1)).astype("float32")) / 255.0
        return x, y


    def _spec(make_dataset):
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        return ModelSpec(model=model, loss=keras.losses.MeanSquaredError(reduction=None), make_dataset=make_dataset,
                         optimizer=keras.optimizers.SGD(0.05))


    def shuffled(config):
        def make_dataset(batch_size, seed):
            ds = tf.data.Dataset.from_tensor_slices(_arrays(seed)).shuffle(500, seed=seed)
            ds = ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)
            return ds.batch(batch_size, drop_remainder=True)

        return _spec(make_dataset)


    def generated(config):
        def make_dataset(batch_size, seed):
            x, y = _arrays(seed)

            def rows():
                yield from zip(x, y)

            ds = tf.data.Dataset.from_generator(rows, output_signature=(tf.TensorSpec([16], tf.uint8),
                                                                        tf.TensorSpec([1], tf.float32)))
            return ds.map(lambda a, b: (tf.cast(a, tf.float32) / 255.0, b)).batch(batch_size, drop_remainder=True)

        return _spec(make_dataset)
''')

LONG = 100_000  # the interrupted attempt's --steps: the signal always lands mid-training


def _args(code, model: str, steps: int, *extra: str) -> list[str]:
    return ["--code-dir", str(code), "--model", f"usermodel:{model}", "--deterministic", "--batch-size", "32",
            "--seed", "5", "--steps", str(steps), "--checkpoint-every-steps", "25", "--log-every", "10", *extra]


@pytest.fixture
def code(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "usermodel.py").write_text(USER_MODULE)
    return folder


def _stop_after(uri: str, args: list[str], env: dict, step: int) -> tuple[int, list[dict]]:
    """Start an attempt, SIGTERM it after a checkpoint at or past `step`; returns (step it stopped at, its events)."""
    t = Trainer(uri, *args, env=env)
    t.wait_event(layout.CHECKPOINT, pred=lambda e: e["step"] >= step)
    t.signal(signal.SIGTERM)
    assert t.wait() == 143, t.stderr[-3000:]
    pre = t.events[-1]
    assert pre["event"] == layout.PREEMPTED, kinds(t.events)
    return pre["step"], t.events


def _state(uri: str, step: int) -> dict:
    from runfolder.storage import open_store

    return json.loads(open_store(uri).get_bytes(f"checkpoints/ckpt-{step}/state.json"))


def _reference(tmp_path, code, model: str, steps: int, *extra: str) -> dict:
    uri = f"file://{tmp_path}/reference"
    rc, events, err = run_trainer(uri, *_args(code, model, steps, *extra))
    assert rc == 0, err[-3000:]
    return committed_weights(uri, steps, tmp_path / "reference-weights")


CHECKPOINT_EVERY = 25  # _args' --checkpoint-every-steps
SHARED_STEPS = 300  # past any stop on a loaded machine so far; a resumed run past it trains its own


@pytest.fixture(scope="module")
def shuffled_reference(tmp_path_factory) -> str:
    """The shuffled model's run never stopped, every checkpoint kept: the weights at any multiple of
    25 steps up to SHARED_STEPS, which the resumed runs of that model below must end with."""
    root = tmp_path_factory.mktemp("shuffled-reference")
    (root / "code").mkdir()
    (root / "code" / "usermodel.py").write_text(USER_MODULE)
    uri = f"file://{root}/run"
    rc, _, err = run_trainer(uri, *_args(root / "code", "shuffled", SHARED_STEPS, "--keep-checkpoints", "100"))
    assert rc == 0, err[-3000:]
    return uri


def _shuffled_weights(reference: str, tmp_path, code, steps: int) -> dict:
    """The shuffled model's weights after `steps` of a run never stopped: the shared run's, else a run of its own."""
    if steps not in _committed(reference):
        return _reference(tmp_path, code, "shuffled", steps)
    return committed_weights(reference, steps, tmp_path / "reference-weights")


def _committed(reference: str) -> list[int]:
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    return CheckpointStore(open_store(reference)).committed_steps()


def _at_least(steps: int, reference: str) -> int:
    """The shared reference's first committed checkpoint at or past `steps`, else `steps` rounded up to
    the cadence. A loaded machine may commit fewer than every 25 steps: a queued background upload is
    replaced by the next checkpoint's."""
    kept = [s for s in _committed(reference) if s >= steps]
    return min(kept) if kept else -(-steps // CHECKPOINT_EVERY) * CHECKPOINT_EVERY


@pytest.mark.slow
def test_sigterm_then_resume_restores_the_pipeline_and_matches_the_uninterrupted_run(s3_run, code, tmp_path,
                                                                                     shuffled_reference):
    env = trainer_env(s3_run.env)
    # Past the first epoch (62 batches): the shuffle has reshuffled once when the state is saved.
    stopped, first = _stop_after(s3_run.uri, _args(code, "shuffled", LONG), env, 90)
    assert layout.DATA_STATE_UNSAVED not in kinds(first)
    saved = _state(s3_run.uri, stopped)["data_state"]
    assert saved["skip"] == 0 and saved["bytes"] > 0, saved
    # The state's files are part of the committed checkpoint: listed (and hashed) in its marker.
    from runfolder.storage import open_store

    marker = json.loads(open_store(s3_run.uri).get_bytes(layout.committed_key(stopped)))
    assert {"data.index", "data.data-00000-of-00001"} <= set(marker["files"]), marker["files"]

    steps = _at_least(stopped + 40, shuffled_reference)
    rc, events, err = run_trainer(s3_run.uri, *_args(code, "shuffled", steps), env=env)
    assert rc == 0, err[-3000:]
    restored = [e for e in events if e["event"] == layout.DATA_RESTORED]
    assert len(restored) == 1 and restored[0]["batches_seen"] == stopped, kinds(events)
    assert layout.DATA_SKIPPED not in kinds(events)
    done = json.loads(open_store(s3_run.uri).get_bytes(layout.COMPLETE))
    assert done["attempts"] == 2 and done["examples_seen"] == steps * 32

    diff = max_abs_diff(committed_weights(s3_run.uri, steps, tmp_path / "weights"),
                        _shuffled_weights(shuffled_reference, tmp_path, code, steps))
    assert diff == 0, diff


@pytest.mark.slow
@pytest.mark.parametrize(("model", "extra", "why"), [
    ("generated", (), "TensorFlow cannot save this input pipeline (PyFunc is stateful"),
    ("shuffled", ("--data-state-max-mb", "0.001"), "over --data-state-max-mb 0.001"),
], ids=["from_generator", "over-the-bound"])
def test_a_pipeline_without_saved_state_skips_on_resume_says_so_and_matches(file_run, code, tmp_path, model, extra,
                                                                             why, shuffled_reference):
    env = trainer_env()
    stopped, first = _stop_after(file_run.uri, _args(code, model, LONG, *extra), env, 50)
    unsaved = [e for e in first if e["event"] == layout.DATA_STATE_UNSAVED]
    assert len(unsaved) == 1 and why in unsaved[0]["reason"], unsaved  # said once, not at every checkpoint
    assert _state(file_run.uri, stopped)["data_state"] == {"reason": unsaved[0]["reason"].split(": a resume")[0]}

    steps = _at_least(stopped + 20, shuffled_reference)
    rc, events, err = run_trainer(file_run.uri, *_args(code, model, steps, *extra), env=env)
    assert rc == 0, err[-3000:]
    skipped = [e for e in events if e["event"] == layout.DATA_SKIPPED]
    assert len(skipped) == 1, kinds(events)
    assert skipped[0]["batches"] == stopped and why in skipped[0]["reason"], skipped
    assert 0 <= skipped[0]["seconds"] < 120, skipped
    assert layout.DATA_RESTORED not in kinds(events)

    # Over the bound, the shuffled model trains as it does under it (the bound decides only what
    # a checkpoint holds): it ends with the weights of the shared run, which saved its state.
    ended = (_shuffled_weights(shuffled_reference, tmp_path, code, steps) if model == "shuffled"
             else _reference(tmp_path, code, model, steps, *extra))
    diff = max_abs_diff(committed_weights(file_run.uri, steps, tmp_path / "weights"), ended)
    assert diff == 0, diff


@pytest.mark.parametrize(("entry", "files", "found"), [
    (None, True, False),  # a checkpoint from before the pipeline state existed
    ({"reason": "PyFunc is stateful"}, False, False),
    ({"skip": 7, "bytes": 10}, False, False),  # recorded, but its files are not there
    ({"skip": 7, "bytes": 10}, True, True),
])
def test_a_resume_uses_only_a_recorded_state_whose_files_are_there(tmp_path, entry, files, found):
    if files:
        (tmp_path / "data.index").write_bytes(b"x" * 10)
    saved = {"step": 3} if entry is None else {"step": 3, "data_state": entry}
    got = data_state.saved_state_prefix(str(tmp_path), saved)
    assert got == ((str(tmp_path / "data"), 7) if found else None)


def _two_workers(uri: str, args: list[str], *, stop_at: int | None = None) -> list[Trainer]:
    """Two worker processes on 127.0.0.1 (TF_CONFIG); with `stop_at`, SIGTERM both after a checkpoint at or past it."""
    from devtools.servers import free_ports

    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = [Trainer(uri, *args, env=trainer_env(TF_CONFIG=json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}))) for i in range(2)]
    try:
        if stop_at is not None:
            procs[0].wait_event(layout.CHECKPOINT, timeout=300, pred=lambda e: e["step"] >= stop_at)
            for p in procs:
                p.signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.proc.kill()
    return procs


@pytest.mark.slow
def test_two_workers_skip_on_resume_through_the_distributed_iterator_and_match_the_uninterrupted_pair(code, tmp_path):
    # Several workers feed through tf.distribute's distributed iterator, which TF cannot save: the
    # pipeline state is not in the checkpoint, the resume skips (as before), and the run stays exact.
    args = _args(code, "shuffled", LONG)
    args[args.index("--batch-size") + 1] = "16"  # 32 a global batch, as one worker's runs above
    stopped_pair = _two_workers(f"file://{tmp_path}/two", args, stop_at=50)
    assert [p.proc.returncode for p in stopped_pair] == [143, 143], [p.stderr[-2000:] for p in stopped_pair]
    stopped = stopped_pair[0].events[-1]["step"]
    unsaved = [e for e in stopped_pair[0].events if e["event"] == layout.DATA_STATE_UNSAVED]
    assert len(unsaved) == 1 and "distributed iterator" in unsaved[0]["reason"], kinds(stopped_pair[0].events)

    steps = stopped + 20
    args[args.index("--steps") + 1] = str(steps)
    resumed = _two_workers(f"file://{tmp_path}/two", args)
    assert [p.proc.returncode for p in resumed] == [0, 0], [p.stderr[-2000:] for p in resumed]
    skipped = [e for e in resumed[0].events if e["event"] == layout.DATA_SKIPPED]
    assert len(skipped) == 1 and skipped[0]["batches"] == stopped, kinds(resumed[0].events)
    assert "distributed iterator" in skipped[0]["reason"]

    reference = _two_workers(f"file://{tmp_path}/reference", args)
    assert [p.proc.returncode for p in reference] == [0, 0], [p.stderr[-2000:] for p in reference]
    diff = max_abs_diff(committed_weights(f"file://{tmp_path}/two", steps, tmp_path / "w-two"),
                        committed_weights(f"file://{tmp_path}/reference", steps, tmp_path / "w-ref"))
    assert diff == 0, diff
