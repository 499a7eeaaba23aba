"""`ops synth`: the CLI end to end (subprocess) and the in-process `synthesize` API."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ops import synth

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"type", "name", "parent", "inputs", "options"}
OPTION_KEYS = {"retainOnDelete", "protect", "ignoreChanges", "deleteBeforeReplace", "provider"}


def run_cli(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PULUMI_"))}
    return subprocess.run(
        [sys.executable, "-m", "ops", "synth", *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.slow
def test_cli_writes_resources_outputs_and_valid_user_data(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("--stack", "dev", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    resources = json.loads((out / "resources.json").read_text())
    assert len(resources) == 25
    assert all(set(r) == KEYS and set(r["options"]) >= OPTION_KEYS for r in resources)
    bucket = [r for r in resources if r["type"] == "aws:s3/bucket:Bucket"]
    assert len(bucket) == 1 and bucket[0]["options"]["retainOnDelete"] is True
    outputs = json.loads((out / "outputs.json").read_text())
    assert outputs["runUri"] == f"s3://{outputs['bucketName']}/runs/dev"
    files = sorted((out / "user-data").iterdir())
    assert [f.name for f in files] == ["trainstack-group-lt.yaml"]
    text = files[0].read_text()
    assert text.startswith("#cloud-config\n")
    assert yaml.safe_load(text)["write_files"][0]["path"] == "/etc/trainstack/env"
    schema = subprocess.run(["cloud-init", "schema", "--config-file", str(files[0])],
                            capture_output=True, text=True, timeout=60)
    assert schema.returncode == 0, schema.stdout + schema.stderr
    assert "Valid" in schema.stdout


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda c: c["trainstack:compute"].update(instanceTypes=["g5.xlarg"]), "trainstack:compute.instanceTypes[0]"),
        (lambda c: c["trainstack:image"].update(tag="latest"), "trainstack:image.tag"),
        (lambda c: c.update({"trainstack:regoin": "us-east-1"}), "trainstack:regoin"),
    ],
)
def test_cli_bad_stack_exits_2_with_one_line_and_writes_nothing(tmp_path, edit, key):
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    edit(doc["config"])
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.broken.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "never"
    proc = run_cli("--stack", "broken", "--out", str(out), "--stacks-dir", str(stacks))
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(key + ":")
    assert proc.stdout == ""
    assert not out.exists()


def test_cli_unknown_stack_exits_2(tmp_path):
    proc = run_cli("--stack", "nope", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "Pulumi.nope.yaml" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_cli_unknown_stack_lists_the_stacks_there_are(tmp_path, capsys):
    from ops.__main__ import main

    stacks = tmp_path / "stacks"
    stacks.mkdir()
    for name in ("prod", "dev"):
        (stacks / f"Pulumi.{name}.yaml").write_text((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    assert main(["synth", "--stack", "dve", "--out", str(tmp_path / "o"), "--stacks-dir", str(stacks)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Pulumi.dve.yaml" in err and err.rstrip().endswith("stacks there: dev, prod")
    assert not (tmp_path / "o").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["synth", "--stack", "dev", "--out", str(tmp_path / "o"), "--stacks-dir", str(empty)]) == 2
    assert "there is no stack file there" in capsys.readouterr().err


def test_synthesize_runs_repeatedly_without_state_leaking_between_runs():
    dev = ROOT / "stacks" / "Pulumi.dev.yaml"
    large = ROOT / "stacks" / "Pulumi.large.yaml"
    runs = [synth.synthesize(p) for p in (dev, large, dev)]
    assert [len(r.resources) for r in runs] == [25, 26, 25]  # large: 2 nodes, + a cluster placement group
    assert [r.outputs["region"] for r in runs] == ["us-east-1", "us-west-2", "us-east-1"]
    assert runs[0].outputs == runs[2].outputs
    # Same stack, same resources; only the cap's start time follows the clock.
    assert without_start_time(runs[0]) == without_start_time(runs[2])
    assert without_start_time(runs[0]) != without_start_time(runs[1])
    assert runs[1].outputs["runUri"].endswith("/runs/lm-large")


def without_start_time(result):
    return [{**r, "inputs": {k: v for k, v in r["inputs"].items() if k != "startTime"}} for r in result.resources]


def test_synthesize_refuses_bad_raw_settings_before_running():
    with pytest.raises(synth.config.ConfigError, match=r"^trainstack:compute\.nodes: 0: "):
        synth.synthesize({"region": "us-east-1", "run": {"synthetic": True}, "compute": {"nodes": 0}})


def test_fake_lookups_are_well_formed_and_obviously_fake():
    r = synth.synthesize(ROOT / "stacks" / "Pulumi.dev.yaml")
    tokens = sorted({i["token"] for i in r.invokes})
    assert tokens == [
        "aws:ec2/getAmi:getAmi", "aws:ec2/getSubnets:getSubnets", "aws:ec2/getVpc:getVpc",
        "aws:index/getCallerIdentity:getCallerIdentity", "aws:index/getPartition:getPartition",
    ]
    lt = r.of_type("aws:ec2/launchTemplate:LaunchTemplate")[0]["inputs"]
    assert lt["imageId"] == synth.FAKE_AMI == "ami-0123456789abcdef0"
    assert r.outputs["bucketName"].startswith("trainstack-dev-")
    policy = json.loads(r.of_type("aws:iam/rolePolicy:RolePolicy")[0]["inputs"]["policy"])
    assert any(":123456789012:" in str(s["Resource"]) for s in policy["Statement"])


def test_write_creates_the_contract_layout(tmp_path):
    r = synth.synthesize(ROOT / "stacks" / "Pulumi.large.yaml")
    written = synth.write(r, tmp_path / "o")
    rel = sorted(str(p.relative_to(tmp_path / "o")) for p in written)
    assert rel == ["outputs.json", "resources.json", "user-data/trainstack-group-lt.yaml"]
    assert json.loads((tmp_path / "o" / "resources.json").read_text()) == r.resources


def test_cli_parses_and_validates_the_stack_file_once(tmp_path, monkeypatch):
    """`ops synth` reads the stack file and validates its settings once, then runs the program with them."""
    from ops.__main__ import main

    calls = {"read": 0, "validate": 0, "run": []}
    read, load = synth.config.read_stack_file, synth.config.load_settings

    def counted_read(*a, **k):
        calls["read"] += 1
        return read(*a, **k)

    def counted_load(*a, **k):
        calls["validate"] += 1
        return load(*a, **k)

    def fake_run(sdk_config, *, stack, region, gcp_project=""):
        calls["run"].append((stack, region, sdk_config["trainstack:region"]))
        return synth.Result(resources=[], outputs={}, user_data={})

    monkeypatch.setattr(synth.config, "read_stack_file", counted_read)
    monkeypatch.setattr(synth.config, "load_settings", counted_load)
    monkeypatch.setattr(synth, "run_program", fake_run)
    assert main(["synth", "--stack", "large", "--out", str(tmp_path / "o")]) == 0
    assert calls == {"read": 1, "validate": 1, "run": [("large", "us-west-2", "us-west-2")]}


def test_settings_and_policy_share_one_definition_of_secrets_and_defaults():
    """The neutral module is the one both sides import; the policy rules load without pydantic or settings."""
    from components import config_shared
    from components.settings import schema
    from policy import rules

    assert rules.secret_kind is config_shared.secret_kind
    assert rules.SECRET_PATTERNS is config_shared.SECRET_PATTERNS
    assert schema.ComputeSettings.model_fields["spot"].default is config_shared.DEFAULT_SPOT
    assert schema.StorageSettings.model_fields["keep_on_destroy"].default is config_shared.DEFAULT_KEEP_ON_DESTROY
    code = ("import sys; from policy import rules; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pulumi') or m.startswith('components.settings')); "
            "print(bad); assert not bad, bad; assert rules.RULES")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow
def test_cli_ends_with_a_plan_of_resources_machines_and_cost(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("--stack", "large", "--out", str(out), "--offline")
    assert proc.returncode == 0, proc.stderr
    plan = proc.stdout.split("Plan for stack large", 1)[1]
    # what is created, by type, with the fake cloud's values marked
    assert "Resources (26), by type:" in plan  # 2 nodes: with a cluster placement group
    assert "1 x aws:ec2/launchTemplate:LaunchTemplate: trainstack-group-lt" in plan
    assert f"imageId={synth.FAKE_AMI} (mock)" in plan
    # machines x nodes, each type's price, expected and worst case under the 72 h cap
    assert "Machines: 2 nodes x 8 GPU, spot, one of: p4d.24xlarge" in plan
    assert "spot $13.11/h (estimate)" in plan
    assert "Expected: $26.22/h for 2 nodes (spot: estimated" in plan
    assert "Worst case: $65.55/h (the on-demand price x 2 nodes) until the runtime cap (72 h): $4,719.25" in plan
    assert "recorded 2026-11-30" in plan
    # the files the contract names are unchanged by the plan
    written = synth.Result(resources=json.loads((out / "resources.json").read_text()), outputs={}, user_data={})
    assert without_start_time(written) == without_start_time(synth.synthesize(ROOT / "stacks" / "Pulumi.large.yaml"))


@pytest.mark.slow
def test_plan_uses_ec2_spot_prices_when_aws_answers():
    from moto import mock_aws

    dev = synth.load_source(ROOT / "stacks" / "Pulumi.dev.yaml")
    result = synth.synthesize(dev)
    with mock_aws():
        plan = synth.plan(result, dev.settings)
    assert "spot $0.00001/h (price API)" in plan
    assert "(spot: the cloud's current prices)" in plan
    offline = synth.plan(result, dev.settings, ask_prices=False)
    assert "(estimate)" in offline and "(price API)" not in offline


def test_gcp_plan_prices_the_stack_and_marks_only_invented_values():
    gcp_dev = synth.load_source(ROOT / "stacks" / "Pulumi.gcp-dev.yaml")
    plan = synth.plan(synth.synthesize(gcp_dev), gcp_dev.settings)
    assert "Plan for stack gcp-dev (gcp, us-central1)" in plan
    assert "Machines: 1 node x 1 GPU, spot, one of: g2-standard-4, g2-standard-8" in plan
    assert "g2-standard-8  on-demand $0.853624/h  spot $0.34145/h (estimate)" in plan
    assert "Worst case: $0.853624/h (the on-demand price x 1 node) until the runtime cap (10 h): $8.54\n" in plan
    # what the run's checkpoints take in the bucket (components.storage): 3 kept, pruned ones gone within a day
    assert "Checkpoint storage: one checkpoint 1.0 GiB (assumed; scale every figure by your checkpoint's size); " \
           "3 kept (3.0 GiB); at most 80 written, up to 144 a day" in plan
    assert "pruned checkpoints stop billing within 1 day(s); GCS parallel-upload parts of each checkpoint count " \
           "once more: at most 157.0 GiB of them at once, 160.0 GiB in all while the run checkpoints, 3.0 GiB once" in plan
    # gs://<the stack's own bucket>/runs/... is what GCP would answer too: not a mock value
    run_uri = next(line for line in plan.splitlines() if line.strip().startswith("runUri"))
    assert run_uri.rstrip().endswith("/runs/gcp-dev"), run_uri
