"""ScanGate: a built image's digest passes to the machines only after its scan lets it through, as a Pulumi
dynamic resource that runs at `pulumi up` between the push and the user data.

It waits for the home repository's scan of the pushed digest (ECR, `components/aws/scan.py`; Artifact
Analysis, `components/gcp/scan.py`) for at most `image.scanWaitMinutes`, and judges it with
`components/findings.py` against `image.maxSeverity` and `image.allowFindings`. A blocked digest fails
the resource, with one line per reason, so nothing that reads its `digest` output (the launch or
instance templates' user data) is changed: the machines keep the image they had. The mirrors in other
regions hold the same digest (one build, one manifest), so one scan judges them all.

It runs again when the digest or the policy changes, and on every `pulumi up` after a day has
passed since it last judged (`judged_on`), so an exception that expires blocks the next `pulumi up`
once it has: the machines already running keep their image until then. Like
`components/propagation.py`, it is a dynamic resource of our own (no provider plugin to fetch) and
does nothing under the SDK's mocks (`ops synth`, the tests): synth says what the gate will judge.
"""

from __future__ import annotations

from datetime import date
from types import SimpleNamespace
from typing import Any

import pulumi
import pulumi.dynamic


def _allowed(props: dict[str, Any]) -> list[SimpleNamespace]:
    return [SimpleNamespace(id=a["id"], reason=a["reason"], expires=date.fromisoformat(a["expires"]))
            for a in props.get("allow_findings") or []]


def _reader(props: dict[str, Any]):
    """A function reading the scan of props' digest in its home repository, now."""
    url, digest = props["repository_url"], props["digest"]
    host, _, path = url.partition("/")
    if props["cloud"] == "aws":
        import boto3
        from botocore.config import Config

        from components.aws import scan

        region = host.split(".dkr.ecr.", 1)[1].removesuffix(".amazonaws.com")
        client = boto3.client("ecr", region_name=region, config=Config(retries={"mode": "standard", "max_attempts": 5}))
        return lambda: scan.read(client, registry_id=props["registry_id"], repository=path, digest=digest)
    import google.auth

    from components.gcp import scan

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    api = scan.client(credentials=credentials)
    project = path.split("/", 1)[0]
    return lambda: scan.read(api, project=project, repository_url=url, digest=digest)


def judge(props: dict[str, Any], today: date | None = None, reader=None) -> None:
    """Wait for the scan of props' digest and raise findings.Blocked unless it passes."""
    from components import findings

    read = (reader or _reader)(props)
    result = findings.wait(read, props["digest"], float(props["wait_s"]))
    findings.judge(result, props["digest"], props["max_severity"], _allowed(props), today or date.today())


class _Gate(pulumi.dynamic.ResourceProvider):
    """Judges the scan on create, and again when the digest, the policy or the day changes."""

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        judge(props)
        return pulumi.dynamic.CreateResult(id_=props["digest"], outs={**props, "judged_on": date.today().isoformat()})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = [k for k in ("digest", "max_severity", "allow_findings", "wait_s") if olds.get(k) != news.get(k)]
        stale = olds.get("judged_on") != date.today().isoformat()
        return pulumi.dynamic.DiffResult(changes=bool(changed) or stale, replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        judge(news)
        return pulumi.dynamic.UpdateResult(outs={**news, "judged_on": date.today().isoformat()})


class ScanGate(pulumi.dynamic.Resource):
    """The pushed `digest`, passed on (`digest` output) only when its scan lets it through."""

    digest: pulumi.Output[str]

    def __init__(self, name: str, *, cloud: str, repository_url: pulumi.Input[str], digest: pulumi.Input[str],
                 image, registry_id: pulumi.Input[str] | None = None, opts: pulumi.ResourceOptions | None = None):
        """`image`: the stack's ImageSettings (maxSeverity, allowFindings, scanWaitMinutes)."""
        props = {
            "cloud": cloud,
            "repository_url": repository_url,
            "registry_id": registry_id or "",
            "digest": digest,
            "max_severity": image.max_severity,
            "allow_findings": [{"id": a.id, "reason": a.reason, "expires": a.expires.isoformat()}
                               for a in image.allow_findings],
            "wait_s": image.scan_wait_minutes * 60,
        }
        super().__init__(_Gate(), name, props, opts)
