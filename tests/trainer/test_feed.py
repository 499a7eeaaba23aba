"""The training input `open_feed` chooses: in-memory arrays batched inside the step on one replica, the
tf.data stream otherwise, and the weights of a short run the same to the last bit either way."""

from __future__ import annotations

import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bench.breakdown import OneAtATime as _OneAtATime  # noqa: E402 - a source or iterator taken through next() only
from trainer import data  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.feed import open_feed  # noqa: E402
from trainer.metrics import MetricSet  # noqa: E402
from trainer.models import seeded_model  # noqa: E402
from trainer.step import make_train_step  # noqa: E402

BATCH = 16
X, Y = data.synthetic_mnist(n=100, seed=0)  # 6 batches an epoch: 13 steps cross two epochs
GO = (0.0, 0.0, 0.0)


class _Strategy:
    """Stands in for a strategy in `open_feed`'s choice: its replicas and the first one's device."""

    def __init__(self, replicas: int, device: str = "/job:localhost/replica:0/task:0/device:CPU:0"):
        self.num_replicas_in_sync = replicas
        self.extended = type("Extended", (), {"worker_devices": (device,) * replicas})()

    def experimental_distribute_dataset(self, ds):
        return ds


def _cfg(**options) -> TrainConfig:
    return TrainConfig(run_uri="file:///nowhere", **{"model": "mlp", "synthetic": True, "batch_size": BATCH,
                                                     "seed": 3, **options})


def _feed(spec, cfg, strategy, *, multi_worker=False, batches_seen=0, restored_dir=None):
    return open_feed(spec, cfg, strategy, global_batch=BATCH, multi_worker=multi_worker, plain=True,
                     batches_seen=batches_seen, restored_dir=restored_dir, emit=lambda *a, **f: {})


def _spec(cfg, strategy, **fields):
    spec = seeded_model(cfg, strategy)
    spec.synthetic = lambda seed: (X, Y)
    for name, value in fields.items():
        setattr(spec, name, value)
    return spec


def _trained(cfg, feeds, calls):
    """A freshly seeded mlp trained by `calls` (steps per call), each call fed by the next of `feeds(spec)`."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    spec = _spec(cfg, strategy)
    metrics = MetricSet(spec.metrics, tf.TensorSpec([BATCH], tf.int64), (None, 10))
    examples = tf.Variable(0, dtype=tf.int64)
    step = make_train_step(strategy, spec, cfg, BATCH, False, examples, metrics)
    losses, rows, done = [], [], 0
    for count, iterator in zip(calls, feeds(spec, strategy), strict=True):
        loss, _, states = step(iterator(done), tf.constant(count, tf.int64), tf.constant(GO))
        losses.append(loss.numpy())
        rows.append(states.numpy())
        done += count
    assert int(examples.numpy()) == done * BATCH
    weights = [v.numpy() for v in spec.model.variables + spec.optimizer.variables]
    return np.concatenate(losses), np.concatenate(rows), weights


@pytest.mark.slow
# Calls of 5 and 8 cross the epochs' edges inside a call; 6, 1, 6 end calls on them (the batch a call takes
# ahead is the next epoch's first).
@pytest.mark.parametrize("calls", [(5, 8), (6, 1, 6)])
def test_one_replica_trains_on_arrays_in_graph_to_the_streams_weights_and_resumes_at_its_position(calls):
    cfg = _cfg()

    def stream(spec, strategy):
        it = iter(data.from_arrays(X, Y, BATCH, cfg.seed, data.Position(0)))
        return [lambda done: it] * len(calls)

    def source(spec, strategy):
        feed = _feed(spec, cfg, strategy)
        assert isinstance(feed.iterator, data.ArraySource) and feed.data is None and feed.skipped is None
        return [lambda done: feed.iterator] * len(calls)

    def resumed(spec, strategy):
        # The second call's source is a resume's: made anew at the batches the first call took.
        return [lambda done: _feed(spec, cfg, strategy, batches_seen=done).iterator] * len(calls)

    want = _trained(cfg, stream, calls)
    for got in (_trained(cfg, source, calls), _trained(cfg, resumed, calls)):
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert len(got[2]) == len(want[2]) > 4
        assert all(np.array_equal(a, b) for a, b in zip(got[2], want[2], strict=True))
    assert len(set(want[0].tolist())) == 13  # thirteen steps, each its own batch and loss


def test_several_replicas_or_workers_keep_the_stream_of_the_same_arrays():
    cfg = _cfg()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    spec = _spec(cfg, strategy)
    for replicas, multi_worker in ((2, False), (1, True)):
        feed = _feed(spec, cfg, _Strategy(replicas), multi_worker=multi_worker, batches_seen=7)
        assert not isinstance(feed.iterator, data.ArraySource) and feed.data is None and feed.skipped is None
        got = next(iter(feed.iterator))
        want = next(iter(data.from_arrays(X, Y, BATCH, cfg.seed, data.Position(7))))
        assert np.array_equal(got[0].numpy(), want[0].numpy()) and np.array_equal(got[1].numpy(), want[1].numpy())


def test_a_make_dataset_of_arrays_is_fed_as_arrays_and_a_pipeline_keeps_its_state(tmp_path):
    cfg = _cfg(synthetic=False)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    calls = []

    def arrays(batch_size, seed):
        calls.append((batch_size, seed))
        return X, Y

    spec = _spec(cfg, strategy, make_dataset=arrays)
    # A checkpoint of this model's from before (its make_dataset a tf.data pipeline) holds a pipeline
    # state: arrays resume at the position alone, whatever the folder holds.
    (tmp_path / "state.json").write_text('{"data_state": {"skip": 0, "bytes": 10}}')
    (tmp_path / "data.index").write_text("not read")
    feed = _feed(spec, cfg, strategy, batches_seen=7, restored_dir=str(tmp_path))
    assert isinstance(feed.iterator, data.ArraySource) and feed.data is None and feed.skipped is None
    assert calls == [(BATCH, cfg.seed)] and int(feed.iterator.position.numpy()) == 7
    x, y = next(feed.iterator)
    want = next(iter(data.from_arrays(X, Y, BATCH, cfg.seed, data.Position(7))))
    assert np.array_equal(x.numpy(), want[0].numpy()) and np.array_equal(y.numpy(), want[1].numpy())

    spec.make_dataset = lambda batch_size, seed: tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch_size)
    feed = _feed(spec, cfg, strategy)
    assert not isinstance(feed.iterator, data.ArraySource) and feed.data is not None  # its state, each checkpoint

    for bad, words in (((X, Y[:-1]), "one row per example"), ((X,), "expected a tf.data.Dataset or \\(x, y\\)"),
                       ([X.tolist(), Y], "expected a tf.data.Dataset or \\(x, y\\) numpy arrays")):
        spec.make_dataset = lambda batch_size, seed, bad=bad: bad
        with pytest.raises(ValueError, match=words):
            _feed(spec, cfg, strategy)


def _loop_body_inputs(step, iterator) -> set[str]:
    """What the traced call's training loop takes in from outside it, by the variables' names (the
    resources its body reads or writes), besides plain tensors."""
    fn = step.get_concrete_function(iterator, tf.constant(5, tf.int64), tf.constant(GO))
    graph = fn.graph
    [loop] = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    outside = {internal.name: external for external, internal in graph.captures}
    body_name = loop.get_attr("body").name
    [body] = [f for f in graph.as_graph_def().library.function if f.signature.name == body_name]
    used = {inp.split(":")[0].lstrip("^") for node in body.node_def for inp in node.input}
    names = {}
    for arg, tensor in zip(body.signature.input_arg, loop.inputs, strict=True):
        external = outside.get(tensor.name)
        if arg.name in used and external is not None and external.dtype == tf.resource:
            names[arg.name] = external
    variables = {id(v.handle): v.name.split(":")[0] for v in _all_variables(iterator)}
    return {variables.get(id(h), "?") for h in names.values()}


def _all_variables(iterator):
    source = getattr(iterator, "source", iterator)
    return [source.position, source.order, source.order_epoch, *([source.divisor] if source.divisor is not None else []),
            *_MODEL_VARIABLES]


_MODEL_VARIABLES: list = []


def test_the_steps_loop_reads_no_variable_of_the_source_so_the_next_batch_is_taken_while_a_step_trains():
    cfg = _cfg()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    spec = _spec(cfg, strategy)
    metrics = MetricSet(spec.metrics, tf.TensorSpec([BATCH], tf.int64), (None, 10))
    _MODEL_VARIABLES[:] = spec.model.trainable_variables
    source = _feed(spec, cfg, strategy).iterator
    assert isinstance(source, data.ArraySource) and source.divisor is not None
    source_vars = {"data_position", "data_order", "data_order_epoch", "data_divisor"}
    model_vars = {v.name.split(":")[0] for v in spec.model.trainable_variables}
    carried = _loop_body_inputs(make_train_step(strategy, spec, cfg, BATCH, False, tf.Variable(0, dtype=tf.int64),
                                                metrics), source)
    one_at_a_time = _loop_body_inputs(make_train_step(strategy, spec, cfg, BATCH, False,
                                                      tf.Variable(0, dtype=tf.int64), metrics), _OneAtATime(source))
    assert model_vars <= carried and not carried & source_vars  # the step's weights, and none of the source's
    assert model_vars <= one_at_a_time and source_vars <= one_at_a_time  # the check sees them where they are read


Pair = collections.namedtuple("Pair", "x y")


@pytest.mark.parametrize(("calls", "element"), [((5, 3), tuple), ((1, 1, 6), Pair)])
def test_a_plain_iterator_is_taken_ahead_within_a_call_only(calls, element):
    """One replica's `tf.data` iterator gives each step's next batch while the step trains, and a call takes
    exactly its steps' batches: after the calls the iterator's next batch is the one after them (what its
    checkpointed state says), and the run is the one-at-a-time path's, bit for bit. A dataset's element may
    be any pair (a namedtuple here), as `x, y = next(iterator)` took it."""
    cfg = _cfg()
    stream = data.from_arrays(X, Y, BATCH, cfg.seed, data.Position(0)).map(lambda x, y: element((x, y)) if element
                                                                           is tuple else element(x, y))

    def ahead(spec, strategy):
        it = iter(stream)
        ahead.iterators.append(it)
        return [lambda done: it] * len(calls)

    def one_at_a_time(spec, strategy):
        it = _OneAtATime(iter(stream))
        return [lambda done: it] * len(calls)

    ahead.iterators = []
    got, want = _trained(cfg, ahead, calls), _trained(cfg, one_at_a_time, calls)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert all(np.array_equal(a, b) for a, b in zip(got[2], want[2], strict=True)) and len(got[2]) > 4
    [it] = ahead.iterators
    after = next(it)
    expected = list(stream.skip(sum(calls)).take(1))[0]
    assert np.array_equal(after[0].numpy(), expected[0].numpy()) and np.array_equal(after[1].numpy(), expected[1].numpy())
