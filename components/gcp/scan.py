"""Artifact Analysis's scan of a pushed image, read into one `components.findings.Scan`: the image's
occurrences in the Container Analysis API v1 (`projects.occurrences.list`, every page), the DISCOVERY
occurrence for where the scan is (`discovery.analysisStatus`) and the VULNERABILITY occurrences for
what it found (the id from the note's name, `vulnerability.effectiveSeverity`, the affected package).

The client is google-api-python-client's, built from the discovery document the library ships
(`containeranalysis.v1.json`), so no network is needed to build it and the tests run it against
`HttpMockSequence`. No DISCOVERY occurrence yet (scanning starts a moment after the push), PENDING or
SCANNING is not done; FINISHED_FAILED and FINISHED_UNSUPPORTED never will be.
"""

from __future__ import annotations

from typing import Any

from components.findings import Finding, Scan, severity

DONE = ("FINISHED_SUCCESS", "COMPLETE")
NEVER = ("FINISHED_FAILED", "FINISHED_UNSUPPORTED")


def client(http: Any = None, credentials: Any = None) -> Any:
    """The Container Analysis v1 client, from the discovery document google-api-python-client ships."""
    from googleapiclient import discovery
    from googleapiclient.discovery_cache import get_static_doc

    doc = get_static_doc("containeranalysis", "v1")
    if http is not None:
        return discovery.build_from_document(doc, http=http)
    return discovery.build_from_document(doc, credentials=credentials)


def resource_uri(repository_url: str, digest: str) -> str:
    """The image as Artifact Analysis names it: `https://LOCATION-docker.pkg.dev/PROJECT/REPO/IMAGE@sha256:…`."""
    return f"https://{repository_url}@{digest}"


def read(api: Any, *, project: str, repository_url: str, digest: str) -> Scan:
    """The scan of `repository_url@digest` (an Artifact Registry image in `project`), as Artifact Analysis reports it now."""
    uri = resource_uri(repository_url, digest)
    occurrences: list[dict] = []
    request = api.projects().occurrences().list(
        parent=f"projects/{project}", filter=f'resourceUrl="{uri}" AND (kind="DISCOVERY" OR kind="VULNERABILITY")',
        pageSize=1000)
    while request is not None:
        page = request.execute(num_retries=3)
        occurrences += page.get("occurrences", [])
        request = api.projects().occurrences().list_next(request, page)
    discovery = [o for o in occurrences if o.get("kind") == "DISCOVERY"]
    state = discovery[0].get("discovery", {}).get("analysisStatus", "") if discovery else ""
    if state in NEVER:
        said = discovery[0].get("discovery", {}).get("analysisStatusError", {}).get("message", "")
        return Scan(done=False, status=state, unscanned=f"Artifact Analysis's status is {state}" + (f" ({said})" if said else ""))
    if state not in DONE:
        return Scan(done=False, status=state or "no discovery occurrence")
    findings = []
    for o in occurrences:
        if o.get("kind") != "VULNERABILITY":
            continue
        v = o.get("vulnerability", {})
        vid = o.get("noteName", "").rsplit("/", 1)[-1] or v.get("shortDescription", "?")
        packages = [i.get("affectedPackage", "") for i in v.get("packageIssue", [])] or [""]
        for p in packages:
            findings.append(Finding(vid, severity(v.get("effectiveSeverity") or v.get("severity") or ""), p))
    return Scan(done=True, findings=tuple(findings), status=state)
