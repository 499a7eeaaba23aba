"""ECR's scan of a pushed image, read into one `components.findings.Scan`: basic scanning's findings
(`findings`: the CVE id as `name`, the package in `attributes`) or enhanced scanning's (Amazon Inspector:
`enhancedFindings`, the id in `packageVulnerabilityDetails.vulnerabilityId`), all pages of
DescribeImageScanFindings.

A scan not started yet (ScanNotFoundException: scan on push starts a moment after the push) or in
progress is not done; a scan that failed or cannot judge the image (an unsupported image, scanning
eligibility expired, findings unavailable, ...) never will be.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from components.findings import Finding, Scan, severity

# imageScanStatus.status values that say the findings are there: basic scanning's COMPLETE, enhanced
# scanning's ACTIVE (continuous scanning: the first scan has completed).
DONE = ("COMPLETE", "ACTIVE")
NOT_YET = ("IN_PROGRESS", "PENDING")


def read(client: Any, *, registry_id: str, repository: str, digest: str) -> Scan:
    """The scan of `repository@digest` in the registry `registry_id`, as ECR reports it now."""
    findings: list[Finding] = []
    try:
        pages = client.get_paginator("describe_image_scan_findings").paginate(
            registryId=registry_id, repositoryName=repository, imageId={"imageDigest": digest})
        for page in pages:
            status = page.get("imageScanStatus", {})
            state = status.get("status", "")
            if state in NOT_YET:
                return Scan(done=False, status=state)
            if state not in DONE:
                said = status.get("description", "")
                return Scan(done=False, status=state, unscanned=f"ECR's scan status is {state}" + (f" ({said})" if said else ""))
            found = page.get("imageScanFindings", {})
            for f in found.get("findings", []):
                package = next((a.get("value", "") for a in f.get("attributes", []) if a.get("key") == "package_name"), "")
                findings.append(Finding(f.get("name", "?"), severity(f.get("severity", "")), package))
            for f in found.get("enhancedFindings", []):
                if f.get("status") == "CLOSED":
                    continue
                details = f.get("packageVulnerabilityDetails", {})
                packages = details.get("vulnerablePackages") or [{}]
                for p in packages:
                    findings.append(Finding(details.get("vulnerabilityId") or f.get("title", "?"),
                                            severity(f.get("severity", "")), p.get("name", "")))
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code == "ScanNotFoundException":
            return Scan(done=False, status=code)
        raise
    return Scan(done=True, findings=tuple(findings), status="COMPLETE")
