"""The models the trainer can train, and the protocol for bringing your own.

Built in:
  * `mlp` — the seed article's model: Dense(128, relu) → Dropout(0.2) → Dense(10, softmax)
    over 784 inputs, Adam, sparse categorical cross-entropy. Data: synthetic MNIST-like
    images, or TFRecords with features `x` (float list of 784) and `y` (int64).
  * `digits` — the same model over 64 inputs, trained on real handwriting: the UCI digits that
    ship in the checkout (trainer/digits.csv.gz: 1,797 8x8 images; 360 held out for validation), no download. The demo.
  * `transformer-lm` — a small decoder-only language model: token + position embedding,
    `--lm-layers` blocks of causal multi-head attention and an MLP (pre-norm, residual),
    a final norm and an output head (separate, or tied to the embedding with `--lm-tied`).
    Mixed precision (`--precision mixed_bfloat16|mixed_float16`, loss scaling for float16),
    XLA (`--xla`) and gradient accumulation (`--grad-accum N`) are options of the loop.
    Data: synthetic token sequences, or TFRecords with feature `tokens` (int64 list of
    `--lm-seq-len` + 1); the model reads tokens[:-1] and predicts tokens[1:].

Your own model: `--model package.module:function`, with `--code-dir DIR` naming the folder that
holds `package` (on the machines: the stack's `run.code`). The function takes the `TrainConfig`
(or nothing) and returns a `ModelSpec`; it is called inside the strategy's scope, so build
the Keras model (and optimizer, if you give one) in it. Example::

    def my_model(config):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        return ModelSpec(
            model=model,
            loss=keras.losses.MeanSquaredError(reduction=None),
            make_dataset=lambda batch_size, seed: tf.data.Dataset.from_tensor_slices(...).batch(batch_size),
        )

`loss(y_true, y_pred)` must return one value per example (or per example and position; the
trainer averages the extra axes), not a mean: the trainer averages over the global batch
itself, as distributed training requires. `make_dataset(batch_size, seed)` gets the global
batch size and must return batched `(x, y)` elements, the same ones for the same seed
(repeated as needed; the trainer resumes by skipping the batches already consumed), or the whole
training set as `(x, y)` numpy arrays, one row per example, as Keras's `fit(x, y)` takes them
(the trainer shuffles them each epoch by the seed and batches them). Without `make_dataset`,
give `parse_tfrecord(serialized_batch) -> (x, y)` and use `--data-uri`.

Metrics and evaluation (`trainer.metrics`): `metrics=["accuracy"]` (or Keras metric objects)
are recorded at every --log-every step on the training batch and, with a validation set, on
the whole set at every --eval-every-steps and at the end. The validation set is
`make_validation(global_batch_size, seed)` (a finite batched `(x, y)` dataset), or the
TFRecords of `--validation-data-uri` read with `parse_tfrecord`; the URI wins when both exist.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import keras
import tensorflow as tf

from trainer import data as data_mod
from trainer.config import TrainConfig


@dataclass
class ModelSpec:
    """What the trainer needs to train a model; see the module docstring for the protocol."""

    model: keras.Model
    """The Keras model; its inputs are the dataset's `x`."""
    loss: Callable
    """`loss(y_true, y_pred)` → per-example losses (no reduction)."""
    make_dataset: Callable[[int, int], tf.data.Dataset | tuple] | None = None
    """`(global_batch_size, seed)` → batched `(x, y)` dataset, deterministic for a seed, or `(x, y)` numpy arrays."""
    optimizer: keras.optimizers.Optimizer | None = None
    """Default: Adam with `--learning-rate`."""
    parse_tfrecord: Callable | None = None
    """`(serialized string batch)` → `(x, y)`, for `--data-uri`."""
    synthetic: Callable[[int], tuple] | None = None
    """`(seed)` → `(x, y)` numpy arrays of the whole synthetic data set, for `--synthetic`."""
    name: str = "model"
    metrics: list = field(default_factory=list)
    """Keras metrics (objects, or names such as "accuracy"), recorded in training and in evaluation."""
    make_validation: Callable[[int, int], tf.data.Dataset] | None = None
    """`(global_batch_size, seed)` → the whole validation set, batched `(x, y)`, finite (not repeated)."""


class NoData(ValueError):
    """The model brings no data and the run names none: no attempt can train (exit 78)."""


def build_model(cfg: TrainConfig) -> ModelSpec:
    """The `ModelSpec` for `cfg.model`; call inside `strategy.scope()`."""
    if cfg.model == "mlp":
        spec = build_mlp(cfg)
    elif cfg.model == "transformer-lm":
        spec = build_transformer_lm(cfg)
    elif cfg.model == "digits":
        spec = build_digits(cfg)
    else:
        spec = load_user_model(cfg)
    if spec.optimizer is None:
        spec.optimizer = keras.optimizers.Adam(learning_rate=cfg.learning_rate)
    if keras.mixed_precision.global_policy().name == "mixed_float16" and not isinstance(
        spec.optimizer, keras.optimizers.LossScaleOptimizer
    ):
        # float16 gradients underflow without a dynamic loss scale.
        spec.optimizer = keras.optimizers.LossScaleOptimizer(spec.optimizer)
    return spec


def seed_mlp(inputs: int, seed: int, name: str) -> keras.Model:
    """The seed article's model: Dense(128, relu) → Dropout(0.2) → Dense(10, softmax) over `inputs` values."""
    return keras.Sequential(
        [
            keras.Input(shape=(inputs,), name="x"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.2, seed=seed),
            # Probabilities in float32 whatever the compute precision, so the loss is stable.
            keras.layers.Dense(10, activation="softmax", dtype="float32"),
        ],
        name=name,
    )


def build_digits(cfg: TrainConfig) -> ModelSpec:
    """The seed article's model on real handwriting: the UCI digits of the checkout (8x8 images)."""
    (x, y), validation = data_mod.uci_digits()
    return ModelSpec(
        model=seed_mlp(64, cfg.seed, "digits"),
        loss=keras.losses.SparseCategoricalCrossentropy(reduction=None),
        # Arrays: the trainer shuffles them each epoch by the run's seed and batches them (on one
        # replica inside the step); a resume continues at the run's batches_seen.
        make_dataset=lambda batch, seed: (x, y),
        make_validation=lambda batch, seed: data_mod.finite_arrays(*validation, batch),
        name="digits",
        metrics=["accuracy"],
    )


def build_mlp(cfg: TrainConfig) -> ModelSpec:
    """The seed article's MNIST model."""
    model = seed_mlp(784, cfg.seed, "mlp")
    return ModelSpec(
        model=model,
        loss=keras.losses.SparseCategoricalCrossentropy(reduction=None),
        parse_tfrecord=data_mod.parse_mlp_records,
        synthetic=lambda seed: data_mod.synthetic_mnist(seed=seed),
        name="mlp",
        metrics=["accuracy"],
        # Synthetic data has its held-out set (same classes, other images); TFRecords have
        # theirs in --validation-data-uri.
        make_validation=(lambda batch, seed: data_mod.finite_arrays(*data_mod.synthetic_mnist_validation(seed=seed),
                                                                    batch)) if cfg.synthetic else None,
    )


class PositionalEmbedding(keras.layers.Layer):
    """Token embedding plus a learned position embedding."""

    def __init__(self, vocab: int, seq_len: int, dim: int, **kw):
        super().__init__(**kw)
        self.vocab, self.seq_len, self.dim = vocab, seq_len, dim
        self.tokens = keras.layers.Embedding(vocab, dim, name="tokens")
        self.positions = keras.layers.Embedding(seq_len, dim, name="positions")

    def call(self, ids):
        pos = keras.ops.arange(keras.ops.shape(ids)[-1])
        return self.tokens(ids) + self.positions(pos)[None]

    def get_config(self):
        return {**super().get_config(), "vocab": self.vocab, "seq_len": self.seq_len, "dim": self.dim}


class TiedHead(keras.layers.Layer):
    """Logits from the token embedding matrix (weight tying), in float32."""

    def __init__(self, embedding: keras.layers.Embedding, **kw):
        super().__init__(**kw)
        self.embedding = embedding

    def call(self, x):
        w = keras.ops.cast(self.embedding.embeddings, x.dtype)
        return keras.ops.cast(keras.ops.matmul(x, keras.ops.transpose(w)), "float32")


def _decoder_block(x, dim: int, heads: int, i: int):
    h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_norm1")(x)
    h = keras.layers.MultiHeadAttention(heads, dim // heads, name=f"block{i}_attention")(h, h, use_causal_mask=True)
    x = keras.layers.Add(name=f"block{i}_residual1")([x, h])
    h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_norm2")(x)
    h = keras.layers.Dense(4 * dim, activation="gelu", name=f"block{i}_mlp_in")(h)
    h = keras.layers.Dense(dim, name=f"block{i}_mlp_out")(h)
    return keras.layers.Add(name=f"block{i}_residual2")([x, h])


def build_transformer_lm(cfg: TrainConfig) -> ModelSpec:
    """A small decoder-only language model sized by the `--lm-*` options."""
    ids = keras.Input(shape=(cfg.lm_seq_len,), dtype="int32", name="tokens")
    embed = PositionalEmbedding(cfg.lm_vocab, cfg.lm_seq_len, cfg.lm_dim, name="embedding")
    x = embed(ids)
    for i in range(cfg.lm_layers):
        x = _decoder_block(x, cfg.lm_dim, cfg.lm_heads, i)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    if cfg.lm_tied:
        logits = TiedHead(embed.tokens, name="head")(x)
    else:
        logits = keras.layers.Dense(cfg.lm_vocab, dtype="float32", name="head")(x)
    model = keras.Model(ids, logits, name="transformer_lm")
    return ModelSpec(
        model=model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        parse_tfrecord=data_mod.make_lm_parser(cfg.lm_seq_len),
        synthetic=lambda seed: data_mod.synthetic_tokens(seq_len=cfg.lm_seq_len, vocab=cfg.lm_vocab, seed=seed),
        name="transformer-lm",
        metrics=["accuracy"],  # next-token accuracy, over every position
        # Synthetic data has its held-out set (512 sequences drawn apart); TFRecords have theirs
        # in --validation-data-uri.
        make_validation=(lambda batch, seed: data_mod.finite_arrays(*data_mod.synthetic_tokens_validation(
            seq_len=cfg.lm_seq_len, vocab=cfg.lm_vocab, seed=seed), batch)) if cfg.synthetic else None,
    )


def load_user_model(cfg: TrainConfig) -> ModelSpec:
    """Import `package.module:function` and call it; clear errors for each way it can go wrong."""
    module_name, _, fn_name = cfg.model.partition(":")
    if cfg.code_dir and cfg.code_dir not in sys.path:
        # The user's folder first, so their module names win over same-named installed ones.
        sys.path.insert(0, cfg.code_dir)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        where = f"in --code-dir {cfg.code_dir}" if cfg.code_dir else "on PYTHONPATH (or give --code-dir DIR)"
        raise ValueError(f"--model {cfg.model}: cannot import {module_name!r} ({e}); is it {where}?") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"--model {cfg.model}: {module_name} has no function {fn_name!r}")
    spec = fn(cfg) if inspect.signature(fn).parameters else fn()
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"--model {cfg.model}: returned {type(spec).__name__}, expected trainer.models.ModelSpec")
    if not isinstance(spec.model, keras.Model):
        raise ValueError(f"--model {cfg.model}: ModelSpec.model is {type(spec.model).__name__}, expected a keras.Model")
    if spec.make_dataset is None and cfg.synthetic and spec.synthetic is None:
        raise ValueError(f"--model {cfg.model}: --synthetic needs ModelSpec.synthetic or make_dataset")
    if spec.make_dataset is None and not cfg.synthetic and (not cfg.data_uri or spec.parse_tfrecord is None):
        has = "parse_tfrecord, which reads --data-uri" if spec.parse_tfrecord is not None else "neither"
        raise NoData(f"--model {cfg.model}: no data: give --data-uri (run.dataUri) with a parse_tfrecord, or "
                     f"ModelSpec.make_dataset (the ModelSpec has {has})")
    return spec


def resolve_precision(cfg: TrainConfig) -> str:
    """The Keras precision policy this run uses (`--precision`, else by model and device)."""
    if cfg.precision is not None:
        return cfg.precision
    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    return "mixed_bfloat16" if cfg.model == "transformer-lm" and on_gpu else "float32"


def configure_runtime(cfg: TrainConfig) -> str:
    """Seeds, op determinism and the Keras precision policy; returns the policy name."""
    keras.utils.set_random_seed(cfg.seed)
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    precision = resolve_precision(cfg)
    keras.mixed_precision.set_global_policy(precision)
    return precision


def seeded_model(cfg: TrainConfig, strategy) -> ModelSpec:
    """Seed every generator, then build the model and its optimizer: the run's initial state.

    Keras draws the seed of every initializer (and random layer) given none from Python's
    global `random`, which `configure_runtime` has just seeded. Nothing else may draw from
    it until the model is built: the object-store clients do on every retry (botocore's and
    google-api-core's backoff jitter), so the caller must have no store transfer in flight
    (`EventLog.flush`). Otherwise a retried write during the build changes the initial
    weights, and the run trains to a different result.
    """
    configure_runtime(cfg)
    with strategy.scope():
        spec = build_model(cfg)
        spec.optimizer.build(spec.model.trainable_variables)
    return spec
