"""The placements' groups as the controller reads and sizes them: an Auto Scaling group on AWS,
a regional managed instance group on GCP.

Each cloud answers three things for a placement: :meth:`state` (machines running, the size
asked for, failed launches since the last successful one, as :class:`~controller.decide.GroupState`),
:meth:`desired` and :meth:`set_size`. Transient failures are retried: botocore's own
``standard`` retries on AWS, a bounded loop with backoff on GCP (429 and 5xx answers, dropped
connections). :class:`Clouds` picks the right one for each placement.

AWS calls (and the permissions they need): ``autoscaling:DescribeAutoScalingGroups``,
``autoscaling:DescribeScalingActivities`` (resource ``*``: no resource-level permissions),
``autoscaling:UpdateAutoScalingGroup`` (the placements' group ARNs). GCP calls:
``regionInstanceGroupManagers.get`` / ``listManagedInstances`` / ``listErrors``
(``compute.instanceGroupManagers.get`` and ``.list``) and ``.resize``
(``compute.instanceGroupManagers.update``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from controller.config import Placement
from controller.decide import GroupState, LaunchFailure
from controller.record import epoch_of

AWS_MAX_ATTEMPTS = 6  # botocore `standard` retries: the first call and five retries, with backoff
GCP_TRIES = 5
GCP_PAUSE_S = 1.0
GCP_TIMEOUT_S = 30.0
GCP_API = "https://compute.googleapis.com/compute/v1"
GCP_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
ACTIVITIES = 50  # the newest scaling activities read (a failed launch is retried every few minutes)


class CloudError(RuntimeError):
    """A group could not be read or sized (after the retries); the message names the group."""


class AwsGroups:
    """Auto Scaling groups through boto3 (endpoint and credentials from the standard variables)."""

    def __init__(self, session=None) -> None:
        self._session = session
        self._clients: dict[str, object] = {}

    def client(self, region: str):
        if region not in self._clients:
            import boto3
            from botocore.config import Config

            session = self._session or boto3.session.Session()
            self._clients[region] = session.client(
                "autoscaling", region_name=region,
                config=Config(retries={"mode": "standard", "max_attempts": AWS_MAX_ATTEMPTS},
                              connect_timeout=10, read_timeout=30))
        return self._clients[region]

    def _call(self, p: Placement, what: str, fn: Callable[[], dict]) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except (BotoCoreError, ClientError) as e:
            raise CloudError(f"{what} of the group {p.group} ({p.label}) failed: {e}") from None

    def _group(self, p: Placement) -> dict:
        asg = self.client(p.region)
        found = self._call(p, "describe", lambda: asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[p.group]))["AutoScalingGroups"]
        if not found:
            raise CloudError(f"no Auto Scaling group {p.group} in {p.region} (was the stack destroyed?)")
        return found[0]

    def desired(self, p: Placement) -> int:
        return int(self._group(p).get("DesiredCapacity") or 0)

    def state(self, p: Placement) -> GroupState:
        group = self._group(p)
        asg = self.client(p.region)
        activities = self._call(p, "describe_scaling_activities", lambda: asg.describe_scaling_activities(
            AutoScalingGroupName=p.group, MaxRecords=ACTIVITIES))["Activities"]
        running = sum(1 for i in group.get("Instances", []) if i.get("LifecycleState") == "InService")
        failures = []
        for a in sorted(activities, key=lambda a: _epoch(a.get("StartTime")) or 0.0, reverse=True):
            if a.get("StatusCode") == "Successful" and "launching" in str(a.get("Description", "")).lower():
                break  # the failures before this launch were overcome by it
            if a.get("StatusCode") == "Failed":
                message = " ".join(str(a.get("StatusMessage") or a.get("Description") or "launch failed").split())
                failures.append(LaunchFailure(_epoch(a.get("StartTime")), message))
        return GroupState(running=running, desired=group.get("DesiredCapacity"), failures=tuple(failures))

    def set_size(self, p: Placement, n: int) -> None:
        asg = self.client(p.region)
        self._call(p, f"resize to {n}", lambda: asg.update_auto_scaling_group(
            AutoScalingGroupName=p.group, MinSize=n, MaxSize=n, DesiredCapacity=n))


def _epoch(value) -> float | None:
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return epoch_of(value)


class GcpGroups:
    """Regional managed instance groups through the Compute Engine REST API (google-auth's session).

    ``session``: an authorized ``requests`` session (default: the function's own identity,
    ``google.auth.default``); ``api``: the API's base URL.
    """

    def __init__(self, session=None, *, api: str = GCP_API, sleep: Callable[[float], None] = time.sleep) -> None:
        self._session = session
        self.api = api.rstrip("/")
        self._sleep = sleep

    @property
    def session(self):
        if self._session is None:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _project = google.auth.default(scopes=[GCP_SCOPE])
            self._session = AuthorizedSession(credentials)
        return self._session

    def _url(self, p: Placement, tail: str = "") -> str:
        return f"{self.api}/projects/{p.project}/regions/{p.region}/instanceGroupManagers/{p.group}{tail}"

    def _call(self, p: Placement, method: str, tail: str = "", **kw) -> dict:
        import requests

        last = ""
        for attempt in range(1, GCP_TRIES + 1):
            try:
                resp = self.session.request(method, self._url(p, tail), timeout=GCP_TIMEOUT_S, **kw)
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 300:
                    return resp.json() if resp.content else {}
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                if resp.status_code != 429 and resp.status_code < 500:
                    break  # a verdict (no permission, no group), not a blip
            if attempt < GCP_TRIES:
                self._sleep(GCP_PAUSE_S * 2 ** (attempt - 1))
        raise CloudError(f"{method} {tail or 'get'} of the group {p.group} ({p.label}) failed: {last}")

    def desired(self, p: Placement) -> int:
        return int(self._call(p, "GET").get("targetSize") or 0)

    def state(self, p: Placement) -> GroupState:
        group = self._call(p, "GET")
        managed = self._call(p, "POST", "/listManagedInstances").get("managedInstances", [])
        running = sum(1 for m in managed if m.get("instanceStatus") == "RUNNING" and m.get("currentAction") == "NONE")
        errors = self._call(p, "GET", "/listErrors").get("items", [])
        failures = [LaunchFailure(epoch_of(e.get("timestamp")),
                                  f"{(e.get('error') or {}).get('code', '')}: {(e.get('error') or {}).get('message', '')}")
                    for e in errors]
        for m in managed:  # an instance still being created says why its last try failed
            for err in ((m.get("lastAttempt") or {}).get("errors") or {}).get("errors", []):
                failures.append(LaunchFailure(None, f"{err.get('code', '')}: {err.get('message', '')}"))
        failures.sort(key=lambda f: f.time or 0.0, reverse=True)
        return GroupState(running=running, desired=group.get("targetSize"), failures=tuple(failures))

    def set_size(self, p: Placement, n: int) -> None:
        self._call(p, "POST", "/resize", params={"size": n})


class Clouds:
    """Each placement's group on its cloud: ``Clouds(aws=AwsGroups(), gcp=GcpGroups())``."""

    def __init__(self, aws: AwsGroups | None = None, gcp: GcpGroups | None = None) -> None:
        self._by = {"aws": aws, "gcp": gcp}

    def of(self, p: Placement):
        groups = self._by.get(p.cloud)
        if groups is None:
            self._by[p.cloud] = groups = AwsGroups() if p.cloud == "aws" else GcpGroups()
        return groups

    def state(self, p: Placement) -> GroupState:
        return self.of(p).state(p)

    def desired(self, p: Placement) -> int:
        return self.of(p).desired(p)

    def set_size(self, p: Placement, n: int) -> None:
        self.of(p).set_size(p, n)
