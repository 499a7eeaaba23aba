"""The trainer's config: flags, TRAINSTACK_* variables, their precedence and clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.helpers import REPO, trainer_env
from trainer.config import ConfigError, load_config

BASE = {"TRAINSTACK_RUN_URI": "s3://bucket/runs/a", "TRAINSTACK_SYNTHETIC": "1"}


def test_env_file_names_from_boot_env_configure_the_trainer():
    # Exactly what components/userdata.py: boot_env writes for a run.
    env = {
        **BASE,
        "TRAINSTACK_CLOUD": "aws",  # boot-only keys are ignored by the trainer
        "TRAINSTACK_GROUP": "g",
        "TRAINSTACK_MODEL": "transformer-lm",
        "TRAINSTACK_STEPS": "123",
        "TRAINSTACK_BATCH_SIZE": "16",
        "TRAINSTACK_KEEP_CHECKPOINTS": "5",
        "TRAINSTACK_SEED": "7",
        "TRAINSTACK_CHECKPOINT_EVERY_STEPS": "10",
        "TRAINSTACK_CHECKPOINT_EVERY_SECONDS": "30",
        "TRAINSTACK_EXTRA_ARGS": "--grad-accum 2 --lm-dim 32 --deterministic",
    }
    cfg = load_config([], env)
    got = (cfg.run_uri, cfg.model, cfg.steps, cfg.batch_size, cfg.keep_checkpoints, cfg.seed,
           cfg.checkpoint_every_steps, cfg.checkpoint_every_seconds, cfg.grad_accum, cfg.lm_dim, cfg.deterministic)
    assert got == ("s3://bucket/runs/a", "transformer-lm", 123, 16, 5, 7, 10, 30.0, 2, 32, True)
    assert cfg.per_step_batch == 32


def test_flags_beat_extra_args_beat_env():
    env = {**BASE, "TRAINSTACK_STEPS": "100", "TRAINSTACK_EXTRA_ARGS": "--steps 200 --seed 4", "TRAINSTACK_SEED": "1"}
    assert (load_config([], env).steps, load_config([], env).seed) == (200, 4)
    assert load_config(["--steps", "300"], env).steps == 300
    # A data source on the command line replaces the one in the environment.
    cfg = load_config(["--data-uri", "gs://b/data"], env)
    assert (cfg.synthetic, cfg.data_uri) == (False, "gs://b/data")


def test_file_uri_and_bare_path_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(["--run-uri", "file://./runs/demo", "--synthetic"], {}).run_uri == f"file://{tmp_path}/runs/demo"
    assert load_config(["--run-uri", "runs/x", "--synthetic"], {}).run_uri == f"file://{tmp_path}/runs/x"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"TRAINSTACK_SYNTHETIC": "1"}, "--run-uri"),
        (["--run-uri", "s3://b/r"], {}, "--synthetic or --data-uri"),
        (["--run-uri", "ftp://h/r", "--synthetic"], {}, "expected s3://"),
        (["--run-uri", "s3://b/r", "--synthetic", "--model", "bert"], {}, "--model 'bert'"),
        (["--run-uri", "s3://b/r", "--synthetic", "--checkpoint-every-steps", "0", "--checkpoint-every-seconds", "0"],
         {}, "--checkpoint-every-steps"),
        (["--run-uri", "s3://b/r", "--synthetic", "--lm-dim", "30", "--lm-heads", "4"], {}, "multiple of --lm-heads"),
        (["--run-uri", "s3://b/r", "--synthetic", "--keep-best", "accuracy"], {}, "--keep-best 'accuracy' (run.keepBest)"),
        ([], {**BASE, "TRAINSTACK_KEEP_BEST": "val_loss:lowest"}, "expected a validation metric val_<name>"),
        (["--run-uri", "s3://b/r", "--eval-every-steps", "10", "--", "python", "-c", "pass"], {},
         "--eval-every-steps / --keep-best"),
        ([], {**BASE, "TRAINSTACK_SYNTHETIC": "maybe"}, "TRAINSTACK_SYNTHETIC='maybe'"),
        (["--run-uri", "s3://b/r", "--model", "digits", "--synthetic"], {}, "--model digits trains on the UCI digits"),
        (["--run-uri", "s3://b/r", "--model", "digits", "--data-uri", "s3://b/d"], {}, "drop --data-uri"),
        ([], {**BASE, "TRAINSTACK_EXTRA_ARGS": "--seed 'unclosed"}, "TRAINSTACK_EXTRA_ARGS"),
    ],
)
def test_bad_config_is_named(argv, env, message):
    with pytest.raises(ConfigError) as e:
        load_config(argv, env)
    assert message in str(e.value)


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--steps", "ten"], ["--precision", "float8"],
                                  ["--eval-every-steps", "-3"]])
def test_malformed_flag_exits_2(argv):
    with pytest.raises(SystemExit) as e:
        load_config(["--run-uri", "s3://b/r", "--synthetic", *argv], {})
    assert e.value.code == 2


def test_cli_help_and_config_error_exit_codes():
    env = trainer_env()
    h = subprocess.run([sys.executable, "-m", "trainer", "--help"], cwd=REPO, env=env, capture_output=True, text=True)
    assert h.returncode == 0
    for flag in ("--run-uri", "--grad-accum", "--precision", "--checkpoint-every-seconds", "TRAINSTACK_"):
        assert flag in h.stdout
    bad = subprocess.run([sys.executable, "-m", "trainer", "--run-uri", "s3://b/r"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--synthetic or --data-uri" in bad.stderr


@pytest.mark.parametrize(("argv", "line"), [
    (["--stpes", "5"], "python -m trainer: error: unknown option --stpes (did you mean --steps?); see --help"),
    (["--steps", "abc"], "python -m trainer: error: argument --steps: expected a positive integer, got 'abc'; see --help"),
    (["--seed", "-1"], "python -m trainer: error: argument --seed: expected an integer >= 0, got '-1'; see --help"),
    (["--learning-rate", "fast"], "python -m trainer: error: argument --learning-rate: expected a positive number, "
                                  "got 'fast'; see --help"),
    (["--zzz"], "python -m trainer: error: unknown option --zzz; see --help"),
])
def test_a_bad_flag_is_one_line_naming_it(argv, line, capsys):
    with pytest.raises(SystemExit) as e:
        load_config(["--run-uri", "s3://b/r", "--synthetic", *argv], {})
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize(("text", "expected"), [
    ("val_accuracy", ("val_accuracy", "max")), ("val_loss", ("val_loss", "min")),
    ("val_mean_squared_error", ("val_mean_squared_error", "min")), ("val_auc", ("val_auc", "max")),
    ("val_loss:max", ("val_loss", "max")), ("val_accuracy:min", ("val_accuracy", "min")),
])
def test_keep_best_direction_is_by_name_unless_given(text, expected):
    from trainer.config import keep_best_mode

    assert keep_best_mode(text) == expected
    cfg = load_config(["--run-uri", "s3://b/r", "--synthetic", "--keep-best", text, "--eval-every-steps", "0"], {})
    assert (cfg.keep_best, cfg.eval_every_steps) == (text, None)
