"""components/userdata.py's values one by one: the env file's entries, the env file's own entry in
the document, the size limit's edge, and the Pulumi output that renders the document once the
bucket, code and image are known."""

from __future__ import annotations

import base64
import contextvars
import gzip

import pulumi
import pytest
import yaml

from components import userdata
from components.userdata import ENV_FILE, boot_env, encode_user_data, render_user_data, user_data_output
from devtools.sandbox import settings_for


def _env(**run):
    return boot_env(settings_for("aws", **run), run_uri="s3://b/runs/r", group="g", code_uri="s3://b/code/c.tar.gz",
                    boot_uri="s3://b/code/boot-0123456789abcdef.tar.gz")


def test_the_env_file_carries_the_runs_and_the_machines_values():
    env = _env(steps=40, batchSize=16, keepCheckpoints=4, model="mlp", seed=7)
    price = {k: env.pop(k) for k in ("TRAINSTACK_PRICE_PER_HOUR", "TRAINSTACK_PRICE_NOTE")}
    assert env == {
        "TRAINSTACK_CLOUD": "aws", "TRAINSTACK_REGION": "us-east-1", "TRAINSTACK_PLACEMENT": "aws us-east-1",
        "TRAINSTACK_RUN_URI": "s3://b/runs/r",
        "TRAINSTACK_GROUP": "g", "TRAINSTACK_IMAGE": "tensorflow/tensorflow:2.21.0-gpu",
        "TRAINSTACK_CODE_URI": "s3://b/code/c.tar.gz", "TRAINSTACK_BOOT_URI": "s3://b/code/boot-0123456789abcdef.tar.gz",
        "TRAINSTACK_MAX_RUNTIME_S": "3600", "TRAINSTACK_NODES": "1",
        "TRAINSTACK_GPUS_PER_NODE": "1", "TRAINSTACK_NOTICE_GRACE_S": "100", "TRAINSTACK_POLL_S": "5",
        "TRAINSTACK_MAX_FAILURES": "3", "TRAINSTACK_MODEL": "mlp", "TRAINSTACK_STEPS": "40",
        "TRAINSTACK_BATCH_SIZE": "16", "TRAINSTACK_KEEP_CHECKPOINTS": "4", "TRAINSTACK_SEED": "7",
        "TRAINSTACK_SYNTHETIC": "1", "TRAINSTACK_CHECKPOINT_EVERY_STEPS": "20",
        "TRAINSTACK_CHECKPOINT_EVERY_SECONDS": "600"}
    assert float(price["TRAINSTACK_PRICE_PER_HOUR"]) > 0 and price["TRAINSTACK_PRICE_NOTE"]


def test_the_env_file_names_the_data_and_the_users_command_when_the_stack_has_them():
    env = _env(synthetic=False, dataUri="s3://data-bkt/x", checkpointEverySteps=None, checkpointEverySeconds=300)
    assert (env["TRAINSTACK_DATA_URI"], env["TRAINSTACK_CHECKPOINT_EVERY_SECONDS"]) == ("s3://data-bkt/x", "300")
    # A null cadence is off: the trainer's 0, not a missing key its own default would fill.
    assert "TRAINSTACK_SYNTHETIC" not in env and env["TRAINSTACK_CHECKPOINT_EVERY_STEPS"] == "0"
    env = _env(checkpointEverySteps=50, checkpointEverySeconds=None)
    assert (env["TRAINSTACK_CHECKPOINT_EVERY_STEPS"], env["TRAINSTACK_CHECKPOINT_EVERY_SECONDS"]) == ("50", "0")
    env = _env(synthetic=False, code="examples/keras-fit", command=["python", "train.py"])
    assert {k: env[k] for k in ("TRAINSTACK_CODE_DIR", "TRAINSTACK_COMMAND", "TRAINSTACK_STOP_GRACE_S")} == {
        "TRAINSTACK_CODE_DIR": userdata.USER_CODE_DIR, "TRAINSTACK_COMMAND": '["python", "train.py"]',
        "TRAINSTACK_STOP_GRACE_S": "90"}


def test_the_env_file_names_the_validation_set_the_cadence_and_the_best_only_when_set():
    env = _env(validationDataUri="s3://data-bkt/val", evalEverySteps=250, keepBest="val_accuracy")
    assert {k: env[k] for k in ("TRAINSTACK_VALIDATION_DATA_URI", "TRAINSTACK_EVAL_EVERY_STEPS",
                                "TRAINSTACK_KEEP_BEST")} == {
        "TRAINSTACK_VALIDATION_DATA_URI": "s3://data-bkt/val", "TRAINSTACK_EVAL_EVERY_STEPS": "250",
        "TRAINSTACK_KEEP_BEST": "val_accuracy"}
    # Unset (the stack's defaults), none is in the file: the trainer's defaults, which are the same, apply.
    env = _env()
    assert not {"TRAINSTACK_VALIDATION_DATA_URI", "TRAINSTACK_EVAL_EVERY_STEPS", "TRAINSTACK_KEEP_BEST"} & set(env)


def test_the_env_files_own_entry_is_roots_and_readable():
    doc = yaml.safe_load(render_user_data("aws", _env()))
    entry = doc["write_files"][0]
    assert {k: v for k, v in entry.items() if k != "content"} == {"path": ENV_FILE, "permissions": "0644",
                                                                  "owner": "root:root"}
    assert "TRAINSTACK_RUN_URI='s3://b/runs/r'" in entry["content"]


def test_an_env_lacking_keys_is_refused_naming_them():
    env = _env()
    del env["TRAINSTACK_RUN_URI"], env["TRAINSTACK_GROUP"]
    with pytest.raises(ValueError, match="^user data env lacks TRAINSTACK_RUN_URI, TRAINSTACK_GROUP$"):
        render_user_data("aws", env)


def test_the_size_limit_is_inclusive(monkeypatch):
    text = render_user_data("aws", _env())
    size = len(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    monkeypatch.setattr(userdata, "AWS_USER_DATA_LIMIT", size)
    assert gzip.decompress(base64.b64decode(encode_user_data(text))).decode() == text
    monkeypatch.setattr(userdata, "AWS_USER_DATA_LIMIT", size - 1)
    with pytest.raises(ValueError, match=f"^user data is {size} bytes gzipped; EC2 takes at most {size - 1}$"):
        encode_user_data(text)


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args):
        return [f"{args.name}-id", args.inputs]

    def call(self, args):
        return {}


def test_the_output_renders_once_the_bucket_code_and_image_are_known():
    settings = settings_for("aws")
    seen: list[str] = []

    def run() -> None:
        pulumi.runtime.set_mocks(_Mocks(), project="trainstack", stack="unit", preview=False)

        @pulumi.runtime.test
        def rendered():
            out = user_data_output("aws", settings, group="grp", run_uri=pulumi.Output.from_input("s3://b/runs/r"),
                                   code_uri=pulumi.Output.from_input("s3://b/code/c.tar.gz"),
                                   boot_uri=pulumi.Output.from_input("s3://b/code/boot-0123456789abcdef.tar.gz"),
                                   image_ref=pulumi.Output.from_input("repo/img@sha256:abc"))
            return out.apply(seen.append)

        rendered()

    contextvars.copy_context().run(run)
    assert len(seen) == 1  # the apply ran
    expected = _env()
    expected["TRAINSTACK_GROUP"] = "grp"
    expected["TRAINSTACK_IMAGE"] = "repo/img@sha256:abc"
    assert seen[0] == render_user_data("aws", expected)


def test_a_short_notice_still_leaves_the_users_command_five_seconds(monkeypatch):
    monkeypatch.setitem(userdata.NOTICE_GRACE_S, "aws", 12)
    env = _env(synthetic=False, code="examples/keras-fit", command=["python", "train.py"])
    assert env["TRAINSTACK_STOP_GRACE_S"] == "5"


def test_the_env_file_refuses_only_line_breaks_and_nuls():
    assert userdata.render_env({"A": "X-x'y \\t$", "B": ""}) == "A='X-x'\\''y \\t$'\nB=''\n"
    for bad in ("a\nb", "a\rb", "a\x00b"):
        with pytest.raises(ValueError, match="^A: value may not contain newlines"):
            userdata.render_env({"A": bad})
