"""The trainer's configuration: one typed dataclass filled from CLI flags and `TRAINSTACK_*` env vars.

Every flag `--some-option` can also be given as `TRAINSTACK_SOME_OPTION` (booleans as
`1/true/yes` or `0/false/no`): `runfolder.environment.option_env` derives the name, and that
module's table gives the names the machines' env file (`components/userdata.py: boot_env`) and
script mode set. `TRAINSTACK_EXTRA_ARGS` holds more flags (shell-quoted) that are
parsed as if given on the command line. Precedence: command-line flags, then
`TRAINSTACK_EXTRA_ARGS`, then the other variables, then the defaults below.

The defaults train to completion on a 2-core CPU in well under a minute: the README's demo
(`python -m trainer --run-uri file://./runs/demo --model digits`, real handwriting) or the
example `mlp` on synthetic data (`--synthetic`, what the benchmarks measure).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runfolder import environment

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ValueError):
    """A trainer option that cannot work; the message names the option and what was expected."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs to know; see `--help` for each field's meaning."""

    run_uri: str
    model: str = "mlp"
    code_dir: str | None = None
    synthetic: bool = False
    data_uri: str | None = None
    validation_data_uri: str | None = None
    eval_every_steps: int | None = None  # None: evaluate at the end only
    keep_best: str | None = None  # "val_<metric>[:min|:max]" (see --keep-best)
    steps: int = 1000
    batch_size: int = 64
    # Off by default: a step cadence on a fast model checkpoints several times a second (250 steps
    # of the mlp at batch 64 take ~0.25 s), and every checkpoint serializes a make_dataset's state
    # in the loop; time bounds the work a failure loses, and a spot notice saves its own step.
    checkpoint_every_steps: int | None = None
    checkpoint_every_seconds: float | None = 600.0
    keep_checkpoints: int = 3
    seed: int = 0
    deterministic: bool = False
    learning_rate: float = 1e-3
    precision: str | None = None
    xla: bool = False
    grad_accum: int = 1
    log_every: int = 50
    steps_per_call: int | None = None  # None: auto (see --steps-per-call)
    progress_every_seconds: float = 10.0
    lm_layers: int = 2
    lm_dim: int = 64
    lm_heads: int = 4
    lm_seq_len: int = 64
    lm_vocab: int = 256
    lm_tied: bool = False
    data_dir: str | None = None
    data_wait_s: float = 900.0  # the longest the stream waits for one --data-uri file to be on disk
    work_dir: str | None = None
    gpus_per_node: int | None = None
    startup_timeout: float = 600.0
    lease_ttl_s: float = 60.0
    lease_wait_s: float | None = None
    price_per_hour: float | None = None
    price_note: str | None = None
    placement: str | None = None
    verbose: bool = False
    # Script mode: the user's own command (after `--`, or TRAINSTACK_COMMAND as a JSON list),
    # run in --code-dir by trainer/script.py instead of the trainer's own loop.
    command: tuple[str, ...] | None = None
    stop_grace_s: float = 100.0
    # A user make_dataset's pipeline state saved in each checkpoint, up to this size (0: never, resume skips).
    data_state_max_mb: float = 64.0
    # A make_dataset pipeline's threads on one CPU replica: "normal" (the kernel's sharing) or "idle" (only the
    # cores the step leaves: a dedicated machine's choice, trainer/input_threads.py).
    input_priority: str = "normal"

    @property
    def per_step_batch(self) -> int:
        """Examples each replica consumes per optimizer step (micro-batch × accumulation)."""
        return self.batch_size * self.grad_accum


def _bool(text: str, name: str) -> bool:
    v = text.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"{name}={text!r}: expected 1/true/yes or 0/false/no")


def _number(conv, text: str, what: str):
    # argparse would name the converting function ("invalid _positive_int value"): say what is expected.
    try:
        return conv(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _positive_int(text: str) -> int:
    v = _number(int, text, "a positive integer")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg_int(text: str) -> int:
    v = _number(int, text, "an integer >= 0")
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    v = _number(float, text, "a positive number")
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _nonneg_float(text: str) -> float:
    value = _number(float, text, "a number")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _optional(conv):
    """Accept 0 / "none" / "" as "off" for the checkpoint cadences."""

    def parse(text: str):
        if text.strip().lower() in ("", "0", "none", "off"):
            return None
        return conv(text)

    parse.__name__ = conv.__name__
    return parse


def _auto(conv):
    """Accept "auto" (and "" or "0") as None: the trainer chooses."""

    def parse(text: str):
        if text.strip().lower() in ("", "0", "auto"):
            return None
        return conv(text)

    parse.__name__ = conv.__name__
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the problem and, for a mistyped flag, the nearest real one."""

    def error(self, message: str):
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
            hints = []
            for arg in unknown.group(1).split():
                if not arg.startswith("-"):
                    continue  # the value given to an unknown flag
                near = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1, cutoff=0.75)
                hints.append(f"{arg} (did you mean {near[0]}?)" if near else arg)
            message = "unknown option " + ", ".join(hints or [unknown.group(1)])
            if not hints:
                # Words with no flag among them: a command given without the `--` before it.
                message += f" (to run a command, put -- before it: -- {unknown.group(1)})"
        self.exit(2, f"{self.prog}: error: {message}; see --help\n")


def build_parser() -> argparse.ArgumentParser:
    """The CLI; each option's env variable is `TRAINSTACK_` + its name in UPPER_SNAKE."""
    p = _Parser(
        prog="python -m trainer",
        usage="python -m trainer --run-uri URI [options] [-- COMMAND ...]",
        epilog="Script mode: everything after `--` is your own command (e.g. -- python train.py), run in a "
        "writable copy of --code-dir with the run's checkpoints, events and outputs (docs/your-fit-script.md).",
        description="Train a TensorFlow model with checkpoints in object storage that survive preemption. "
        "Every option can also be set as TRAINSTACK_<OPTION> in the environment (e.g. TRAINSTACK_RUN_URI); "
        "TRAINSTACK_EXTRA_ARGS holds more flags. Flags beat the environment.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = TrainConfig(run_uri="")
    # Added in this order: --help lists them so.
    _add_run_and_data_options(p, d)
    _add_training_options(p, d)
    _add_transformer_lm_options(p, d)
    _add_machine_options(p, d)
    return p


def _add_run_and_data_options(p: argparse.ArgumentParser, d: TrainConfig) -> None:
    """Where the run lives, which model, and the data it trains and evaluates on."""
    p.add_argument("--run-uri", help="where the run lives: s3://B/runs/ID, gs://B/runs/ID or file://DIR (required)")
    p.add_argument("--model", default=d.model, help="mlp, transformer-lm, digits (the local demo: real handwriting, in the checkout), "
                   "or package.module:function returning a ModelSpec")
    p.add_argument("--code-dir", default=None,
                   help="folder of your own Python modules (importable by --model package.module:function); "
                   "on the machines it is the stack's run.code folder")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--synthetic", action="store_true", default=None, help="train on deterministic synthetic data")
    src.add_argument("--data-uri", default=None, help="folder of TFRecord files (*.tfrecord*) on s3://, gs:// or file://")
    p.add_argument("--validation-data-uri", default=None,
                   help="folder of validation TFRecord files (*.tfrecord*), read with the model's parse_tfrecord; "
                   "default: the model's own make_validation, if it has one")
    p.add_argument("--eval-every-steps", type=_optional(_positive_int), default=None,
                   help="evaluate on the whole validation set every N steps (0: only at the end); "
                   "a run with a validation set is always evaluated at the end")
    p.add_argument("--keep-best", default=None, metavar="val_METRIC[:min|:max]",
                   help="keep the checkpoint with the best value of a validation metric (e.g. val_accuracy, "
                   "val_loss) outside the pruning and export it as model/; direction: min for names with "
                   "'loss' or 'error', else max, or say it with :min / :max")


def _add_training_options(p: argparse.ArgumentParser, d: TrainConfig) -> None:
    """How long and how it trains: steps, batches, checkpoints, seed, precision, logging."""
    p.add_argument("--steps", type=_positive_int, default=d.steps, help="optimizer steps in the whole run")
    p.add_argument("--batch-size", type=_positive_int, default=d.batch_size, help="examples per replica per micro-batch")
    p.add_argument("--checkpoint-every-steps", type=_optional(_positive_int), default=d.checkpoint_every_steps,
                   help="checkpoint every N steps (0: off; default off: --checkpoint-every-seconds bounds the work lost in time)")
    p.add_argument("--checkpoint-every-seconds", type=_optional(_positive_float), default=d.checkpoint_every_seconds,
                   help="checkpoint at least every S seconds (0: off)")
    p.add_argument("--keep-checkpoints", type=_positive_int, default=d.keep_checkpoints, help="committed checkpoints kept")
    p.add_argument("--seed", type=_nonneg_int, default=d.seed, help="seed of initial weights, dropout and data order")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="op determinism: a resumed run ends with the same weights as an uninterrupted one (CPU)")
    p.add_argument("--learning-rate", type=_positive_float, default=d.learning_rate, help="optimizer learning rate")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="compute precision (default: mixed_bfloat16 for transformer-lm on GPUs, else float32)")
    p.add_argument("--xla", action="store_true", default=None, help="compile the train step with XLA (jit_compile)")
    p.add_argument("--grad-accum", type=_positive_int, default=d.grad_accum,
                   help="micro-batches accumulated per optimizer step")
    p.add_argument("--log-every", type=_positive_int, default=d.log_every, help="TensorBoard scalars every N steps")
    p.add_argument("--steps-per-call", type=_auto(_positive_int), default=None,
                   help="steps run per tf.function call (fewer Python round trips; a stop waits for the call). "
                   "Default auto: as many as run in about a second (with several workers: 10)")
    p.add_argument("--progress-every-seconds", type=_positive_float, default=d.progress_every_seconds,
                   help="how often progress.json is rewritten")


def _add_transformer_lm_options(p: argparse.ArgumentParser, d: TrainConfig) -> None:
    """The built-in transformer-lm's shape."""
    p.add_argument("--lm-layers", type=_positive_int, default=d.lm_layers, help="transformer-lm: decoder blocks")
    p.add_argument("--lm-dim", type=_positive_int, default=d.lm_dim, help="transformer-lm: model width")
    p.add_argument("--lm-heads", type=_positive_int, default=d.lm_heads, help="transformer-lm: attention heads")
    p.add_argument("--lm-seq-len", type=_positive_int, default=d.lm_seq_len, help="transformer-lm: tokens per sequence")
    p.add_argument("--lm-vocab", type=_positive_int, default=d.lm_vocab, help="transformer-lm: vocabulary size")
    p.add_argument("--lm-tied", action="store_true", default=None, help="transformer-lm: output head tied to the embedding")


def _add_machine_options(p: argparse.ArgumentParser, d: TrainConfig) -> None:
    """The machine it runs on: staging and scratch, GPUs, workers, the lease, price, placement, stopping."""
    p.add_argument("--data-dir", default=None,
                   help="local folder the --data-uri files are staged to (default: a cache folder)")
    p.add_argument("--data-wait-s", type=_positive_float, default=d.data_wait_s,
                   help="--data-uri files download while training starts, in the order the stream reads them: "
                   "the longest the stream waits for one file to be whole on disk before the run fails, "
                   "naming the file")
    p.add_argument("--work-dir", default=None, help="local scratch for checkpoints and TensorBoard (default: a temp dir)")
    p.add_argument("--gpus-per-node", type=_nonneg_int, default=None,
                   help="GPUs TensorFlow must see on this machine, else the run fails at once (exit 78); "
                   "unset: no check")
    p.add_argument("--startup-timeout", type=_positive_float, default=d.startup_timeout,
                   help="several workers: seconds to wait for every worker named in TF_CONFIG to join; "
                   "past it the worker exits 75 with a failed event naming the workers it waited for "
                   "(unused with one worker)")
    p.add_argument("--lease-ttl-s", type=_positive_float, default=d.lease_ttl_s,
                   help="the run's single-writer lease: how long it lasts unrenewed (renewed every quarter of it); "
                   "another machine's trainer takes over a lease not renewed for this long")
    p.add_argument("--lease-wait-s", type=_positive_float, default=None,
                   help="how long to wait for another trainer's lease on the run before exiting 77 "
                   "(default: the TTL plus 25 s, enough for a dead holder's lease to run out)")
    p.add_argument("--price-per-hour", type=_positive_float, default=None,
                   help="USD per machine-hour, recorded in the `started` event so that ops status and COMPLETE can "
                   "total the run's cost (the stack sets it from its price table)")
    p.add_argument("--price-note", default=None, help="what --price-per-hour is (e.g. a spot estimate and its table's date)")
    p.add_argument("--placement", default=None,
                   help="where this machine runs, as '<cloud> <region>', recorded in the `started` event so that "
                   "ops status and COMPLETE split the run's machine time and cost by placement (the stack sets it)")
    p.add_argument("--stop-grace-s", type=_positive_float, default=d.stop_grace_s,
                   help="script mode (-- COMMAND): after a stop signal, how long the command may take to commit "
                   "its checkpoint and exit before it is killed (within the spot notice: 120 s AWS, 30 s GCP)")
    p.add_argument("--data-state-max-mb", type=_nonneg_float, default=d.data_state_max_mb,
                   help="a model's own make_dataset: its input pipeline's state (shuffle and prefetch buffers "
                   "included) is saved in each checkpoint when it is at most this many MiB, so a resume continues "
                   "the stream without reading the consumed batches again; larger, or 0, and a resume skips them")
    p.add_argument("--input-priority", choices=("idle", "normal"), default=d.input_priority,
                   help="one replica on the CPU: 'idle' runs a model's own tf.data pipeline's threads only on the "
                   "cores the step leaves idle (Linux SCHED_IDLE: +15-20 %% measured on a dedicated 2-core machine, "
                   "but 2-10x slower when another busy process shares the cores, and it cannot be undone during "
                   "the run); 'normal' (the default) shares the cores by turns, as the kernel does")
    p.add_argument("--verbose", action="store_true", default=None,
                   help="show TensorFlow's start-up log lines (oneDNN, CPU features, CUDA plugins), hidden by default")


def _dest(action: argparse.Action) -> str:
    return environment.option_env(action.dest)


def env_variables() -> frozenset[str]:
    """Every variable the trainer reads as its configuration: each option's, the extra flags and the command."""
    options = {_dest(a) for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    return frozenset(options | {environment.EXTRA_ARGS, environment.COMMAND})


def _env_argv(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> list[str]:
    """Turn the TRAINSTACK_* variables the parser knows into flags (unknown ones belong to the boot)."""
    argv: list[str] = []
    for action in parser._actions:  # argparse has no public walk over its options
        if not action.option_strings or action.dest == "help":
            continue
        name = _dest(action)
        if name not in env:
            continue
        value = env[name]
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            if _bool(value, name):
                argv.append(flag)
        else:
            # One `--flag=value` word: a value starting with '-' would otherwise be read as a flag.
            argv.append(f"{flag}={value}")
    return argv


def load_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> TrainConfig:
    """Parse flags and environment into a validated `TrainConfig`.

    Raises `SystemExit(2)` with argparse's message for a malformed flag, and `ConfigError`
    for combinations that cannot work.
    """
    env = os.environ if env is None else env
    argv = list(argv) if argv is not None else []
    command = _command(argv, env)
    if "--" in argv:
        argv = argv[: argv.index("--")]
    parser = build_parser()
    try:
        extra = shlex.split(env.get(environment.EXTRA_ARGS, ""))
    except ValueError as e:
        raise ConfigError(f"{environment.EXTRA_ARGS}: cannot split {env[environment.EXTRA_ARGS]!r}: {e}") from e
    env_args = _env_argv(parser, env)
    # The env-derived flags first, then the extra args, then the real flags: argparse keeps
    # the last value, so real flags beat the environment. The data source is one choice:
    # a flag for one source overrides an env var for the other.
    given = extra + argv
    if any(a == "--synthetic" or a.startswith("--data-uri") for a in given):
        env_args = _drop_source(env_args)
    ns = parser.parse_args(env_args + given)
    values = {k: v for k, v in vars(ns).items() if v is not None}
    for flag in ("synthetic", "deterministic", "xla", "lm_tied", "verbose"):
        values.setdefault(flag, False)
    # Cadences may be switched off explicitly (None), so copy them as parsed.
    values["checkpoint_every_steps"] = ns.checkpoint_every_steps
    values["checkpoint_every_seconds"] = ns.checkpoint_every_seconds
    values["eval_every_steps"] = ns.eval_every_steps
    if not values.get("run_uri"):
        raise ConfigError("--run-uri (or TRAINSTACK_RUN_URI) is required: s3://B/runs/ID, gs://B/runs/ID or file://DIR")
    values["run_uri"] = normalize_uri(values["run_uri"])
    values["command"] = command
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


def _command(argv: list[str], env: Mapping[str, str]) -> tuple[str, ...] | None:
    """Script mode's command: the words after `--`, else TRAINSTACK_COMMAND (a JSON list of strings)."""
    if "--" in argv:
        words = argv[argv.index("--") + 1:]
        if not words:
            raise ConfigError("--: nothing after it; give the command to run, e.g. -- python train.py")
        return tuple(words)
    raw = env.get(environment.COMMAND, "").strip()
    if not raw:
        return None
    try:
        words = json.loads(raw)
    except ValueError:
        words = None
    if not (isinstance(words, list) and words and all(isinstance(w, str) and w for w in words)):
        raise ConfigError(f"TRAINSTACK_COMMAND (run.command) = {raw!r}: expected a JSON list of strings, "
                          'e.g. ["python", "train.py"]')
    return tuple(words)


def _drop_source(args: list[str]) -> list[str]:
    """The env-derived flags without the data source (`_env_argv` writes it as --data-uri=URI)."""
    return [a for a in args if a != "--synthetic" and not a.startswith("--data-uri=")]


def normalize_uri(uri: str) -> str:
    """`file://./x` and bare paths become absolute `file:///...`; s3:// and gs:// are kept."""
    if re.match(r"^(s3|gs)://[^/]+", uri):
        return uri.rstrip("/")
    if uri.startswith("file://"):
        path = uri[len("file://"):]
    elif "://" in uri:
        raise ConfigError(f"{uri!r}: expected s3://BUCKET/PATH, gs://BUCKET/PATH or file://DIR")
    else:
        path = uri
    if not path:
        raise ConfigError(f"{uri!r}: the file:// URI has no path")
    return "file://" + os.path.abspath(os.path.expanduser(path))


def validate(cfg: TrainConfig) -> None:
    """Reject combinations that cannot work, naming the option."""
    if cfg.command is not None:
        _validate_command(cfg)
        return
    if cfg.model == "digits" and (cfg.synthetic or cfg.data_uri):
        raise ConfigError("--model digits trains on the UCI digits of the checkout: drop "
                          f"{'--synthetic' if cfg.synthetic else '--data-uri'}")
    if cfg.synthetic == bool(cfg.data_uri) and not _is_user_model(cfg.model) and cfg.model != "digits":
        raise ConfigError("choose the data: --synthetic or --data-uri URI (TRAINSTACK_SYNTHETIC=1 / TRAINSTACK_DATA_URI)")
    if cfg.data_uri:
        object.__setattr__(cfg, "data_uri", normalize_uri(cfg.data_uri))
    if cfg.validation_data_uri:
        object.__setattr__(cfg, "validation_data_uri", normalize_uri(cfg.validation_data_uri))
    if cfg.keep_best is not None:
        keep_best_mode(cfg.keep_best)
    if cfg.code_dir is not None:
        path = os.path.abspath(os.path.expanduser(cfg.code_dir))
        if not os.path.isdir(path):
            raise ConfigError(f"--code-dir {cfg.code_dir!r}: no such folder (the folder holding your model's modules)")
        object.__setattr__(cfg, "code_dir", path)
    if cfg.model not in ("mlp", "transformer-lm", "digits") and not _is_user_model(cfg.model):
        raise ConfigError(f"--model {cfg.model!r}: expected mlp, transformer-lm, digits or package.module:function")
    if cfg.checkpoint_every_steps is None and cfg.checkpoint_every_seconds is None:
        raise ConfigError("set --checkpoint-every-steps or --checkpoint-every-seconds (or both)")
    if cfg.lease_ttl_s <= 15:
        raise ConfigError(f"--lease-ttl-s {cfg.lease_ttl_s:g} is too short: it must exceed 15 s "
                          "(the holder stops trusting its lease 10 s before it ends; renewals need time)")
    if cfg.lm_dim % cfg.lm_heads:
        raise ConfigError(f"--lm-dim {cfg.lm_dim} must be a multiple of --lm-heads {cfg.lm_heads}")


def _validate_command(cfg: TrainConfig) -> None:
    """Script mode: the command's program exists, and no option of the trainer's own loop is set."""
    if cfg.model != TrainConfig.model:
        raise ConfigError(f"--model {cfg.model!r} (run.model) cannot be combined with a command (run.command): "
                          "the command trains its own model; drop one of them")
    if cfg.synthetic or cfg.data_uri:
        raise ConfigError("--synthetic / --data-uri (run.synthetic / run.dataUri) cannot be combined with a command "
                          "(run.command): the command reads its own data; drop one of them")
    _refuse_loop_options(cfg)
    if cfg.validation_data_uri or cfg.eval_every_steps or cfg.keep_best:
        raise ConfigError("--validation-data-uri / --eval-every-steps / --keep-best (run.validationDataUri / "
                          "run.evalEverySteps / run.keepBest) cannot be combined with a command (run.command): the "
                          "command evaluates its own model (Keras validation_data); drop them")
    folder = os.path.abspath(os.path.expanduser(cfg.code_dir)) if cfg.code_dir is not None else os.getcwd()
    if not os.path.isdir(folder):
        raise ConfigError(f"--code-dir {cfg.code_dir!r}: no such folder (the folder the command runs in)")
    object.__setattr__(cfg, "code_dir", folder)
    missing = command_problem(cfg.command, folder)
    if missing:
        raise ConfigError(f"command (run.command) {list(cfg.command)!r}: {missing}")


# The trainer loop's own options, which a command never reads (its script decides them), with the
# stack key that sets each (run.steps, run.batchSize) or "extraArgs" for those only flags set.
LOOP_ONLY = {
    "steps": ("run.steps", "the script decides its own steps (model.fit's epochs)"),
    "batch_size": ("run.batchSize", "the script batches its own data"),
    "checkpoint_every_steps": ("run.checkpointEverySteps",
                               "fit.callbacks() commits at each epoch's end and every --checkpoint-every-seconds"),
    "learning_rate": ("extraArgs", "the script builds its own optimizer"),
    "precision": ("extraArgs", "the script sets its own precision policy"),
    "xla": ("extraArgs", "the script compiles its own model (jit_compile)"),
    "grad_accum": ("extraArgs", "the script builds its own train step"),
    "steps_per_call": ("extraArgs", "the script compiles its own model (steps_per_execution)"),
    "log_every": ("extraArgs", "fit.callbacks() writes TensorBoard at each epoch"),
    "data_wait_s": ("extraArgs", "the script reads its own data"),
    "data_state_max_mb": ("extraArgs", "the script reads its own data"),
    "input_priority": ("extraArgs", "the script runs its own input pipeline"),
    **{f"lm_{k}": ("extraArgs", "it is a key of the built-in transformer-lm model")
       for k in ("layers", "dim", "heads", "seq_len", "vocab", "tied")},
}


def _refuse_loop_options(cfg: TrainConfig) -> None:
    """Script mode: an option of the trainer's own loop set to anything but its default (and not
    switched off) would be ignored in silence; refused in one line naming it."""
    defaults = TrainConfig(run_uri="")
    for name, (key, why) in LOOP_ONLY.items():
        value = getattr(cfg, name)
        if value is None or value is False or value == getattr(defaults, name):
            continue
        flag = "--" + name.replace("_", "-")
        where = f"{flag} ({key}, {environment.option_env(name)})" if key != "extraArgs" else f"{flag} (run.extraArgs)"
        raise ConfigError(f"{where} = {value!r} does not apply to a command (run.command): {why}; drop it")


# A command's program that is the interpreter running the trainer (trainer/script.py: child_command).
SELF_PYTHON = ("python", "python3")


def command_problem(command: Sequence[str], folder: str, *, look_up: bool = True) -> str | None:
    """Why `command` cannot start in `folder` (its program, or the script a Python program is
    given, is missing), or None. A program without a slash is looked up on PATH (unless not
    `look_up`: the stack cannot see the image's PATH)."""
    program = command[0]
    if "/" in program:
        full = os.path.join(folder, program)
        if not (os.path.isfile(full) and os.access(full, os.X_OK)):
            return f"program {program!r} is not an executable file in {folder}"
    elif look_up and program not in SELF_PYTHON and shutil.which(program) is None:
        return f"program {program!r} is not found on PATH ({os.environ.get('PATH', '')})"
    script = python_script(command)
    if script is not None and not os.path.isfile(os.path.join(folder, script)):
        return f"script {script!r} is not in {folder}"
    return None


def python_script(command: Sequence[str]) -> str | None:
    """The script a `python[3[.N]] [options] script.py ...` command runs (None for `-m`/`-c` or another program)."""
    if not re.fullmatch(r"python(3(\.\d+)?)?", os.path.basename(command[0])):
        return None
    for word in command[1:]:
        if word in ("-m", "-c"):
            return None
        if not word.startswith("-"):
            return word if word.endswith(".py") else None
    return None


# --keep-best: a validation metric's name, and optionally its direction.
KEEP_BEST_RE = re.compile(r"(val_[A-Za-z0-9_]+)(?::(min|max))?")


def keep_best_mode(text: str) -> tuple[str, str]:
    """`val_accuracy` → ("val_accuracy", "max"); `val_loss` → ("val_loss", "min"); `val_x:min` → ("val_x", "min").

    Without a direction, a name with `loss` or `error` in it (val_loss, val_mean_squared_error)
    is minimized and anything else (accuracy, auc, precision) maximized, as Keras's
    `ModelCheckpoint(mode="auto")` does for the common metrics.
    """
    m = KEEP_BEST_RE.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"--keep-best {text!r} (run.keepBest): expected a validation metric val_<name>, optionally "
                          "with :min or :max, e.g. val_accuracy or val_loss")
    name, mode = m.group(1), m.group(2)
    if mode is None:
        mode = "min" if ("loss" in name or "error" in name) else "max"
    return name, mode


def _is_user_model(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", name))


def as_dict(cfg: TrainConfig) -> dict:
    """The config as plain JSON-able data (for the `started` event)."""
    return dataclasses.asdict(cfg)
