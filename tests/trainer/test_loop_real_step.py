"""The training loop's own set-up in process: the seeded model, the checkpointer, the input pipeline
and the compiled step (run eagerly here: see below), over a few synthetic steps and a resume.

tests/trainer/test_loop_steps.py drives the loop over a stand-in step; this builds the real one.
"""

from __future__ import annotations

import io

import pytest

tf = pytest.importorskip("tensorflow")

from runfolder import layout  # noqa: E402
from runfolder.events import read_events  # noqa: E402
from runfolder.storage import open_store  # noqa: E402
from trainer.checkpoint_store import CheckpointStore  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.events import EventLog  # noqa: E402
from trainer.loop import TrainLoop  # noqa: E402
from trainer.signals import StopKeyPoller, StopRequest  # noqa: E402


@pytest.fixture(autouse=True)
def _eager():
    """The step's `tf.function` run as plain Python: a graph function hangs in a process forked after
    TensorFlow ran one (mutmut's workers: tests/mutation/plugin.py); the trainer runs compile it."""
    tf.config.run_functions_eagerly(True)
    yield
    tf.config.run_functions_eagerly(False)


def _loop(uri, work, **options):
    cfg = TrainConfig(run_uri=uri, **{"model": "mlp", "synthetic": True, "steps": 6, "batch_size": 8,
                                      "log_every": 2, "checkpoint_every_steps": 4, "steps_per_call": 2, **options})
    store = open_store(uri)
    events = EventLog(store, stream=io.StringIO())
    ckstore = CheckpointStore(store, emit=lambda kind, fields: None)
    loop = TrainLoop(cfg, store=store, ckstore=ckstore, events=events, emit=events.emit, stop=StopRequest(),
                     stop_key=StopKeyPoller(store, every=3600), chief=True, multi_worker=False, work=str(work))
    loop.use(tf.distribute.MirroredStrategy(["/cpu:0"]))
    return loop


def test_the_loop_builds_trains_commits_and_resumes(file_run, tmp_path):
    loop = _loop(file_run.uri, tmp_path / "a")
    loop.build()
    assert loop.spec is not None and loop.checkpointer is not None and int(loop.examples.numpy()) == 0
    assert loop.examples.trainable is False  # a counter, not a weight
    ck = loop.checkpointer
    assert ck.model == "mlp" and ck.background is True  # one worker writes from a snapshot on a thread
    assert len(ck.variables) == len(loop.spec.model.variables) + len(loop.spec.optimizer.variables)
    loop.restore()
    assert loop.train() is False
    st = loop.state
    assert (st.step, st.batches_seen, st.examples_seen) == (6, 6, 48) and st.loss is not None
    assert loop.loop_examples == 48 and 0 < loop.loop_seconds < 600 and loop.summaries.enabled
    assert loop.summaries.store is loop.store and loop.pipeline is not None
    loop.commit_current()
    loop.events.close()
    assert CheckpointStore(open_store(file_run.uri)).committed_steps()[-1] == 6
    kinds = [e["event"] for e in read_events(open_store(file_run.uri))]
    assert kinds.count(layout.CHECKPOINT) == 2

    again = _loop(file_run.uri, tmp_path / "b", steps=8)
    again.build()
    again.restore()
    assert again.state.step == 6 and int(again.examples.numpy()) == 48
    assert again.train() is False and again.state.step == 8 and again.state.examples_seen == 64
    assert again.loop_examples == 16 and 0 < again.loop_seconds < 600  # this attempt's part only
    again.events.close()
