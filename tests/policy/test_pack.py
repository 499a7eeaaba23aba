"""The Pulumi policy pack calls the same rules: checked inside its own virtualenv (.venv-policy).

pulumi-policy pins a protobuf TensorFlow cannot share, so the pack has its own virtualenv,
as Pulumi policy packs do anyway. Create it from the project root with:
    python3 -m venv .venv-policy && .venv-policy/bin/pip install -r policy/requirements.txt
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from components.settings import raw_from_stack_file
from ops import synth
from policy import rules

ROOT = Path(__file__).resolve().parents[2]
PACK_PYTHON = ROOT / ".venv-policy" / "bin" / "python"
UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # pulumi-policy's sentinel for an unknown string

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not PACK_PYTHON.exists(),
    reason="no .venv-policy: create it with `python3 -m venv .venv-policy && "
           ".venv-policy/bin/pip install -r policy/requirements.txt`",
)]


def _one(resources: list[dict], type_: str) -> dict:
    found = [r for r in resources if r["type"] == type_]
    assert len(found) == 1, type_
    return found[0]


@pytest.fixture(scope="module")
def pack_report() -> dict:
    stack_file = synth.STACKS_DIR / "Pulumi.dev.yaml"
    clean = synth.synthesize(stack_file).resources
    broken = copy.deepcopy(clean)
    _one(broken, "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]["metadataOptions"]["httpTokens"] = "optional"
    broken.remove(_one(broken, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"))
    role_policy = _one(broken, "aws:iam/rolePolicy:RolePolicy")["inputs"]
    doc = json.loads(role_policy["policy"])
    doc["Statement"][0]["Action"] = "*"
    role_policy["policy"] = json.dumps(doc)
    unknown = copy.deepcopy(clean)
    _one(unknown, "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]["metadataOptions"]["httpTokens"] = UNKNOWN_STRING
    _one(unknown, "aws:s3/bucketPolicy:BucketPolicy")["inputs"]["policy"] = UNKNOWN_STRING
    for r in unknown:
        if r["type"].startswith("aws:s3/bucket") and r["type"] != "aws:s3/bucket:Bucket":
            r["inputs"]["bucket"] = UNKNOWN_STRING
    config = raw_from_stack_file(stack_file)
    # SSH from one CIDR: allowed when the stack's config names it, refused when it names another.
    ssh = copy.deepcopy(clean)
    _one(ssh, "aws:ec2/securityGroup:SecurityGroup")["inputs"]["ingress"] = [
        {"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["203.0.113.0/24"]}]
    allowed = {**config, "access": {"sshPublicKey": "ssh-ed25519 AAAA", "allowedCidrs": ["203.0.113.0/24"]}}
    other = {**config, "access": {"sshPublicKey": "ssh-ed25519 AAAA", "allowedCidrs": ["198.51.100.0/24"]}}
    request = {
        "stack": "dev",
        "config": config,
        "cases": {
            "clean": {"config": config, "resources": clean},
            "broken": {"config": config, "resources": broken},
            "unknown": {"config": config, "resources": unknown},
            "ssh-allowed": {"config": allowed, "resources": ssh},
            "ssh-other": {"config": other, "resources": ssh},
            "other-stack": {"config": config, "resources": clean, "stack": "prod"},
        },
        "process_resources": [_one(broken, "aws:ec2/launchTemplate:LaunchTemplate"), _one(clean, "aws:s3/bucket:Bucket")],
    }
    proc = subprocess.run([str(PACK_PYTHON), str(Path(__file__).with_name("pack_check.py"))], input=json.dumps(request),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_one_policy_per_rule(pack_report):
    policies = dict(pack_report["policies"])
    assert sorted(policies) == sorted(r.id for r in rules.RULES)
    for r in rules.RULES:
        assert policies[r.id] == ("ResourceValidationPolicy" if r.scope == "resource" else "StackValidationPolicy")


def test_clean_stack_passes_the_pack(pack_report):
    assert pack_report["cases"]["clean"] == []


def test_pack_reports_what_the_rules_find(pack_report):
    found = pack_report["cases"]["broken"]
    assert sorted({f[0] for f in found}) == ["bucket-not-public", "iam-least-privilege", "imdsv2-required"]
    by_policy = {f[0]: f for f in found}
    assert by_policy["imdsv2-required"][1].endswith("::trainstack-group-lt")
    assert "httpTokens" in by_policy["imdsv2-required"][2]
    # a stack policy names the resource by its URN too
    assert by_policy["bucket-not-public"][1].endswith("::trainstack-bucket-s3")


def test_unknown_values_pass_during_preview(pack_report):
    assert pack_report["cases"]["unknown"] == []


def test_pack_starts_as_the_engine_starts_it(pack_report):
    proc = pack_report["process"]
    assert proc["name"] == "trainstack"
    assert proc["policies"] == sorted(r.id for r in rules.RULES)
    assert [p for p, _ in proc["verdicts"]["trainstack-group-lt"]] == ["imdsv2-required"]
    assert proc["verdicts"]["trainstack-bucket-s3"] == []


def test_pack_reads_the_stacks_own_config(pack_report):
    assert pack_report["cases"]["ssh-allowed"] == []
    found = pack_report["cases"]["ssh-other"]
    assert [f[0] for f in found] == ["ssh-only-from-allowed"]
    assert "198.51.100.0/24" in found[0][2] and "203.0.113.0/24" in found[0][2]


def test_pack_checks_tags_against_the_stack_it_runs_for(pack_report):
    found = pack_report["cases"]["other-stack"]
    assert found and {f[0] for f in found} == {"tagged"}
    assert all("trainstack-stack=prod" in f[2] for f in found)
