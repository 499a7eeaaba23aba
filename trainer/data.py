"""Training data: synthetic sets, TFRecord files staged from object storage, and the `tf.data` stream.

The stream is an endless sequence of epochs. Epoch `e` is shuffled with seed
`(seed, e)`, so its order depends only on the run's seed and the epoch number; a
resumed run rebuilds the stream from the epoch it stopped in and skips exactly the
batches of that epoch it had already consumed: no batch is repeated, none is skipped.
In-memory arrays trained on one replica skip `tf.data` altogether: `ArraySource` takes
the same batches inside the compiled step.

TFRecord formats the built-in models read (one `tf.train.Example` per record):
  * `mlp`: `x` — float list of 784 values in [0, 1]; `y` — int64 label 0-9.
  * `transformer-lm`: `tokens` — int64 list of `--lm-seq-len` + 1 token ids.

`--data-uri` names a folder; every `*.tfrecord*` file under it is staged to
`--data-dir` (`TRAINSTACK_DATA_DIR`; the machines mount local NVMe there) with parallel
downloads that skip files already there, so a rebooted machine does not download again.
The training stream starts before the downloads end (`trainer.staging`): they run in the
order the stream reads the files, and the stream opens a file once it is whole on disk.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from trainer.staging import Staging, count_file, local_root

AUTOTUNE = tf.data.AUTOTUNE
SHUFFLE_BUFFER = 10_000
MNIST_EXAMPLES = 60_000
MNIST_VALIDATION = 2_000
LM_SEQUENCES = 8_192
LM_VALIDATION = 512
_MAX_EPOCHS = 1 << 40


@dataclass(frozen=True)
class Position:
    """Where the stream is: batches consumed since the start of the run."""

    batches_seen: int = 0


# -- synthetic sets ---------------------------------------------------------------------------


def synthetic_mnist(n: int = MNIST_EXAMPLES, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-shaped data that can be learned: 784 uint8 pixels per image, labels 0-9.

    Each class has a fixed random prototype; an image is its class's prototype plus
    noise. Same seed, same data.
    """
    rng = np.random.default_rng([seed, 784])
    prototypes = rng.integers(0, 192, size=(10, 784), dtype=np.uint8)
    y = rng.integers(0, 10, size=(n,), dtype=np.int64)
    x = _pixel_noise(rng, n)
    x += prototypes[y]  # at most 191 + 63: no uint8 overflow
    return x, y


def _pixel_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` images of uniform noise in 0-63, eight pixels from each full-range 64-bit draw (its bytes,
    little-endian, low six bits): a quarter of the CPU of a bounded draw per pixel (0.06 against
    0.22 CPU-s for 60,000 images), which every synthetic run pays at its start."""
    words = rng.integers(0, 2**64, size=-(-n * 784 // 8), dtype=np.uint64).astype("<u8", copy=False)
    return (words.view(np.uint8)[: n * 784] & np.uint8(63)).reshape(n, 784)


def synthetic_mnist_validation(n: int = MNIST_VALIDATION, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The held-out set of `synthetic_mnist(seed=seed)`: the same class prototypes, other images."""
    prototypes = np.random.default_rng([seed, 784]).integers(0, 192, size=(10, 784), dtype=np.uint8)
    rng = np.random.default_rng([seed, 784, 1])
    y = rng.integers(0, 10, size=(n,), dtype=np.int64)
    x = _pixel_noise(rng, n)
    x += prototypes[y]
    return x, y


def synthetic_tokens(n: int = LM_SEQUENCES, seq_len: int = 64, vocab: int = 256, seed: int = 0):
    """Token sequences with structure to learn: each is an arithmetic progression modulo `vocab`.

    Returns `(x, y)`: x = tokens[:-1], y = tokens[1:] as int32 arrays.
    """
    return _progressions(np.random.default_rng([seed, vocab]), n, seq_len, vocab)


def synthetic_tokens_validation(n: int = LM_VALIDATION, seq_len: int = 64, vocab: int = 256, seed: int = 0):
    """The held-out set of `synthetic_tokens(seed=seed)`: progressions of the same kind, drawn apart."""
    return _progressions(np.random.default_rng([seed, vocab, 1]), n, seq_len, vocab)


def _progressions(rng: np.random.Generator, n: int, seq_len: int, vocab: int):
    start = rng.integers(0, vocab, size=(n, 1))
    stride = rng.integers(1, 8, size=(n, 1))
    tokens = ((start + stride * np.arange(seq_len + 1)[None]) % vocab).astype(np.int32)
    return tokens[:, :-1], tokens[:, 1:]


# The UCI handwritten digits (E. Alpaydin and C. Kaynak, "Optical Recognition of Handwritten Digits",
# UCI Machine Learning Repository, CC BY 4.0), as scikit-learn 1.9.1 ships them (`load_digits`'s
# digits.csv.gz, copied beside this file): 1,797 images of 8x8 pixels in 17 grey levels (0-16), labels
# 0-9, a row each. Read here rather than through scikit-learn: with scikit-learn installed, every
# process that imports Keras imports it and SciPy too (Keras's scikit-learn wrappers), about 0.8 CPU-s
# more a start-up. The local demo's data: not in the machines' code archive (components/code.py).
# A fixed fifth is held out for validation, the same in every run.
DIGITS_VALIDATION = 360
DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")


def uci_digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The UCI digits, ((x_train, y_train), (x_validation, y_validation)): x float32 in [0, 1], 64 per image.

    Real handwriting in the checkout (no download): the closest real cousin of MNIST that runs
    anywhere. The split is a permutation by a fixed seed, not the run's.
    """
    try:
        with gzip.open(DIGITS_FILE, "rt") as f:
            rows = np.loadtxt(f, delimiter=",", dtype=np.float64)
    except OSError as e:
        raise RuntimeError(f"--model digits is the local demo, and its data is not here ({DIGITS_FILE}: {e}): "
                           f"run it from the project's checkout") from None
    x = (rows[:, :-1] / 16.0).astype(np.float32)
    y = rows[:, -1].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    train, held = order[:-DIGITS_VALIDATION], order[-DIGITS_VALIDATION:]
    return (x[train], y[train]), (x[held], y[held])


def preprocess(x: tf.Tensor) -> tf.Tensor:
    """uint8 pixels become float32 in [0, 1]; anything else is passed through."""
    return tf.cast(x, tf.float32) / 255.0 if x.dtype == tf.uint8 else x


# -- TFRecord parsing -------------------------------------------------------------------------


def parse_mlp_records(serialized: tf.Tensor):
    """A batch of serialized `mlp` examples → `(x [B, 784] float32, y [B] int64)`."""
    f = tf.io.parse_example(
        serialized,
        {"x": tf.io.FixedLenFeature([784], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)},
    )
    return f["x"], f["y"]


def make_lm_parser(seq_len: int) -> Callable:
    """Parser for `transformer-lm` records holding `seq_len + 1` tokens each."""

    def parse(serialized: tf.Tensor):
        f = tf.io.parse_example(serialized, {"tokens": tf.io.FixedLenFeature([seq_len + 1], tf.int64)})
        tokens = tf.cast(f["tokens"], tf.int32)
        return tokens[:, :-1], tokens[:, 1:]

    return parse


# -- staging ----------------------------------------------------------------------------------


def stage(data_uri: str, data_dir: str | None = None) -> list[str]:
    """Download the TFRecord files under `data_uri` to local disk; return their local paths.

    Files already staged with the right size are not downloaded again.
    """
    from runfolder.storage import download_many, open_store

    store = open_store(data_uri)
    keys = sorted(k for k in store.list("") if ".tfrecord" in os.path.basename(k))
    if not keys:
        raise ValueError(f"--data-uri {data_uri}: no *.tfrecord* files there")
    root = local_root(data_uri, data_dir)  # one folder per data URI: two data sets never mix
    paths = {k: os.path.join(root, *k.split("/")) for k in keys}
    for p in paths.values():
        os.makedirs(os.path.dirname(p), exist_ok=True)
    download_many(store, paths)
    return [paths[k] for k in keys]


def count_records(files: list[str]) -> int:
    """Records in the staged files, cached beside them (keyed by names and sizes)."""
    key = hashlib.sha256(json.dumps([(f, os.path.getsize(f)) for f in files]).encode()).hexdigest()
    cache = os.path.join(os.path.dirname(files[0]), f".records-{key[:16]}.json")
    try:
        with open(cache) as fh:
            return int(json.load(fh)["records"])
    except (OSError, ValueError, KeyError):
        pass
    n = sum(count_file(f) for f in files)
    tmp = cache + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"records": n}, fh)
    os.replace(tmp, cache)
    return n


# -- the stream -------------------------------------------------------------------------------


def _permutation(size, seed: int, epoch: tf.Tensor, salt) -> tf.Tensor:
    """A seeded random permutation of `range(size)`, fixed by (seed, epoch, salt).

    Stateless, so a resumed run rebuilds an epoch's order exactly. `Dataset.shuffle` cannot
    take the epoch as a tensor seed inside `flat_map`, and `index_shuffle` ignores all but
    the low bits of its seed, so the order comes from sorting stateless random keys.
    """
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64) * 1_000_003 + tf.cast(salt, tf.int64)])
    keys = tf.random.stateless_uniform(tf.reshape(tf.cast(size, tf.int32), [1]), key, minval=None, maxval=None,
                                       dtype=tf.int64)
    return tf.argsort(keys, stable=True)


def _stream(epoch_fn, batches_per_epoch: int | None, position: Position) -> tf.data.Dataset:
    """Epochs from the one `position` falls in, skipping the batches of it already consumed.

    `batches_per_epoch` may be None (not counted yet) only at the start of a run.
    """
    if batches_per_epoch is None:
        if position.batches_seen:
            raise ValueError("a resumed stream needs the data set's record count")
        batches_per_epoch = 1  # epoch 0, nothing to skip: the count is not used
    if batches_per_epoch < 1:
        raise ValueError("the data set holds less than one global batch; lower --batch-size or add data")
    first_epoch, skip = divmod(position.batches_seen, batches_per_epoch)
    ds = tf.data.Dataset.range(first_epoch, _MAX_EPOCHS).flat_map(epoch_fn)
    return ds.skip(skip)


def from_arrays(x: np.ndarray, y: np.ndarray, global_batch: int, seed: int, position: Position) -> tf.data.Dataset:
    """In-memory examples: each epoch a seeded permutation, batched as indices, then gathered."""
    n = len(x)
    xt, yt = tf.constant(x), tf.constant(y)

    batches = n // global_batch

    def epoch(e):
        order = tf.cast(_permutation(n, seed, e, 0), tf.int64)
        # One element per batch, not per example: the same batches as slicing the order and
        # batching it with drop_remainder, without tf.data's per-example work (bench/RESULTS.md).
        return tf.data.Dataset.from_tensor_slices(tf.reshape(order[: batches * global_batch], [batches, global_batch]))

    ds = _stream(epoch, batches, position)
    ds = ds.map(lambda i: (preprocess(tf.gather(xt, i)), tf.gather(yt, i)), num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE)


class ArraySource:
    """In-memory examples batched inside the step's graph: `from_arrays`'s batches, with no tf.data.

    An iterator for `trainer.step`'s `train_steps`: each `next()` inside the compiled call is a
    few graph ops, not a hand-over from tf.data's threads (whose per-batch machinery cost
    2-3 µs of CPU an example against the whole step's ~17: bench/RESULTS.md). The batches are
    `from_arrays`'s, element for element: batch `b` of epoch `e` is the rows
    `_permutation(n, seed, e, 0)[b * B:(b + 1) * B]`, converted by `preprocess`'s arithmetic.

    `position` is a variable counting the batches taken since the start of the run: a resume
    starts it at the run's `batches_seen`, so there is no iterator state to save. The epoch's
    order is kept in a variable and computed again (on the CPU, as the stream's) only when
    `position` enters another epoch: a `tf.cond` per step, whose recomputing branch runs once an epoch.

    The examples stay in host memory and each batch is gathered there. uint8 pixels are
    converted after the gather: on the CPU by a division whose divisor is a variable (with a
    constant one, TensorFlow's graph optimizer turns `x / 255` into a product that rounds 126
    of the 256 values otherwise than the stream); on another device (`device`, the replica's)
    by a table of the 256 values the stream gives, looked up there, so only the uint8 batch
    (a quarter of float32's bytes) crosses to the device and the values stay exact.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, global_batch: int, seed: int, position: Position,
                 device: str = "/cpu:0"):
        n = len(x)
        if len(y) != n:
            raise ValueError(f"the examples' x holds {n} rows and y {len(y)}: one label per example")
        self.batches = n // global_batch  # a whole epoch's, the rest of the examples left out as the stream does
        if self.batches < 1:
            raise ValueError("the data set holds less than one global batch; lower --batch-size or add data")
        self.n, self.seed, self.global_batch = n, seed, global_batch
        self.device = device
        on_cpu = "CPU" in device.upper()
        with tf.device("/cpu:0"):
            self.x, self.y = tf.constant(x), tf.constant(y)
            self.position = tf.Variable(position.batches_seen, dtype=tf.int64, trainable=False, name="data_position")
            self.order = tf.Variable(tf.zeros([self.batches, global_batch], tf.int64), trainable=False,
                                     name="data_order")
            self.order_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False, name="data_order_epoch")
            self.divisor = self.table = None
            if self.x.dtype == tf.uint8 and on_cpu:
                self.divisor = tf.Variable(255.0, trainable=False, name="data_divisor")
            elif self.x.dtype == tf.uint8:
                values = preprocess(tf.cast(tf.range(256), tf.uint8))  # eager, on the CPU: the stream's values
                with tf.device(device):
                    self.table = tf.identity(values)  # copied to the device once
        x_dtype = tf.float32 if self.x.dtype == tf.uint8 else self.x.dtype
        self.element_spec = (tf.TensorSpec([global_batch, *x.shape[1:]], x_dtype),
                             tf.TensorSpec([global_batch, *y.shape[1:]], self.y.dtype))

    def __iter__(self):
        return self

    def _epoch_order(self, epoch) -> tf.Tensor:
        """Epoch `epoch`'s order, as index rows of its batches (stateless: the stream's permutation)."""
        order = tf.cast(_permutation(self.n, self.seed, epoch, 0), tf.int64)
        return tf.reshape(order[: self.batches * self.global_batch], [self.batches, self.global_batch])

    def _new_epoch(self, epoch) -> tf.Tensor:
        """Epoch `epoch`'s order, kept for the epoch's other batches."""
        order = self._epoch_order(epoch)
        with tf.control_dependencies([self.order.assign(order), self.order_epoch.assign(epoch)]):
            return tf.identity(order)

    def _batch(self, pos, order, divisor):
        """Batch `pos` (counted from the run's start) of the epoch whose `order` is given: gathered and converted."""
        with tf.device("/cpu:0"):
            idx = tf.gather(order, pos % tf.constant(self.batches, tf.int64))
            x, y = tf.gather(self.x, idx), tf.gather(self.y, idx)
            if divisor is not None:
                x = tf.cast(x, tf.float32) / divisor
        if self.table is not None:
            with tf.device(self.device):
                x = tf.gather(self.table, tf.cast(x, tf.int32))
        return x, y

    def __next__(self):
        """The next batch, one at a time (the position and the order's cache updated as it goes)."""
        with tf.device("/cpu:0"):
            pos = self.position.read_value()
            self.position.assign_add(1)  # after the read: ops on one variable run in program order
            epoch = pos // tf.constant(self.batches, tf.int64)
            order = tf.cond(tf.equal(self.order_epoch.read_value(), epoch), self.order.read_value,
                            lambda: self._new_epoch(epoch))
            divisor = None if self.divisor is None else self.divisor.read_value()
        return self._batch(pos, order, divisor)

    # A call of many steps takes its batches as loop state, not through `next()`: `open_call` reads the
    # variables once and gives the call's first batch; `following` gives each next batch from the state
    # alone; `close_call` writes the variables back. With no variable read or written in the loop, a
    # batch depends on no step before it (TensorFlow orders stateful ops in program order), so the step
    # can take batch i + 1 while it trains on batch i, and its gather and conversion run on the core the
    # step leaves idle: measured 5 % of the step at batch 64 (bench/RESULTS.md). Each call gathers one
    # batch more than it trains on, which the next call takes again.

    def open_call(self):
        """At a call's start, in its graph: (the batch at the position, the state `following` takes)."""
        with tf.device("/cpu:0"):
            pos = self.position.read_value()
            state = {"pos": pos, "order": self.order.read_value(), "epoch": self.order_epoch.read_value()}
            if self.divisor is not None:
                state["divisor"] = self.divisor.read_value()
        return self.following(state)

    def following(self, state):
        """(Batch `state["pos"]`, the state of the batch after it), touching no variable."""
        pos = state["pos"]
        with tf.device("/cpu:0"):
            epoch = pos // tf.constant(self.batches, tf.int64)
            order = tf.cond(tf.equal(state["epoch"], epoch), lambda: tf.identity(state["order"]),
                            lambda: self._epoch_order(epoch))
            after = {**state, "pos": pos + 1, "order": order, "epoch": epoch}
        return self._batch(pos, order, state.get("divisor")), after

    def close_call(self, count, state) -> None:
        """At a call's end, after `count` steps: the position past them, and the newest order kept."""
        with tf.device("/cpu:0"):
            self.position.assign_add(count)
            self.order.assign(state["order"])
            self.order_epoch.assign(state["epoch"])


def file_order(nfiles: int, seed: int, epoch: int) -> list[int]:
    """The order epoch `epoch` reads the files in (indexes into the name-sorted file list)."""
    return [int(i) for i in _permutation(nfiles, seed, tf.constant(epoch, tf.int64), 0).numpy()]


def from_tfrecords(files: list[str], parse: Callable, global_batch: int, seed: int, position: Position,
                   records: int | None = None, ready: Callable | None = None) -> tf.data.Dataset:
    """TFRecord files: seeded file order, interleaved reads, windowed shuffle, batch, parallel parse.

    `records` (the data set's count) is counted here when not given, unless `ready` is given and
    the stream starts at the run's start, where no count is needed. `ready(path)`, when given, is
    called before a file is opened and returns its path once the file is whole on disk (files
    still downloading: `trainer.staging.Staging.ready`); the batches are the same either way.
    """
    if records is None and (ready is None or position.batches_seen):
        records = count_records(files)
    nfiles = len(files)
    names = tf.constant(files)
    cycle = min(8, nfiles)
    # Shuffled in windows of SHUFFLE_BUFFER records. A smaller data set is one window, the same
    # window `min(records, SHUFFLE_BUFFER)` made, so the count is not needed here.
    window = SHUFFLE_BUFFER

    def shuffle_window(i, recs, e):
        return tf.gather(recs, _permutation(tf.shape(recs)[0], seed, e, 1 + i))

    def when_ready(path):
        return tf.ensure_shape(tf.numpy_function(ready, [path], tf.string, stateful=True, name="data_ready"), [])

    def records_of(path):
        if ready is None:
            return tf.data.TFRecordDataset(path)
        # The wait happens at the file's first read, in the interleave's worker for that file, so
        # the files already on disk keep flowing meanwhile (a wait in the interleave's input would
        # hold every file back).
        return tf.data.Dataset.from_tensors(path).map(when_ready).flat_map(tf.data.TFRecordDataset)

    def epoch(e):
        order = tf.data.Dataset.from_tensor_slices(tf.gather(names, _permutation(nfiles, seed, e, 0)))
        # deterministic=True keeps the order reproducible, which exact resume needs.
        recs = order.interleave(records_of, cycle_length=cycle, block_length=16,
                                num_parallel_calls=AUTOTUNE, deterministic=True)
        recs = recs.batch(window).enumerate().map(lambda i, r: shuffle_window(i, r, e)).unbatch()
        return recs.batch(global_batch, drop_remainder=True)

    # Skipped batches are skipped before parsing, so a resume does not parse them.
    ds = _stream(epoch, None if records is None else records // global_batch, position)
    ds = ds.map(lambda s: _pre(parse(s)), num_parallel_calls=AUTOTUNE, deterministic=True)
    if ready is not None:
        # A file's wait holds one of tf.data's threads: the interleave's workers, current and
        # prefetched, can all be waiting at once (two per cycle slot). On the shared pool (one
        # thread per core) they would starve the files already on disk: measured, the first
        # batch then waited for every file but one, against the first `cycle` files with room.
        opts = tf.data.Options()
        opts.threading.private_threadpool_size = (os.cpu_count() or 1) + 2 * cycle
        ds = ds.with_options(opts)
    return ds.prefetch(AUTOTUNE)


def _pre(xy):
    x, y = xy
    return preprocess(x), y


def from_user(make_dataset: Callable, global_batch: int, seed: int, position: Position) -> tf.data.Dataset:
    """A user's `make_dataset(batch, seed)`, repeated, with the consumed batches skipped.

    A `make_dataset` that returns `(x, y)` arrays gets `from_arrays`'s stream of them.
    """
    return from_own(make_dataset(global_batch, seed), global_batch, seed, position)


def from_own(own, global_batch: int, seed: int, position: Position) -> tf.data.Dataset:
    """The stream of what a `make_dataset` returned (see `from_user`), from `position`."""
    arrays = arrays_of(own)
    if arrays is not None:
        return from_arrays(*arrays, global_batch, seed, position)
    return own.repeat().skip(position.batches_seen).prefetch(AUTOTUNE)


def arrays_of(own) -> tuple[np.ndarray, np.ndarray] | None:
    """What a `make_dataset` returned: `(x, y)` when in-memory arrays, None for a `tf.data.Dataset`.

    Arrays are the model's whole training set, one row per example (Keras's `fit(x, y)`): the
    trainer shuffles them each epoch by the run's seed and batches them (`from_arrays`,
    `ArraySource`). Anything else is an error that names what came back.
    """
    if isinstance(own, tf.data.Dataset):
        return None
    if isinstance(own, tuple | list) and len(own) == 2 and all(isinstance(a, np.ndarray) for a in own):
        x, y = own
        if x.ndim < 1 or y.ndim < 1 or len(x) != len(y):
            raise ValueError(f"make_dataset returned arrays of {x.shape} and {y.shape}: x and y need one row "
                             "per example, as many of each")
        return x, y
    raise ValueError(f"make_dataset returned {type(own).__name__}, expected a tf.data.Dataset or (x, y) numpy arrays")


# -- the validation set ------------------------------------------------------------------------


def finite_arrays(x: np.ndarray, y: np.ndarray, global_batch: int) -> tf.data.Dataset:
    """In-memory validation examples, in order, once: the last batch may be short."""
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    return ds.map(lambda a, b: (preprocess(a), b), num_parallel_calls=AUTOTUNE, deterministic=True).prefetch(AUTOTUNE)


def finite_tfrecords(files: list[str], parse: Callable, global_batch: int) -> tf.data.Dataset:
    """Validation TFRecords, every record once, in file order: the last batch may be short."""
    ds = tf.data.TFRecordDataset(files).batch(global_batch)
    return ds.map(lambda s: _pre(parse(s)), num_parallel_calls=AUTOTUNE, deterministic=True).prefetch(AUTOTUNE)


def make_validation(spec, cfg, global_batch: int) -> tf.data.Dataset | None:
    """The validation set for a `ModelSpec` and config, or None when there is none.

    `--validation-data-uri` (read with the model's `parse_tfrecord`) wins over the model's
    own `make_validation`. Nothing here draws from a random stream the training uses.
    """
    if cfg.validation_data_uri:
        if spec.parse_tfrecord is None:
            raise ValueError(f"--validation-data-uri {cfg.validation_data_uri}: the model has no parse_tfrecord to "
                             "read it with; give ModelSpec.parse_tfrecord, or drop the option and use "
                             "ModelSpec.make_validation")
        files = stage(cfg.validation_data_uri, cfg.data_dir)
        return finite_tfrecords(files, spec.parse_tfrecord, global_batch)
    if spec.make_validation is None:
        return None
    ds = spec.make_validation(global_batch, cfg.seed)
    if not isinstance(ds, tf.data.Dataset):
        raise ValueError(f"make_validation returned {type(ds).__name__}, expected a tf.data.Dataset")
    if ds.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise ValueError("make_validation returned an endless dataset (.repeat()?); it must hold the validation set "
                         "once")
    return ds


def make_dataset(spec, cfg, global_batch: int, position: Position) -> tf.data.Dataset:
    """The training stream for a `ModelSpec` and config, starting at `position`."""
    return make_stream(spec, cfg, global_batch, position)[0]


def make_stream(spec, cfg, global_batch: int, position: Position, emit: Callable | None = None, own=None):
    """The training stream starting at `position`, and the `Staging` of its files (None without --data-uri).

    TFRecords from `--data-uri` are downloaded while the stream runs: in the file order of the
    epoch it starts in, which the record count (from the bucket's index, or counted when there is
    none) places; a resumed run without an index waits for every file, to count them.
    `emit(event, **fields)` receives the staging's events. `own`: what the model's
    `make_dataset` (or `synthetic`) already returned, so that it is not made again.
    """
    if own is None and spec.make_dataset is not None:
        own = spec.make_dataset(global_batch, cfg.seed)
    if own is not None:
        return from_own(own, global_batch, cfg.seed, position), None
    if cfg.synthetic:
        x, y = spec.synthetic(cfg.seed)
        return from_arrays(x, y, global_batch, cfg.seed, position), None
    staging = Staging(cfg.data_uri, cfg.data_dir, run_uri=cfg.run_uri, wait_s=cfg.data_wait_s, emit=emit,
                      min_records=global_batch)
    nfiles = len(staging.files)
    records = staging.records()
    if staging.all_local() or (records is None and position.batches_seen):
        # Every file on disk already (counted here if need be, as before streaming), or resumed
        # without an index: the epoch the run stands in needs the count of every file.
        staging.start(list(range(nfiles)))
        staging.wait_all()
        staging.check()
        records = staging.records()
    elif records is None:
        staging.start(file_order(nfiles, cfg.seed, 0))
    else:
        if records < global_batch:
            raise ValueError("the data set holds less than one global batch; lower --batch-size or add data")
        staging.start(file_order(nfiles, cfg.seed, position.batches_seen // (records // global_batch)))
    ds = from_tfrecords(staging.files, spec.parse_tfrecord, global_batch, cfg.seed, position, records=records,
                        ready=None if staging.complete else staging.ready)
    return ds, staging
