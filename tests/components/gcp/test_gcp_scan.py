"""Artifact Analysis occurrences read into the gate's Scan: the client is built from the discovery
document google-api-python-client ships, and answered by HttpMockSequence page by page."""

from __future__ import annotations

import json
import urllib.parse
from datetime import date

import pytest
from googleapiclient.http import HttpMockSequence

from components.findings import Blocked, Finding, judge
from components.gcp import scan
from components.settings.schema import AllowedFinding

DIGEST = "sha256:" + "b" * 64
REPO = "us-central1-docker.pkg.dev/proj/trainstack-dev/trainer"
URI = f"https://{REPO}@{DIGEST}"
TODAY = date(2026, 12, 6)


class _Recorded(HttpMockSequence):
    def __init__(self, iterable):
        super().__init__(iterable)
        self.uris: list[str] = []

    def request(self, uri, *args, **kwargs):
        self.uris.append(uri)
        return super().request(uri, *args, **kwargs)


def _discovery(state: str) -> dict:
    return {"name": "projects/proj/occurrences/d1", "resourceUri": URI, "kind": "DISCOVERY",
            "noteName": "projects/goog-analysis/notes/PACKAGE_VULNERABILITY",
            "discovery": {"analysisStatus": state, "analysisStatusError": {"message": "too big"}}}


def _vuln(cve: str, sev: str, package: str) -> dict:
    return {"name": f"projects/proj/occurrences/{cve}", "resourceUri": URI, "kind": "VULNERABILITY",
            "noteName": f"projects/goog-vulnz/notes/{cve}",
            "vulnerability": {"effectiveSeverity": sev, "severity": "LOW", "shortDescription": cve,
                              "packageIssue": [{"affectedPackage": package, "affectedVersion": {"kind": "NORMAL"}}]}}


def _read(*pages: dict) -> tuple[scan.Scan, list[str]]:
    http = _Recorded([({"status": "200"}, json.dumps(p)) for p in pages])
    got = scan.read(scan.client(http=http), project="proj", repository_url=REPO, digest=DIGEST)
    return got, http.uris


def test_a_finished_scan_gives_every_vulnerability_of_every_page_by_its_notes_id():
    got, uris = _read({"occurrences": [_discovery("FINISHED_SUCCESS"), _vuln("CVE-2024-3094", "CRITICAL", "xz-utils")],
                       "nextPageToken": "p2"},
                      {"occurrences": [_vuln("CVE-2023-4863", "MINIMAL", "libwebp")]})
    assert got.done
    assert got.findings == (Finding("CVE-2024-3094", "CRITICAL", "xz-utils"), Finding("CVE-2023-4863", "INFORMATIONAL", "libwebp"))
    first = urllib.parse.urlsplit(uris[0])
    assert first.path == "/v1/projects/proj/occurrences"
    query = urllib.parse.parse_qs(first.query)
    assert query["filter"] == [f'resourceUrl="{URI}" AND (kind="DISCOVERY" OR kind="VULNERABILITY")']
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(uris[1]).query)["pageToken"] == ["p2"]


@pytest.mark.parametrize("occurrences", [[], [_discovery("PENDING")], [_discovery("SCANNING")]])
def test_no_discovery_yet_or_a_running_scan_is_not_done(occurrences):
    got, _ = _read({"occurrences": occurrences})
    assert not got.done and not got.unscanned


@pytest.mark.parametrize("state", ["FINISHED_FAILED", "FINISHED_UNSUPPORTED"])
def test_a_scan_that_cannot_judge_the_image_blocks_it(state):
    got, _ = _read({"occurrences": [_discovery(state)]})
    with pytest.raises(Blocked) as e:
        judge(got, DIGEST, "CRITICAL", [], TODAY)
    assert e.value.lines == [f"no scan judged it: Artifact Analysis's status is {state} (too big); "
                             "turn the repository's scanning on (docs/images.md)"]


def test_a_critical_finding_blocks_an_allowed_one_passes_and_an_expired_allowance_blocks_again():
    got, _ = _read({"occurrences": [_discovery("FINISHED_SUCCESS"), _vuln("CVE-2024-3094", "CRITICAL", "xz-utils")]})
    with pytest.raises(Blocked, match="CVE-2024-3094 \\(CRITICAL in xz-utils\\): at or above image.maxSeverity CRITICAL"):
        judge(got, DIGEST, "CRITICAL", [], TODAY)
    allow = AllowedFinding(id="CVE-2024-3094", reason="not reachable: sshd is not in the image", expires=TODAY)
    judge(got, DIGEST, "CRITICAL", [allow], TODAY)
    with pytest.raises(Blocked, match=r"image.allowFindings\[0\] expired on 2026-12-06"):
        judge(got, DIGEST, "CRITICAL", [allow], date(2027, 1, 1))
