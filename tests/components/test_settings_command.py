"""`run.command` (script mode) and a user model that brings its own data: checked before launch,
one line naming the key; a valid stack reaches the machines' env file as the trainer reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.settings import ConfigError, load_settings, usercode
from components.settings.schema import BUILTIN_MODELS
from components.userdata import boot_env, render_env
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _settings(run: dict, **compute):
    raw = {"cloud": "aws", "region": "us-east-1", "run": run}
    if compute:
        raw["compute"] = {"instanceTypes": ["g5.xlarge"], **compute}
    return load_settings(raw, stack="dev")


GOOD = {"code": "examples/keras-fit", "command": ["python", "train.py", "--epochs", "5"]}


def test_a_command_with_its_code_is_accepted_and_reaches_the_trainer():
    s = _settings(GOOD)
    assert s.run.command == ["python", "train.py", "--epochs", "5"]
    env = boot_env(s, run_uri="s3://b/runs/dev", group="g", code_uri="s3://b/code/x.tar.gz")
    assert "TRAINSTACK_SYNTHETIC" not in env and "TRAINSTACK_DATA_URI" not in env
    assert 5 <= int(env["TRAINSTACK_STOP_GRACE_S"]) < 100  # inside docker's stop timeout on AWS
    render_env(env)  # no quote the env file cannot hold
    # The trainer reads the file's values as they are (docker --env-file): script mode, that command.
    folder = ROOT / "examples" / "keras-fit"
    cfg = load_config([], env={**env, "TRAINSTACK_CODE_DIR": str(folder)})
    assert cfg.command == ("python", "train.py", "--epochs", "5") and cfg.code_dir == str(folder)
    assert cfg.stop_grace_s == float(env["TRAINSTACK_STOP_GRACE_S"])


@pytest.mark.parametrize(("run", "compute", "key", "words"), [
    ({"command": ["python", "train.py"]}, {}, "run.command", "needs run.code"),
    ({**GOOD, "model": "mlp2.model:build"}, {}, "run.command", "cannot be combined with run.model"),
    ({**GOOD, "model": "transformer-lm"}, {}, "run.command", "cannot be combined with run.model 'transformer-lm'"),
    ({**GOOD, "synthetic": True}, {}, "run.command", "run.synthetic or run.dataUri"),
    ({**GOOD, "command": ["python", "trian.py"]}, {}, "run.command", "script 'trian.py' is not in"),
    ({**GOOD, "command": ["./run.sh"]}, {}, "run.command", "'./run.sh' is not an executable file"),
    ({**GOOD, "command": []}, {}, "run.command", "is empty"),
    ({**GOOD, "command": ["python", "it's.py"]}, {}, "run.command", "without quotes"),
    (GOOD, {"nodes": 2}, "run.keras", "3 (the default): run.command on compute.nodes 2 needs run.keras: 2 (Keras 3's fit "
                                      "fails under MultiWorkerMirroredStrategy, keras-team/keras#20585)"),
    ({**GOOD, "keras": 3}, {"nodes": 3}, "run.keras", "keras-team/keras#20585"),
    ({**GOOD, "keras": 4}, {}, "run.keras", "expected 2 (tf_keras, TF_USE_LEGACY_KERAS=1) or 3"),
    ({"synthetic": True, "keras": 2}, {}, "run.keras", "applies to run.command only"),
])
def test_bad_commands_are_one_line_naming_the_key(run, compute, key, words):
    with pytest.raises(ConfigError) as e:
        _settings(run, **compute)
    msg = str(e.value)
    assert e.value.key == key and words in msg and "\n" not in msg, msg


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_keras_2_command_runs_on_one_machine_or_several_with_tf_keras(nodes):
    s = _settings({**GOOD, "keras": 2}, nodes=nodes)
    env = boot_env(s, run_uri="s3://b/runs/dev", group="g", code_uri="s3://b/code/x.tar.gz")
    render_env(env)
    # The container's environment, which the command inherits (trainer/script.py): tf.keras is Keras 2.
    assert env["TF_USE_LEGACY_KERAS"] == "1"
    assert env["TRAINSTACK_NODES"] == str(nodes) and "TRAINSTACK_COMMAND" in env


def test_a_keras_3_command_leaves_tf_keras_alone():
    for run in (GOOD, {**GOOD, "keras": 3}):
        env = boot_env(_settings(run), run_uri="s3://b/runs/dev", group="g", code_uri="s3://b/code/x.tar.gz")
        assert "TF_USE_LEGACY_KERAS" not in env


# -- a user model with its own data --


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "trainer").mkdir()
    pkg = tmp_path / "mine" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "own.py").write_text("from trainer.models import ModelSpec\n\ndef make_dataset(b, seed):\n    pass\n\n"
                                "def build():\n    return ModelSpec(model=None, loss=None, make_dataset=make_dataset)\n")
    (pkg / "records.py").write_text("def build():\n    return ModelSpec(model=None, loss=None, parse_tfrecord=p)\n")
    (pkg / "none.py").write_text("def build():\n    return None\n")
    return tmp_path


def test_a_user_model_with_make_dataset_needs_no_data_uri(project):
    assert usercode.validate("mine", "pkg.own:build", BUILTIN_MODELS, root=project, own_data=True) == project / "mine"
    # Given data, a model that reads records is fine too.
    assert usercode.validate("mine", "pkg.records:build", BUILTIN_MODELS, root=project, own_data=False)


@pytest.mark.parametrize(("model", "words"), [
    ("pkg.records:build", "reads TFRecords (parse_tfrecord)"),
    ("pkg.none:build", "names no make_dataset"),
])
def test_a_user_model_without_its_own_data_needs_data_uri(project, model, words):
    with pytest.raises(ConfigError) as e:
        usercode.validate("mine", model, BUILTIN_MODELS, root=project, own_data=True)
    assert e.value.key == "run.dataUri" and words in str(e.value), str(e.value)


def test_the_stack_accepts_an_own_data_model_and_refuses_a_records_one():
    # The image-CNN example reads TFRecords: without dataUri the stack says so.
    with pytest.raises(ConfigError) as e:
        _settings({"code": "examples/image-cnn", "model": "shapes.model:build"})
    assert e.value.key == "run.dataUri" and "parse_tfrecord" in str(e.value)
    # The built-in models still need a source.
    with pytest.raises(ConfigError) as e:
        _settings({"model": "mlp"})
    assert e.value.key == "run.dataUri" and "is required" in str(e.value)


# -- metrics and evaluation --

def test_validation_eval_and_keep_best_reach_the_trainer_as_it_reads_them():
    s = _settings({"dataUri": "s3://data/train/", "validationDataUri": "s3://data/validation/",
                   "evalEverySteps": 500, "keepBest": "val_accuracy"})
    env = boot_env(s, run_uri="s3://b/runs/dev", group="g", code_uri="")
    render_env(env)
    cfg = load_config([], env=env)
    assert (cfg.validation_data_uri, cfg.eval_every_steps, cfg.keep_best) == (
        "s3://data/validation", 500, "val_accuracy")
    bare = load_config([], env=boot_env(_settings({"synthetic": True}), run_uri="s3://b/runs/dev", group="g",
                                        code_uri=""))
    assert (bare.validation_data_uri, bare.eval_every_steps, bare.keep_best) == (None, None, None)
