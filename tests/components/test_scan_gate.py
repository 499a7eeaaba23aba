"""The scan gate in the stack (components/scan_gate.py): registered between the push and the machines'
image, with the stack's policy; what it does at `pulumi up` (wait, judge) with a reader standing in for
the cloud; when it judges again; what `ops synth` says of it."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from components import findings, scan_gate
from components.findings import Blocked, Finding, Scan
from ops import synth

DIGEST = "sha256:" + "d" * 64
TODAY = date.today()
ALLOW = {"id": "CVE-2024-3094", "reason": "not reachable: sshd is not in the image",
         "expires": (TODAY + timedelta(days=30)).isoformat()}
STACK = {"region": "us-east-1", "run": {"synthetic": True}}


def _stack(cloud: str, **image):
    extra = {"cloud": cloud, **({"project": "my-proj-123", "region": "us-central1",
                                 "compute": {"instanceTypes": ["g2-standard-8"]}} if cloud == "gcp" else {})}
    return {**STACK, **extra, "image": {"build": True, **image}}


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_machines_get_the_digest_through_the_gate_with_the_stacks_policy(cloud):
    r = synth.synthesize(_stack(cloud, maxSeverity="HIGH", allowFindings=[ALLOW], scanWaitMinutes=45), stack="unit")
    (gate,) = [x for x in r.resources if x["name"] == "trainstack-image-scan-gate"]
    (pushed,) = r.of_type("docker-build:index:Image")
    assert gate["type"] == "pulumi-python:dynamic:Resource" and gate["parent"] == "trainstack-image"
    inputs = {k: v for k, v in gate["inputs"].items() if k != "__provider"}
    assert inputs["cloud"] == cloud and inputs["max_severity"] == "HIGH" and inputs["wait_s"] == 45 * 60
    assert inputs["allow_findings"] == [ALLOW]
    assert inputs["repository_url"] == pushed["inputs"]["tags"][0].rsplit(":", 1)[0]
    assert r.outputs["imageRef"] == f"{inputs['repository_url']}@{inputs['digest']}"
    (text,) = r.user_data.values()
    assert f"TRAINSTACK_IMAGE='{r.outputs['imageRef']}'" in text


def test_without_a_build_there_is_no_gate():
    r = synth.synthesize({**STACK, "cloud": "aws"}, stack="unit")
    assert not [x for x in r.resources if "scan-gate" in x["name"]]


def _props(**kw) -> dict:
    return {"cloud": "aws", "repository_url": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/trainstack/unit",
            "registry_id": "123456789012", "digest": DIGEST, "max_severity": "CRITICAL", "allow_findings": [],
            "wait_s": 60, **kw}


def _reader(*found: Finding):
    return lambda props: (lambda: Scan(done=True, findings=found))


def test_at_pulumi_up_a_critical_finding_blocks_an_allowed_one_passes_and_an_expired_one_blocks_again():
    found = _reader(Finding("CVE-2024-3094", "CRITICAL", "xz-utils"))
    with pytest.raises(Blocked, match="CVE-2024-3094 \\(CRITICAL in xz-utils\\): at or above image.maxSeverity"):
        scan_gate.judge(_props(), reader=found)
    scan_gate.judge(_props(allow_findings=[ALLOW]), reader=found)
    later = TODAY + timedelta(days=31)
    with pytest.raises(Blocked, match=r"image.allowFindings\[0\] expired on"):
        scan_gate.judge(_props(allow_findings=[ALLOW]), today=later, reader=found)


def test_the_aws_reader_asks_the_home_repositorys_region_and_registry(monkeypatch):
    import boto3

    from components.aws import scan

    asked = {}
    monkeypatch.setattr(boto3, "client", lambda service, region_name, config: asked.update(service=service, region=region_name) or "c")
    monkeypatch.setattr(scan, "read", lambda client, **kw: asked.update(kw) or Scan(done=True))
    scan_gate._reader(_props())()
    assert asked == {"service": "ecr", "region": "eu-west-1", "registry_id": "123456789012",
                     "repository": "trainstack/unit", "digest": DIGEST}


def test_the_gate_judges_again_when_the_digest_the_policy_or_the_day_changes():
    gate = scan_gate._Gate()
    old = {**_props(), "judged_on": TODAY.isoformat()}
    assert not gate.diff("id", old, _props()).changes
    assert gate.diff("id", old, _props(digest="sha256:" + "e" * 64)).changes
    assert gate.diff("id", old, _props(allow_findings=[ALLOW])).changes
    assert gate.diff("id", {**old, "judged_on": (TODAY - timedelta(days=1)).isoformat()}, _props()).changes


def test_synth_says_what_the_gate_will_judge_and_which_exception_has_expired():
    source = synth.load_source(_stack("aws", allowFindings=[ALLOW]))
    lines = synth.image_lines(synth.synthesize(source), source.settings)
    assert lines[-3].startswith("image.build: the machines run the pushed image by its digest, built FROM the one above, "
                                "once ECR's scan of it has no finding at or above image.maxSeverity CRITICAL")
    assert lines[-2].startswith("image.build: then signed by the AWS KMS key trainstack-signing-key (ECDSA P-256; "
                                "the deployer alone may sign) as cosign does, at the digest's sha256-<hex>.sig tag in "
                                "1 repository (trainstack-image-signature)")
    assert lines[-1] == f"image.allowFindings[0]: CVE-2024-3094 until {ALLOW['expires']} ({ALLOW['reason']})"
    expired = findings.allowance_lines([scan_gate._allowed({"allow_findings": [ALLOW]})[0]], TODAY + timedelta(days=40))
    assert expired == [f"image.allowFindings[0]: CVE-2024-3094 EXPIRED on {ALLOW['expires']}: blocks like any finding "
                       f"({ALLOW['reason']})"]


def test_a_gcp_stack_that_builds_turns_on_the_scanning_its_gate_reads_and_one_that_does_not_leaves_it():
    def services(r) -> set[str]:
        return {x["inputs"]["service"] for x in r.of_type("gcp:projects/service:Service")}

    built = services(synth.synthesize(_stack("gcp"), stack="unit"))
    plain = services(synth.synthesize({k: v for k, v in _stack("gcp").items() if k != "image"}, stack="unit"))
    assert {"containerscanning.googleapis.com", "containeranalysis.googleapis.com"} <= built
    assert not {"containerscanning.googleapis.com", "containeranalysis.googleapis.com"} & plain
    assert "artifactregistry.googleapis.com" in plain


def test_the_gcp_reader_asks_the_repositorys_project_with_the_deployers_credentials(monkeypatch):
    import google.auth

    from components.gcp import scan

    asked = {}
    monkeypatch.setattr(google.auth, "default", lambda scopes: (asked.update(scopes=scopes) or "creds", "p"))
    monkeypatch.setattr(scan, "client", lambda credentials: asked.update(credentials=credentials) or "api")
    monkeypatch.setattr(scan, "read", lambda api, **kw: asked.update(api=api, **kw) or Scan(done=True))
    url = "us-central1-docker.pkg.dev/my-proj-123/trainstack-unit/trainer"
    scan_gate._reader(_props(cloud="gcp", repository_url=url, registry_id=""))()
    assert asked == {"scopes": ["https://www.googleapis.com/auth/cloud-platform"], "credentials": "creds", "api": "api",
                     "project": "my-proj-123", "repository_url": url, "digest": DIGEST}
