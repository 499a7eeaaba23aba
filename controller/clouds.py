"""The placements' groups as the controller reads and sizes them: an Auto Scaling group on AWS,
a regional managed instance group on GCP.

Each cloud answers three things for a placement: :meth:`state` (machines running, the size
asked for, failed launches since the last successful one, as :class:`~controller.decide.GroupState`),
:meth:`desired` and :meth:`set_size`. Transient failures are retried: botocore's own
``standard`` retries on AWS, a bounded loop with backoff on GCP (429 and 5xx answers, dropped
connections). :class:`Clouds` picks the right one for each placement.

A placement on home's cloud is reached with the function's own identity. A placement on the
other cloud names its ``access`` (:mod:`controller.config`), and its group is reached by
federation, with credentials that refresh themselves and no key stored anywhere:

- an AWS group from a GCP function: a Google ID token for ``access["audience"]`` from the
  metadata server (google-auth's ``compute_engine.IDTokenCredentials``, the identity endpoint),
  exchanged for the role ``access["aws_role_arn"]`` by botocore's own
  ``AssumeRoleWithWebIdentityCredentialFetcher`` (STS ``AssumeRoleWithWebIdentity``, unsigned;
  the region's STS endpoint), fetched again before they expire;
- a GCP group from an AWS function: google-auth's ``external_account`` credentials with an AWS
  credential source (:func:`federated_info`): google-auth signs a ``GetCallerIdentity`` request
  with the function's own AWS credentials (Lambda's ``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` and ``AWS_REGION``), exchanges it at Google's
  STS for ``access["gcp_audience"]`` and impersonates ``access["service_account"]``.

A credential the other cloud refuses is a :class:`CloudError` naming the placement; a blip on
the way (an STS or metadata server's 5xx, a dropped connection) is retried as the group calls are.

AWS calls (and the permissions they need): ``autoscaling:DescribeAutoScalingGroups``,
``autoscaling:DescribeScalingActivities`` (resource ``*``: no resource-level permissions),
``autoscaling:UpdateAutoScalingGroup`` (the placements' group ARNs). GCP calls:
``regionInstanceGroupManagers.get`` / ``listManagedInstances`` / ``listErrors``
(``compute.instanceGroupManagers.get`` and ``.list``) and ``.resize``
(``compute.instanceGroupManagers.update``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Mapping

from controller.config import Placement
from controller.decide import GroupState, LaunchFailure
from controller.record import epoch_of

AWS_MAX_ATTEMPTS = 6  # botocore `standard` retries: the first call and five retries, with backoff
GCP_TRIES = 5
GCP_PAUSE_S = 1.0
GCP_TIMEOUT_S = 30.0
GCP_API = "https://compute.googleapis.com/compute/v1"
# gcloud's override of the Compute API's endpoint (`api_endpoint_overrides/compute`, e.g. a Private Service
# Connect endpoint), as its environment variable: where it is set (an operator's shell), `ops move`
# reaches the endpoint their gcloud does.
COMPUTE_ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"
GCP_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
ACTIVITIES = 50  # the newest scaling activities read (a failed launch is retried every few minutes)
# Federation's endpoints (the tests point them at stand-ins on 127.0.0.1).
GOOGLE_STS_URL = "https://sts.googleapis.com/v1/token"
IAM_CREDENTIALS_API = "https://iamcredentials.googleapis.com/v1"
# The subject token type of a signed GetCallerIdentity request, and where google-auth signs it for.
SIGNED_REQUEST_TYPE = "urn:ietf:params:aws:token-type:aws4_request"
AWS_VERIFICATION_URL = "https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15"
# The role session's name, as CloudTrail shows the controller's calls in the placement's account.
ROLE_SESSION_NAME = "trainstack-controller"
# Google's answers that say "not now" rather than "no" (HTTP 429/5xx, their status names and
# OAuth's own); anything else the token exchange answers is a verdict on the credential.
_GOOGLE_BLIP = re.compile(r"\b(429|5\d\d)\b|UNAVAILABLE|RESOURCE_EXHAUSTED|INTERNAL|DEADLINE_EXCEEDED|"
                          r"temporarily_unavailable|server_error")


class CloudError(RuntimeError):
    """A group could not be read or sized (after the retries); the message names the group."""


def _price_config():
    """EC2's price calls: a price is refreshed later if this one fails, so they never hold a tick for long."""
    from botocore.config import Config

    return Config(retries={"mode": "standard", "total_max_attempts": 2}, connect_timeout=5, read_timeout=10)


def _aws_config():
    from botocore.config import Config

    return Config(retries={"mode": "standard", "max_attempts": AWS_MAX_ATTEMPTS}, connect_timeout=10, read_timeout=30)


def google_id_token(p: Placement, audience: str) -> Callable[[], str]:
    """A loader of fresh Google ID tokens for ``audience``, from this machine's metadata server (the
    identity endpoint, ``format=full``); a refusal or an unreachable server is a :class:`CloudError`
    naming ``p``. google-auth retries the metadata server's blips itself."""
    from google.auth.compute_engine import IDTokenCredentials
    from google.auth.exceptions import GoogleAuthError
    from google.auth.transport.requests import Request

    credentials = IDTokenCredentials(None, audience, use_metadata_identity_endpoint=True)

    def load() -> str:
        try:
            credentials.refresh(Request())
        except GoogleAuthError as e:
            raise CloudError(f"placement {p.index} ({p.label}): no Google ID token for the audience {audience!r} "
                             f"from the metadata server: {e}") from None
        return credentials.token

    return load


def web_identity_session(p: Placement, token_loader: Callable[[], str]):
    """A boto3 session holding the role ``p.access["aws_role_arn"]``, assumed with the tokens
    ``token_loader`` gives through botocore's own fetcher: fetched on first use and again before
    they expire. AWS refusing the role is a :class:`CloudError` naming ``p``."""
    import boto3
    import botocore.session
    from botocore.credentials import (
        AssumeRoleWithWebIdentityCredentialFetcher,
        CredentialProvider,
        CredentialResolver,
        DeferredRefreshableCredentials,
    )
    from botocore.exceptions import BotoCoreError, ClientError

    role = p.access["aws_role_arn"]  # type: ignore[index]
    sts = botocore.session.Session()  # AssumeRoleWithWebIdentity is unsigned: no credentials of its own

    def sts_client(service: str, config=None):
        return sts.create_client(service, region_name=p.region,
                                 config=_aws_config().merge(config) if config else _aws_config())

    fetcher = AssumeRoleWithWebIdentityCredentialFetcher(
        sts_client, token_loader, role, extra_args={"RoleSessionName": ROLE_SESSION_NAME})

    def fetch() -> dict:
        try:
            return fetcher.fetch_credentials()
        except (BotoCoreError, ClientError) as e:
            raise CloudError(f"placement {p.index} ({p.label}): AWS refused the role {role} for this function's "
                             f"Google identity (audience {p.access['audience']!r}): {e}") from None  # type: ignore[index]

    credentials = DeferredRefreshableCredentials(refresh_using=fetch, method="assume-role-with-web-identity")

    class _Role(CredentialProvider):
        METHOD = "assume-role-with-web-identity"

        def load(self):
            return credentials

    core = botocore.session.Session()
    core.register_component("credential_provider", CredentialResolver(providers=[_Role()]))
    return boto3.session.Session(botocore_session=core)


class AwsGroups:
    """Auto Scaling groups through boto3 (endpoint and credentials from the standard variables; a
    placement with ``access``, through the role it names: module docstring).

    ``id_token``: how a Google ID token for an audience is had (default: :func:`google_id_token`).
    """

    def __init__(self, session=None, *, id_token: Callable[[Placement, str], Callable[[], str]] = google_id_token
                 ) -> None:
        self._session = session
        self._id_token = id_token
        self._roles: dict[tuple[str, str], object] = {}
        self._clients: dict[tuple[str, str | None], object] = {}

    def _session_for(self, p: Placement):
        if not p.access:
            import boto3

            return self._session or boto3.session.Session()
        key = (p.access["aws_role_arn"], p.access["audience"])
        if key not in self._roles:
            self._roles[key] = web_identity_session(p, self._id_token(p, p.access["audience"]))
        return self._roles[key]

    def client(self, p: Placement):
        """``p``'s region's Auto Scaling client, as the identity that reaches ``p``."""
        key = (p.region, p.access["aws_role_arn"] if p.access else None)
        if key not in self._clients:
            self._clients[key] = self._session_for(p).client("autoscaling", region_name=p.region, config=_aws_config())
        return self._clients[key]

    def ec2(self, p: Placement):
        """``p``'s region's EC2 client (its spot prices and placement scores, controller/prices.py), as the
        identity that reaches ``p``."""
        key = (f"ec2:{p.region}", p.access["aws_role_arn"] if p.access else None)
        if key not in self._clients:
            self._clients[key] = self._session_for(p).client("ec2", region_name=p.region, config=_price_config())
        return self._clients[key]

    def _call(self, p: Placement, what: str, fn: Callable[[], dict]) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except (BotoCoreError, ClientError) as e:
            raise CloudError(f"{what} of the group {p.group} ({p.label}) failed: {e}") from None

    def _group(self, p: Placement) -> dict:
        asg = self.client(p)
        found = self._call(p, "describe", lambda: asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[p.group]))["AutoScalingGroups"]
        if not found:
            raise CloudError(f"no Auto Scaling group {p.group} in {p.region} (was the stack destroyed?)")
        return found[0]

    def desired(self, p: Placement) -> int:
        return int(self._group(p).get("DesiredCapacity") or 0)

    def state(self, p: Placement) -> GroupState:
        group = self._group(p)
        asg = self.client(p)
        activities = self._call(p, "describe_scaling_activities", lambda: asg.describe_scaling_activities(
            AutoScalingGroupName=p.group, MaxRecords=ACTIVITIES))["Activities"]
        in_service = [i for i in group.get("Instances", []) if i.get("LifecycleState") == "InService"]
        running = len(in_service)
        failures = []
        launched = None
        for a in sorted(activities, key=lambda a: _epoch(a.get("StartTime")) or 0.0, reverse=True):
            if a.get("StatusCode") == "Successful" and "launching" in str(a.get("Description", "")).lower():
                launched = _epoch(a.get("StartTime"))  # the newest machine's launch
                break  # the failures before this launch were overcome by it
            if a.get("StatusCode") == "Failed":
                message = " ".join(str(a.get("StatusMessage") or a.get("Description") or "launch failed").split())
                failures.append(LaunchFailure(_epoch(a.get("StartTime")), message))
        return GroupState(running=running, desired=group.get("DesiredCapacity"), failures=tuple(failures),
                          launched=launched, machines=tuple(sorted(str(i.get("InstanceId")) for i in in_service)))

    def set_size(self, p: Placement, n: int) -> None:
        asg = self.client(p)
        self._call(p, f"resize to {n}", lambda: asg.update_auto_scaling_group(
            AutoScalingGroupName=p.group, MinSize=n, MaxSize=n, DesiredCapacity=n))


def _epoch(value) -> float | None:
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return epoch_of(value)


def federated_info(access: Mapping[str, str], *, token_url: str = GOOGLE_STS_URL,
                   iam_credentials: str = IAM_CREDENTIALS_API) -> dict:
    """google-auth's ``external_account`` configuration for ``access`` (an AWS credential source):
    what ``gcloud iam workload-identity-pools create-cred-config --aws`` writes, with the function's
    credentials and region from its environment (Lambda has no instance metadata service)."""
    return {
        "type": "external_account",
        "audience": access["gcp_audience"],
        "subject_token_type": SIGNED_REQUEST_TYPE,
        "token_url": token_url,
        "service_account_impersonation_url":
            f"{iam_credentials.rstrip('/')}/projects/-/serviceAccounts/{access['service_account']}:generateAccessToken",
        "credential_source": {"environment_id": "aws1", "regional_cred_verification_url": AWS_VERIFICATION_URL},
    }


class GcpGroups:
    """Regional managed instance groups through the Compute Engine REST API (google-auth's session).

    ``session``: an authorized ``requests`` session for home's project (default: the function's
    own identity, ``google.auth.default``); a placement with ``access`` gets its own, through
    federation (module docstring). ``api``: the Compute API's base URL (default: gcloud's override,
    COMPUTE_ENDPOINT_ENV, when set, else GCP_API); ``token_url`` and
    ``iam_credentials``: Google's STS and IAM Credentials API.
    """

    def __init__(self, session=None, *, api: str | None = None, token_url: str = GOOGLE_STS_URL,
                 iam_credentials: str = IAM_CREDENTIALS_API, sleep: Callable[[float], None] = time.sleep) -> None:
        self._session = session
        self.api = (api or os.environ.get(COMPUTE_ENDPOINT_ENV) or GCP_API).rstrip("/")
        self.token_url, self.iam_credentials = token_url, iam_credentials
        self._sleep = sleep
        self._federated: dict[tuple[str, str], object] = {}

    @property
    def session(self):
        if self._session is None:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _project = google.auth.default(scopes=[GCP_SCOPE])
            self._session = AuthorizedSession(credentials)
        return self._session

    def session_for(self, p: Placement):
        """The session that reaches ``p``'s group: home's identity, or the federated one ``p.access`` names."""
        if not p.access:
            return self.session
        key = (p.access["gcp_audience"], p.access["service_account"])
        if key not in self._federated:
            from google.auth import aws
            from google.auth.transport.requests import AuthorizedSession

            info = federated_info(p.access, token_url=self.token_url, iam_credentials=self.iam_credentials)
            self._federated[key] = AuthorizedSession(aws.Credentials.from_info(info, scopes=[GCP_SCOPE]))
        return self._federated[key]

    def _url(self, p: Placement, tail: str = "") -> str:
        return f"{self.api}/projects/{p.project}/regions/{p.region}/instanceGroupManagers/{p.group}{tail}"

    def _call(self, p: Placement, method: str, tail: str = "", **kw) -> dict:
        import requests
        from google.auth.exceptions import GoogleAuthError, TransportError

        last = ""
        for attempt in range(1, GCP_TRIES + 1):
            try:
                resp = self.session_for(p).request(method, self._url(p, tail), timeout=GCP_TIMEOUT_S, **kw)
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {e}"
            except GoogleAuthError as e:  # a credential's refresh: the federated exchange (p.access), or home's own
                text = " ".join(str(e).split())
                if not isinstance(e, TransportError) and not _GOOGLE_BLIP.search(text):
                    who = (f"this function's AWS identity for the service account {p.access['service_account']} "
                           f"(provider {p.access['gcp_audience']})" if p.access else "this function's own credentials")
                    raise CloudError(f"placement {p.index} ({p.label}): Google refused {who}: {text[:500]}") from None
                last = f"{type(e).__name__}: {text[:300]}"
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
        up = [m for m in managed if m.get("instanceStatus") == "RUNNING" and m.get("currentAction") == "NONE"]
        running = len(up)
        errors = self._call(p, "GET", "/listErrors").get("items", [])
        failures = [LaunchFailure(epoch_of(e.get("timestamp")),
                                  f"{(e.get('error') or {}).get('code', '')}: {(e.get('error') or {}).get('message', '')}")
                    for e in errors]
        for m in managed:  # an instance still being created says why its last try failed
            for err in ((m.get("lastAttempt") or {}).get("errors") or {}).get("errors", []):
                failures.append(LaunchFailure(None, f"{err.get('code', '')}: {err.get('message', '')}"))
        failures.sort(key=lambda f: f.time or 0.0, reverse=True)
        return GroupState(running=running, desired=group.get("targetSize"), failures=tuple(failures),
                          machines=tuple(sorted(str(m.get("id") or m.get("instance")) for m in up
                                                if m.get("id") or m.get("instance"))))

    def set_size(self, p: Placement, n: int) -> None:
        self._call(p, "POST", "/resize", params={"size": n})


class Clouds:
    """Each placement's group on its cloud: ``Clouds(aws=AwsGroups(), gcp=GcpGroups())``.

    ``federate``: reach a placement on the other cloud through its ``access`` (the function, which
    has an identity in home's cloud only). ``ops move`` passes False: the operator's own
    credentials (standard variables, profiles, ``gcloud auth application-default login``) reach
    every cloud, and the function's federation trusts the function's identity, not the operator's.
    """

    def __init__(self, aws: AwsGroups | None = None, gcp: GcpGroups | None = None, *, federate: bool = True) -> None:
        self._by = {"aws": aws, "gcp": gcp}
        self.federate = federate

    def of(self, p: Placement):
        groups = self._by.get(p.cloud)
        if groups is None:
            self._by[p.cloud] = groups = AwsGroups() if p.cloud == "aws" else GcpGroups()
        return groups

    def _as(self, p: Placement) -> Placement:
        return p if self.federate or p.access is None else dataclasses.replace(p, access=None)

    def state(self, p: Placement) -> GroupState:
        return self.of(p).state(self._as(p))

    def desired(self, p: Placement) -> int:
        return self.of(p).desired(self._as(p))

    def set_size(self, p: Placement, n: int) -> None:
        self.of(p).set_size(self._as(p), n)

    def ec2(self, p: Placement):
        """An AWS placement's EC2 client, as the identity that reaches it (controller/prices.py)."""
        return self.of(p).ec2(self._as(p))

    def gcp_session(self, p: Placement):
        """The authorized session that reaches a GCP placement (the Cloud Billing Catalog, controller/prices.py)."""
        return self.of(p).session_for(self._as(p))
