"""Every run key of a stack reaches the trainer as the stack says: stack file → `ops synth` →
the machine's env file → the container's environment → the config the trainer records.

The keys come from the schema (`RunSettings.model_fields`), so a new key fails
`test_every_run_key_is_accounted_for` until it says which trainer option it sets (or why it
sets none), and the stacks below must set each key to a value other than its default (null
where the schema allows null), so an env file that drops a key leaves the trainer on its own
default and the comparison fails. `test_dropping_any_run_variable_from_the_env_file_fails_the_comparison`
proves that it does, one variable at a time.

The trainer runs once for real (`python -m trainer` in the container's environment) to show
that the config recorded in the run folder's `started` event is `as_dict(load_config(env))`;
the other stacks compare `load_config` of their container's environment directly. Machine-only
values are moved to this machine first, after checking them: the bucket's run URI to a
`file://` folder (the `runs/<id>` part kept), the code folder on the machine to the project's
folder, and, for the real run, the GPU count to the CPU's 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.machine import ENV_FILE
from components.settings.schema import RunSettings
from components.userdata import USER_CODE_DIR
from ops import synth
from runfolder import layout
from tests.trainer.helpers import REPO, trainer_env
from tests.userdata.helpers import container_env
from trainer.config import ConfigError, TrainConfig, as_dict, build_parser, env_variables, load_config

# One stack per case: together they set every run key to a value other than its default, and to
# null where the schema allows it (run.command excludes run.model/synthetic/dataUri, and the
# two data sources exclude each other, so one stack cannot hold them all).
CASES: dict[str, dict[str, Any]] = {
    "loop": {
        "id": "round-trip-loop", "model": "transformer-lm", "code": None, "command": None, "synthetic": True,
        "dataUri": None, "steps": 6, "batchSize": 4, "checkpointEverySteps": 3,
        "checkpointEverySeconds": 900, "keepCheckpoints": 2, "seed": 7,
        "extraArgs": ["--learning-rate=0.02", "--lm-layers=1", "--log-every=2"],
        "validationDataUri": None, "evalEverySteps": None, "keepBest": None,
    },
    "script": {
        "id": "round-trip-script", "code": "examples/keras-fit", "command": ["python", "train.py", "--epochs", "1"],
        "keras": 2, "checkpointEverySteps": None, "checkpointEverySeconds": 120,
    },
    "data": {
        "id": "round-trip-data", "model": "mlp", "dataUri": "gs://trainstack-data/shards", "dataGrant": False,
        "synthetic": False,
        "checkpointEverySteps": 40, "checkpointEverySeconds": None, "seed": 3,
        "validationDataUri": "gs://trainstack-data/validation", "evalEverySteps": 20, "keepBest": "val_loss:min",
    },
    # Nothing but the data source: every other key takes the schema's default, which must be the trainer's.
    "defaults": {"synthetic": True},
}
# The stacks' clouds and machines (four GPUs each: compute.gpusPerNode reaches the trainer too).
GCP = {"trainstack:cloud": "gcp", "trainstack:region": "us-central1", "trainstack:project": "trainstack-test",
       "trainstack:compute": {"instanceTypes": ["g2-standard-48"], "gpusPerNode": 4}}
AWS = {"trainstack:cloud": "aws", "trainstack:region": "eu-west-1",
       "trainstack:compute": {"instanceTypes": ["g5.12xlarge"], "gpusPerNode": 4}}
CLOUDS = {"data": GCP}  # run.dataGrant is GCP's alone


def _flags(extra_args: list[str]) -> dict[str, Any]:
    """The options `run.extraArgs` set, as the trainer's own parser reads them."""
    parser = build_parser()
    ns = parser.parse_args(extra_args)
    given = {a.split("=", 1)[0] for a in extra_args}
    return {parser._option_string_actions[f].dest: getattr(ns, parser._option_string_actions[f].dest) for f in given}


# Each run key: the trainer options (TrainConfig fields) it sets, from the stack's value (the
# URI and code folder as they are on this machine: see the module's docstring).
TO_TRAINER: dict[str, Callable[[RunSettings, str, Path], dict[str, Any]]] = {
    "id": lambda run, stack, tmp: {"run_uri": f"file://{tmp}/runs/{run.id or stack}"},
    "model": lambda run, stack, tmp: {"model": run.model},
    "code": lambda run, stack, tmp: {"code_dir": str(REPO / run.code) if run.code else None},
    "command": lambda run, stack, tmp: {"command": tuple(run.command) if run.command else None},
    "synthetic": lambda run, stack, tmp: {"synthetic": run.synthetic},
    "data_uri": lambda run, stack, tmp: {"data_uri": run.data_uri},
    "steps": lambda run, stack, tmp: {"steps": run.steps},
    "batch_size": lambda run, stack, tmp: {"batch_size": run.batch_size},
    "checkpoint_every_steps": lambda run, stack, tmp: {"checkpoint_every_steps": run.checkpoint_every_steps},
    "checkpoint_every_seconds": lambda run, stack, tmp: {
        "checkpoint_every_seconds": None if run.checkpoint_every_seconds is None else float(run.checkpoint_every_seconds)},
    "keep_checkpoints": lambda run, stack, tmp: {"keep_checkpoints": run.keep_checkpoints},
    "seed": lambda run, stack, tmp: {"seed": run.seed},
    "validation_data_uri": lambda run, stack, tmp: {"validation_data_uri": run.validation_data_uri},
    "eval_every_steps": lambda run, stack, tmp: {"eval_every_steps": run.eval_every_steps},
    "keep_best": lambda run, stack, tmp: {"keep_best": run.keep_best},
    "extra_args": lambda run, stack, tmp: _flags(run.extra_args),
}
# Run keys that are no trainer option, and where they go instead.
NOT_TRAINER = {
    "data_grant": "the machines' read grant on the dataUri bucket (GCP IAM), made by the stack",
    "keras": "the command's Keras: TF_USE_LEGACY_KERAS=1 in the container's environment, which the command inherits",
}
# Trainer options the env file or the machine sets from something other than a run key: left
# out of the comparison above, so each says where its value comes from instead.
NOT_A_RUN_KEY = {
    "TRAINSTACK_DATA_DIR": "the machine's staging folder, which supervise.sh gives the container",
    "TRAINSTACK_WORK_DIR": "the machine's work folder, which supervise.sh gives the container",
    "TRAINSTACK_STOP_GRACE_S": "script mode: the cloud's notice grace less a margin (components/userdata.py)",
    "TRAINSTACK_PRICE_PER_HOUR": "the price table's figure for compute.instanceTypes (components/pricing.py)",
    "TRAINSTACK_PRICE_NOTE": "where TRAINSTACK_PRICE_PER_HOUR comes from",
    "TRAINSTACK_PLACEMENT": "the cloud and region the machine's placement runs in (components/userdata.py)",
}


def _stack_file(tmp: Path, case: str) -> Path:
    stacks = tmp / "stacks"
    stacks.mkdir(exist_ok=True)
    path = stacks / f"Pulumi.rt-{case}.yaml"
    path.write_text(yaml.safe_dump({"config": {**CLOUDS.get(case, AWS), "trainstack:run": CASES[case]}}))
    return path


def _machine_env_file(path: Path) -> str:
    """The env file the synthesized user data installs (one launch template: one file)."""
    result = synth.synthesize(path)
    (text,) = result.user_data.values()
    (env_file,) = [f["content"] for f in yaml.safe_load(text)["write_files"] if f["path"] == ENV_FILE]
    return env_file


def _here(container: dict[str, str], run: RunSettings, tmp: Path) -> dict[str, str]:
    """The container's environment with its machine-only values moved to this machine (checked first)."""
    env = dict(container)
    bucket_uri, runs, run_id = env["TRAINSTACK_RUN_URI"].rpartition("/runs/")
    assert bucket_uri.startswith(("s3://", "gs://")) and runs, env["TRAINSTACK_RUN_URI"]
    env["TRAINSTACK_RUN_URI"] = f"file://{tmp}/runs/{run_id}"
    if run.code:
        assert env["TRAINSTACK_CODE_DIR"] == USER_CODE_DIR
        env["TRAINSTACK_CODE_DIR"] = str(REPO / run.code)
    env["TRAINSTACK_DATA_DIR"], env["TRAINSTACK_WORK_DIR"] = str(tmp / "stage"), str(tmp / "work")
    return env


def _trainer_variables() -> set[str]:
    """Every variable the trainer reads: `TRAINSTACK_` + each option's name, the extra args, the command."""
    return set(env_variables())


def _differences(cfg: TrainConfig, run: RunSettings, stack: str, tmp: Path) -> list[str]:
    recorded = as_dict(cfg)
    out = []
    for key, wanted in TO_TRAINER.items():
        for field, value in wanted(run, stack, tmp).items():
            if recorded[field] != value:
                out.append(f"run.{RunSettings.model_fields[key].alias} = {getattr(run, key)!r}: "
                           f"the trainer has {field} = {recorded[field]!r}, expected {value!r}")
    return out


def test_every_run_key_is_accounted_for():
    keys = set(RunSettings.model_fields)
    assert keys == set(TO_TRAINER) | set(NOT_TRAINER), (
        f"say which trainer option each run key sets (TO_TRAINER) or why it sets none (NOT_TRAINER): "
        f"unaccounted {sorted(keys - set(TO_TRAINER) - set(NOT_TRAINER))}, "
        f"gone {sorted((set(TO_TRAINER) | set(NOT_TRAINER)) - keys)}")
    assert not set(TO_TRAINER) & set(NOT_TRAINER)


@pytest.mark.parametrize("key", sorted(RunSettings.model_fields))
def test_the_stacks_set_every_run_key_off_its_default_and_to_null_where_allowed(key):
    field = RunSettings.model_fields[key]
    default = field.get_default(call_default_factory=True)
    values = [case[field.alias] for case in CASES.values() if field.alias in case]
    assert any(v is not None and v != default for v in values), f"no stack sets run.{field.alias} off its default"
    if field.is_required() is False and default is None:
        assert None in values, f"no stack sets run.{field.alias} to null"


def test_each_run_default_is_the_trainers():
    """A key the stack leaves out gets the trainer's own default for that option: one definition."""
    defaults, trainer = RunSettings.model_construct(), as_dict(TrainConfig(run_uri=""))
    checked = 0
    for key, wanted in TO_TRAINER.items():
        if key == "id":
            continue  # the run's folder: no default in the trainer
        for field, value in wanted(defaults, "stack", Path("/tmp")).items():
            assert trainer[field] == value, f"run.{RunSettings.model_fields[key].alias}: stack {value!r}, trainer {trainer[field]!r}"
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("case", sorted(set(CASES) - {"loop"}))
def test_a_stacks_run_keys_reach_the_trainers_config(case, tmp_path):
    path = _stack_file(tmp_path, case)
    run = synth.load_source(path, None).settings.run
    env = _here(container_env(_machine_env_file(path), tmp_path), run, tmp_path)
    cfg = load_config([], env=env)
    assert _differences(cfg, run, f"rt-{case}", tmp_path) == []
    assert cfg.gpus_per_node == 4  # compute.gpusPerNode
    # run.keras: the container's environment, which the command inherits (trainer/script.py).
    assert env.get("TF_USE_LEGACY_KERAS") == ("1" if run.keras == 2 else None)


def test_dropping_any_run_variable_from_the_env_file_fails_the_comparison(tmp_path):
    """The comparison is not vacuous: each variable the env file carries for the trainer, left out
    (as an env file that skipped a null or a default would), leaves some stack's trainer with a
    config other than the stack's, or with none; a variable that no run key sets says where it
    comes from instead (NOT_A_RUN_KEY)."""
    trainer_vars = _trainer_variables()
    seen: dict[str, set[str]] = {}  # each variable an env file carries -> the cases whose check sees it go
    for case in CASES:
        tmp = tmp_path / case
        tmp.mkdir()
        path = _stack_file(tmp, case)
        run = synth.load_source(path, None).settings.run
        container = container_env(_machine_env_file(path), tmp)
        env = _here(container, run, tmp)
        assert _differences(load_config([], env=env), run, f"rt-{case}", tmp) == []  # all of it: equal
        for var in sorted(set(container) & trainer_vars):
            seen.setdefault(var, set())
            try:
                cfg = load_config([], env={k: v for k, v in env.items() if k != var})
            except (ConfigError, SystemExit):
                seen[var].add(case)  # the trainer would not start without it
                continue
            if cfg.gpus_per_node != 4 or _differences(cfg, run, f"rt-{case}", tmp):
                seen[var].add(case)
    assert len(seen) >= 20, sorted(seen)  # the run's variables were walked, not an empty env
    assert {var for var, cases in seen.items() if not cases} == set(NOT_A_RUN_KEY), (
        "a variable no stack's check misses is a run key the comparison does not cover (TO_TRAINER), "
        "or one that no run key sets (NOT_A_RUN_KEY)")


@pytest.mark.slow
def test_the_config_the_trainer_records_is_the_stacks(tmp_path):
    path = _stack_file(tmp_path, "loop")
    run = synth.load_source(path, None).settings.run
    env = _here(container_env(_machine_env_file(path), tmp_path), run, tmp_path)
    assert env["TRAINSTACK_GPUS_PER_NODE"] == "4"
    env["TRAINSTACK_GPUS_PER_NODE"] = "0"  # this machine's GPUs: the check would stop the run otherwise
    proc = subprocess.run([sys.executable, "-m", "trainer"], cwd=REPO, env=trainer_env(**env), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = Path(env["TRAINSTACK_RUN_URI"].removeprefix("file://"), layout.EVENTS_KEY).read_text().splitlines()
    (started,) = [e for e in map(json.loads, events) if e.get("event") == layout.STARTED]
    cfg = load_config([], env=env)
    assert started["config"] == json.loads(json.dumps(as_dict(cfg)))  # what it records is what it loaded
    assert _differences(cfg, run, "rt-loop", tmp_path) == []
