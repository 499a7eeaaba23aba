"""ECR's DescribeImageScanFindings read into the gate's Scan, and judged: botocore's Stubber checks each
request and each answer against ECR's service model, so a field misspelt here fails the test."""

from __future__ import annotations

from datetime import date

import boto3
import pytest
from botocore.stub import Stubber

from components.aws import scan
from components.findings import Blocked, Finding, judge
from components.settings.schema import AllowedFinding

DIGEST = "sha256:" + "a" * 64
ASK = {"registryId": "123456789012", "repositoryName": "trainstack-dev", "imageId": {"imageDigest": DIGEST}}
TODAY = date(2026, 12, 6)


def _page(status: str, findings=(), enhanced=(), token: str | None = None) -> dict:
    page = {**ASK, "imageScanStatus": {"status": status, "description": "The scan was completed successfully."},
            "imageScanFindings": {"findings": list(findings), "enhancedFindings": list(enhanced)}}
    if token:
        page["nextToken"] = token
    return page


def _basic(cve: str, sev: str, package: str = "openssl") -> dict:
    return {"name": cve, "severity": sev, "uri": f"https://security-tracker.debian.org/tracker/{cve}",
            "attributes": [{"key": "package_name", "value": package}, {"key": "package_version", "value": "3.0.2"}]}


def _read(*answers) -> scan.Scan:
    client = boto3.client("ecr", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        for a in answers:
            if isinstance(a, str):
                stub.add_client_error("describe_image_scan_findings", service_error_code=a, http_status_code=400,
                                      expected_params=ASK)
            else:
                token = a.pop("_after", None)
                stub.add_response("describe_image_scan_findings", a, {**ASK, **({"nextToken": token} if token else {})})
        got = scan.read(client, registry_id=ASK["registryId"], repository=ASK["repositoryName"], digest=DIGEST)
        stub.assert_no_pending_responses()
    return got


def test_a_completed_basic_scan_gives_every_finding_of_every_page():
    second = _page("COMPLETE", [_basic("CVE-2024-0002", "LOW", "zlib")])
    second["_after"] = "t1"
    got = _read(_page("COMPLETE", [_basic("CVE-2024-0001", "CRITICAL")], token="t1"), second)
    assert got.done and not got.unscanned
    assert got.findings == (Finding("CVE-2024-0001", "CRITICAL", "openssl"), Finding("CVE-2024-0002", "LOW", "zlib"))


def test_enhanced_findings_are_read_by_their_vulnerability_id_and_closed_ones_left_out():
    enhanced = [
        {"findingArn": "arn:1", "severity": "HIGH", "status": "ACTIVE", "type": "PACKAGE_VULNERABILITY",
         "packageVulnerabilityDetails": {"vulnerabilityId": "CVE-2023-4863", "source": "NVD",
                                         "vulnerablePackages": [{"name": "libwebp", "version": "1.2.4"}]}},
        {"findingArn": "arn:2", "severity": "CRITICAL", "status": "CLOSED",
         "packageVulnerabilityDetails": {"vulnerabilityId": "CVE-2021-44228", "source": "NVD"}},
    ]
    got = _read(_page("ACTIVE", enhanced=enhanced))
    assert got.done and got.findings == (Finding("CVE-2023-4863", "HIGH", "libwebp"),)


@pytest.mark.parametrize("answer", ["ScanNotFoundException", "IN_PROGRESS", "PENDING"])
def test_a_scan_not_started_or_running_is_not_done_yet(answer):
    got = _read(answer if answer.endswith("Exception") else _page(answer))
    assert not got.done and not got.unscanned and got.status == answer


@pytest.mark.parametrize("state", ["FAILED", "UNSUPPORTED_IMAGE", "FINDINGS_UNAVAILABLE", "SCAN_ELIGIBILITY_EXPIRED"])
def test_a_scan_that_cannot_judge_the_image_blocks_it(state):
    got = _read(_page(state))
    assert got.unscanned.startswith(f"ECR's scan status is {state}")
    with pytest.raises(Blocked) as e:
        judge(got, DIGEST, "CRITICAL", [], TODAY)
    assert e.value.lines == [f"no scan judged it: ECR's scan status is {state} (The scan was completed successfully.); "
                             "turn the repository's scanning on (docs/images.md)"]


def test_a_critical_finding_blocks_an_allowed_one_passes_and_an_expired_allowance_blocks_again():
    got = _read(_page("COMPLETE", [_basic("CVE-2024-3094", "CRITICAL", "xz-utils"), _basic("CVE-2024-0001", "HIGH")]))
    with pytest.raises(Blocked) as e:
        judge(got, DIGEST, "CRITICAL", [], TODAY)
    assert e.value.lines == ["CVE-2024-3094 (CRITICAL in xz-utils): at or above image.maxSeverity CRITICAL; fix it and "
                             "rebuild, or let it through with image.allowFindings (id: CVE-2024-3094, reason, expires)"]
    allow = AllowedFinding(id="CVE-2024-3094", reason="not reachable: sshd is not in the image", expires=TODAY)
    judge(got, DIGEST, "CRITICAL", [allow], TODAY)  # passes on its last day
    with pytest.raises(Blocked) as e:
        judge(got, DIGEST, "CRITICAL", [allow], date(2026, 12, 7))
    assert e.value.lines == ["CVE-2024-3094 (CRITICAL in xz-utils): its exception image.allowFindings[0] expired on "
                             "2026-12-06; look at it again and set a new expires, or rebuild without it"]
    with pytest.raises(Blocked) as e:
        judge(got, DIGEST, "HIGH", [allow], TODAY)
    assert [line.split(":")[0] for line in e.value.lines] == ["CVE-2024-0001 (HIGH in openssl)"]
