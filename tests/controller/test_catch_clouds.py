"""The calls the controller makes on each cloud and how it reads their answers: Auto Scaling's
groups and scaling activities, Compute Engine's managed groups, the retries, the errors that name
the group, and which identity reaches which placement.

Clients and sessions kept in memory that answer in the APIs' shapes and record every call, so each
call's arguments are checked; the emulators' end-to-end runs are in test_tick.py and test_federation.py.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
import requests
from botocore.exceptions import ClientError
from google.auth.exceptions import RefreshError, TransportError

from controller import clouds
from controller.clouds import (
    ACTIVITIES,
    AWS_MAX_ATTEMPTS,
    COMPUTE_ENDPOINT_ENV,
    GCP_API,
    GCP_TIMEOUT_S,
    AwsGroups,
    CloudError,
    Clouds,
    GcpGroups,
    federated_info,
)
from controller.config import Placement
from controller.decide import GroupState, LaunchFailure

NOW = 1_800_000_000.0
AWS = Placement(index=1, cloud="aws", region="us-west-2", group="ts-gpu")
ROLE = "arn:aws:iam::123456789012:role/trainstack-controller"
AWS_FAR = Placement(index=2, cloud="aws", region="us-west-2", group="ts-far",
                    access={"aws_role_arn": ROLE, "audience": "trainstack"})
GCP = Placement(index=0, cloud="gcp", region="us-central1", group="ts-gpu", project="my-proj")
GCP_FAR = Placement(index=1, cloud="gcp", region="europe-west4", group="ts-eu", project="my-proj", access={
    "gcp_audience": "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/providers/aws",
    "service_account": "trainstack@my-proj.iam.gserviceaccount.com"})


def _at(seconds_ago: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(NOW - seconds_ago, tz=dt.UTC)


class Asg:
    """An Auto Scaling client: one group's description and activities; every call recorded."""

    def __init__(self, group: dict | None, activities: list[dict] | None = None, fail: str = "") -> None:
        self.group, self.activities, self.fail = group, activities or [], fail
        self.calls: list[tuple[str, dict]] = []

    def _maybe_fail(self, op: str) -> None:
        if self.fail == op:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "not allowed"}}, op)

    def describe_auto_scaling_groups(self, **kw):
        self.calls.append(("describe_auto_scaling_groups", kw))
        self._maybe_fail("DescribeAutoScalingGroups")
        return {"AutoScalingGroups": [self.group] if self.group is not None else []}

    def describe_scaling_activities(self, **kw):
        self.calls.append(("describe_scaling_activities", kw))
        self._maybe_fail("DescribeScalingActivities")
        return {"Activities": self.activities}

    def update_auto_scaling_group(self, **kw):
        self.calls.append(("update_auto_scaling_group", kw))
        self._maybe_fail("UpdateAutoScalingGroup")
        return {}


class Session:
    """A boto3 session that hands out one client and records how it was asked for."""

    def __init__(self, asg: Asg) -> None:
        self.asg, self.asked = asg, []

    def client(self, service, **kw):
        self.asked.append((service, kw))
        return self.asg


def _group(desired=2, states=("InService", "Pending", "InService", "InService", "Terminating")) -> dict:
    return {"AutoScalingGroupName": "ts-gpu", "DesiredCapacity": desired,
            "Instances": [{"InstanceId": f"i-{n}", "LifecycleState": s} for n, s in enumerate(states)]}


def test_an_aws_group_reads_as_its_machines_in_service_and_its_failures_since_the_last_launch():
    activities = [  # in no particular order, as the API may page them
        {"StatusCode": "Failed", "StartTime": _at(600), "StatusMessage": "We currently do not have\n  sufficient capacity."},
        {"StatusCode": "Successful", "StartTime": _at(3600), "Description": "Launching a new EC2 instance: i-0"},
        {"StatusCode": "Failed", "StartTime": _at(7200), "StatusMessage": "before the launch: overcome"},
        {"StatusCode": "Successful", "StartTime": _at(60), "Description": "Terminating EC2 instance: i-9"},
        {"StatusCode": "Failed", "StartTime": "2027-01-15T07:55:00Z", "Description": "Launching: no message"},
        {"StatusCode": "Failed", "StartTime": _at(1200)},
        {"StatusCode": "InProgress", "StartTime": _at(30), "StatusMessage": "launching"},
    ]
    asg = Asg(_group(), activities)

    state = AwsGroups(Session(asg)).state(AWS)

    assert state == GroupState(running=3, desired=2, failures=(
        LaunchFailure(NOW - 300, "Launching: no message"),
        LaunchFailure(NOW - 600, "We currently do not have sufficient capacity."),
        LaunchFailure(NOW - 1200, "launch failed")), launched=NOW - 3600,  # the newest machine's launch
        machines=("i-0", "i-2", "i-3"))
    assert asg.calls == [("describe_auto_scaling_groups", {"AutoScalingGroupNames": ["ts-gpu"]}),
                         ("describe_scaling_activities", {"AutoScalingGroupName": "ts-gpu", "MaxRecords": ACTIVITIES})]


def test_an_aws_group_is_sized_with_its_minimum_maximum_and_desired_together():
    asg = Asg(_group(desired=None))
    groups = AwsGroups(Session(asg))

    assert groups.desired(AWS) == 0
    groups.set_size(AWS, 3)

    assert asg.calls[-1] == ("update_auto_scaling_group",
                             {"AutoScalingGroupName": "ts-gpu", "MinSize": 3, "MaxSize": 3, "DesiredCapacity": 3})
    asg.group = _group(desired=3)
    assert groups.desired(AWS) == 3


@pytest.mark.parametrize(("fail", "call", "says"), [
    ("DescribeAutoScalingGroups", "desired", "describe of the group ts-gpu (aws us-west-2) failed: "),
    ("DescribeScalingActivities", "state", "describe_scaling_activities of the group ts-gpu (aws us-west-2) failed: "),
    ("UpdateAutoScalingGroup", "set_size", "resize to 0 of the group ts-gpu (aws us-west-2) failed: "),
])
def test_an_aws_call_refused_names_the_call_and_the_group(fail, call, says):
    groups = AwsGroups(Session(Asg(_group(), fail=fail)))

    with pytest.raises(CloudError) as e:
        getattr(groups, call)(AWS, 0) if call == "set_size" else getattr(groups, call)(AWS)

    assert str(e.value).startswith(says) and "AccessDenied" in str(e.value) and "not allowed" in str(e.value)


def test_a_missing_aws_group_says_the_stack_may_be_gone():
    with pytest.raises(CloudError, match=r"^no Auto Scaling group ts-gpu in us-west-2 \(was the stack destroyed\?\)$"):
        AwsGroups(Session(Asg(None))).state(AWS)


def test_aws_clients_are_made_once_per_region_and_identity_with_standard_retries(monkeypatch):
    session = Session(Asg(_group()))
    tokens, roles = [], []

    def web_identity_session(p, loader):
        roles.append((p.access["aws_role_arn"], loader()))
        return Session(Asg(_group(desired=5)))

    monkeypatch.setattr(clouds, "web_identity_session", web_identity_session)
    groups = AwsGroups(session, id_token=lambda p, audience: (tokens.append((p.index, audience)) or (lambda: "tok")))

    assert groups.desired(AWS) == 2 and groups.desired(AWS) == 2
    assert groups.desired(AWS_FAR) == 5 and groups.desired(AWS_FAR) == 5

    [(service, kw)] = session.asked
    assert service == "autoscaling" and kw["region_name"] == "us-west-2"
    assert kw["config"].retries == {"mode": "standard", "max_attempts": AWS_MAX_ATTEMPTS}
    assert (kw["config"].connect_timeout, kw["config"].read_timeout) == (10, 30)
    assert tokens == [(2, "trainstack")] and roles == [(ROLE, "tok")]  # the role assumed once, for its audience


class Response:
    def __init__(self, status: int, body: dict | None = None, text: str = "") -> None:
        self.status_code = status
        self.content = json.dumps(body).encode() if body is not None else text.encode()
        self.text = self.content.decode() or f"status {status}"

    def json(self):
        return json.loads(self.content)


class GceSession:
    """An authorized session that answers Compute Engine's calls from ``answers`` (a list per path
    tail, one answer each call, the last repeated) and records them."""

    def __init__(self, answers: dict[str, list]) -> None:
        self.answers, self.calls = {k: list(v) for k, v in answers.items()}, []  # popped here, not in the cases

    def request(self, method, url, **kw):
        self.calls.append((method, url, kw))
        tail = url.rsplit("/", 1)[-1]
        queue = self.answers[tail]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _gcp(session, pauses, **kw) -> GcpGroups:
    return GcpGroups(session, sleep=pauses.append, **kw)


def test_a_gcp_group_reads_as_its_running_machines_and_its_errors_newest_first():
    session = GceSession({
        "ts-gpu": [Response(200, {"targetSize": 3})],
        "listManagedInstances": [Response(200, {"managedInstances": [
            {"instanceStatus": "RUNNING", "currentAction": "NONE"},
            {"instanceStatus": "RUNNING", "currentAction": "RECREATING"},
            {"instanceStatus": "STAGING", "currentAction": "NONE"},
            {"currentAction": "CREATING", "lastAttempt": {"errors": {"errors": [
                {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "no L4 in us-central1-a"}]}}},
            {"instanceStatus": "RUNNING", "currentAction": "NONE"}]})],
        "listErrors": [Response(200, {"items": [
            {"timestamp": "2027-01-15T07:50:00Z", "error": {"code": "QUOTA_EXCEEDED", "message": "quota"}},
            {"timestamp": "2027-01-15T07:55:00Z", "error": {"code": "STOCKOUT"}},
            {"timestamp": "2027-01-15T07:40:00Z"}]})],
    })
    pauses: list[float] = []

    state = _gcp(session, pauses, api="https://compute.example/v1/").state(GCP)

    assert state == GroupState(running=2, desired=3, failures=(
        LaunchFailure(NOW - 300, "STOCKOUT: "), LaunchFailure(NOW - 600, "QUOTA_EXCEEDED: quota"),
        LaunchFailure(NOW - 1200, ": "), LaunchFailure(None, "ZONE_RESOURCE_POOL_EXHAUSTED: no L4 in us-central1-a")))
    base = "https://compute.example/v1/projects/my-proj/regions/us-central1/instanceGroupManagers/ts-gpu"
    assert [(m, u) for m, u, _ in session.calls] == [
        ("GET", base), ("POST", f"{base}/listManagedInstances"), ("GET", f"{base}/listErrors")]
    assert all(kw == {"timeout": GCP_TIMEOUT_S} for *_, kw in session.calls) and pauses == []


def test_a_gcp_group_is_resized_by_its_size_parameter_and_read_as_its_target_size():
    session = GceSession({"resize": [Response(200)], "ts-gpu": [Response(200, {})]})
    groups = _gcp(session, [])

    groups.set_size(GCP, 2)

    assert session.calls == [("POST", f"{GCP_API}/projects/my-proj/regions/us-central1/instanceGroupManagers/ts-gpu/"
                                      "resize", {"timeout": GCP_TIMEOUT_S, "params": {"size": 2}})]
    assert groups.desired(GCP) == 0  # no targetSize in the answer


def test_gcloud_s_endpoint_override_is_the_api_reached(monkeypatch):
    monkeypatch.setenv(COMPUTE_ENDPOINT_ENV, "https://psc.example/compute/v1/")
    assert GcpGroups(object()).api == "https://psc.example/compute/v1"
    assert GcpGroups(object(), api="https://given/").api == "https://given"
    monkeypatch.delenv(COMPUTE_ENDPOINT_ENV)
    assert GcpGroups(object()).api == GCP_API


@pytest.mark.parametrize(("answers", "pauses", "says"), [
    ([Response(429), Response(500), Response(200, {"targetSize": 1})], [1.0, 2.0], None),
    ([requests.ConnectionError("reset"), Response(200, {"targetSize": 1})], [1.0], None),
    ([TransportError("metadata server down"), Response(200, {"targetSize": 1})], [1.0], None),
    ([RefreshError("503 UNAVAILABLE"), Response(200, {"targetSize": 1})], [1.0], None),
    ([Response(404)], [], "GET get of the group ts-gpu (gcp us-central1) failed: HTTP 404: status 404"),
    ([Response(499)], [], "GET get of the group ts-gpu (gcp us-central1) failed: HTTP 499: status 499"),
    ([Response(503)], [1.0, 2.0, 4.0, 8.0], "GET get of the group ts-gpu (gcp us-central1) failed: HTTP 503: status 503"),
    ([requests.ConnectionError("reset")], [1.0, 2.0, 4.0, 8.0],
     "GET get of the group ts-gpu (gcp us-central1) failed: ConnectionError: reset"),
    ([Response(403, text="z" * 400)], [], f"GET get of the group ts-gpu (gcp us-central1) failed: HTTP 403: {'z' * 300}"),
    ([Response(300)], [], "GET get of the group ts-gpu (gcp us-central1) failed: HTTP 300: status 300"),
    ([TransportError("metadata server down")], [1.0, 2.0, 4.0, 8.0],
     "GET get of the group ts-gpu (gcp us-central1) failed: TransportError: metadata server down"),
    ([TransportError("x" * 400)], [1.0, 2.0, 4.0, 8.0],
     f"GET get of the group ts-gpu (gcp us-central1) failed: TransportError: {'x' * 300}"),
    ([RefreshError("invalid_grant " + "y" * 600)], [],
     f"placement 0 (gcp us-central1): Google refused this function's own credentials: invalid_grant {'y' * 486}"),
    ([RefreshError("invalid_grant: the   token\nis expired")], [],
     "placement 0 (gcp us-central1): Google refused this function's own credentials: invalid_grant: the token is "
     "expired"),
])
def test_gcp_blips_are_retried_with_doubling_pauses_and_verdicts_are_not(answers, pauses, says):
    slept: list[float] = []
    session = GceSession({"ts-gpu": answers})
    groups = _gcp(session, slept)

    if says is None:
        assert groups.desired(GCP) == 1
    else:
        with pytest.raises(CloudError) as e:
            groups.desired(GCP)
        assert str(e.value) == says
    assert slept == pauses and len(session.calls) == len(pauses) + 1  # a pause before each try again


def test_a_refused_federated_credential_names_the_service_account_and_provider(monkeypatch):
    session = GceSession({"ts-eu": [RefreshError("access_denied: the caller is not allowed")]})
    groups = _gcp(object(), [])
    monkeypatch.setattr(groups, "session_for", lambda p: session)

    with pytest.raises(CloudError) as e:
        groups.desired(GCP_FAR)

    assert str(e.value) == (
        "placement 1 (gcp europe-west4): Google refused this function's AWS identity for the service account "
        f"{GCP_FAR.access['service_account']} (provider {GCP_FAR.access['gcp_audience']}): access_denied: the caller "
        "is not allowed")


def test_the_federated_configuration_is_gclouds_for_an_aws_credential_source():
    info = federated_info(GCP_FAR.access, token_url="https://sts.example/v1/token",
                          iam_credentials="https://iam.example/v1/")

    assert info == {
        "type": "external_account", "audience": GCP_FAR.access["gcp_audience"],
        "subject_token_type": "urn:ietf:params:aws:token-type:aws4_request", "token_url": "https://sts.example/v1/token",
        "service_account_impersonation_url": "https://iam.example/v1/projects/-/serviceAccounts/"
                                             "trainstack@my-proj.iam.gserviceaccount.com:generateAccessToken",
        "credential_source": {"environment_id": "aws1", "regional_cred_verification_url":
                              "https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15"}}


def test_a_gcp_placement_on_home_s_cloud_uses_home_s_session_and_a_far_one_its_own_once():
    home = object()
    groups = GcpGroups(home, token_url="https://sts.example/v1/token", iam_credentials="https://iam.example/v1")

    far = groups.session_for(GCP_FAR)

    assert groups.session_for(GCP) is home and groups.session is home
    assert groups.session_for(GCP_FAR) is far and far is not home
    assert far.credentials._audience == GCP_FAR.access["gcp_audience"]
    assert far.credentials._token_url == "https://sts.example/v1/token"
    assert far.credentials.service_account_email == GCP_FAR.access["service_account"]


class Groups:
    """A cloud's groups: records which placement (with or without its access) each call got."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Placement, object]] = []

    def state(self, p):
        self.seen.append(("state", p, None))
        return GroupState(0, 0)

    def desired(self, p):
        self.seen.append(("desired", p, None))
        return 4

    def set_size(self, p, n):
        self.seen.append(("set_size", p, n))


@pytest.mark.parametrize("federate", [True, False])
def test_each_placement_goes_to_its_clouds_groups_with_or_without_federation(federate):
    aws, gcp = Groups(), Groups()
    routed = Clouds(aws=aws, gcp=gcp, federate=federate)

    assert routed.state(AWS_FAR) == GroupState(0, 0) and routed.desired(GCP_FAR) == 4
    routed.set_size(AWS, 2)
    routed.set_size(GCP, 1)

    far_aws = AWS_FAR if federate else Placement(2, "aws", "us-west-2", "ts-far")
    far_gcp = GCP_FAR if federate else Placement(1, "gcp", "europe-west4", "ts-eu", "my-proj")
    assert aws.seen == [("state", far_aws, None), ("set_size", AWS, 2)]
    assert gcp.seen == [("desired", far_gcp, None), ("set_size", GCP, 1)]
    assert [p.access for _, p, _ in aws.seen + gcp.seen] == (
        [AWS_FAR.access, None, GCP_FAR.access, None] if federate else [None] * 4)


def test_a_cloud_without_groups_given_gets_its_own_once():
    routed = Clouds()
    aws, gcp = routed.of(AWS), routed.of(GCP)

    assert isinstance(aws, AwsGroups) and isinstance(gcp, GcpGroups)
    assert routed.of(AWS_FAR) is aws and routed.of(GCP_FAR) is gcp and routed.federate is True


def test_answers_missing_their_lists_read_as_empty_ones():
    asg = Asg({"DesiredCapacity": 1}, [  # a group with no instance yet, a success that was no launch
        {"StatusCode": "Successful", "StartTime": _at(60)},
        {"StatusCode": "Failed", "StartTime": _at(120), "StatusMessage": "no Spot capacity"}])
    assert AwsGroups(Session(asg)).state(AWS) == GroupState(0, 1, (LaunchFailure(NOW - 120, "no Spot capacity"),))

    session = GceSession({"ts-gpu": [Response(200, {"targetSize": 1})], "listManagedInstances": [Response(200, {})],
                          "listErrors": [Response(200, {})]})
    assert _gcp(session, []).state(GCP) == GroupState(0, 1, ())

    session = GceSession({"ts-gpu": [Response(200, {"targetSize": 1})], "listErrors": [Response(200, {})],
                          "listManagedInstances": [Response(200, {"managedInstances": [
                              {"currentAction": "CREATING", "lastAttempt": {"errors": {"errors": [{}]}}}]})]})
    assert _gcp(session, []).state(GCP) == GroupState(0, 1, (LaunchFailure(None, ": "),))


class IdTokens:
    """google-auth's IDTokenCredentials as the metadata server gives them: ``fail`` says a refusal."""

    made: list[tuple] = []
    fail = ""

    def __init__(self, request, audience, **kw) -> None:
        IdTokens.made.append((request, audience, kw))
        self.token = None

    def refresh(self, request) -> None:
        from google.auth.transport.requests import Request

        assert isinstance(request, Request), request  # the metadata server is reached through requests
        if IdTokens.fail:
            raise RefreshError(IdTokens.fail)
        self.token = f"id-token-{len(IdTokens.made)}"


def test_a_google_id_token_comes_from_the_metadata_servers_identity_endpoint_or_names_the_placement(monkeypatch):
    import google.auth.compute_engine

    monkeypatch.setattr(google.auth.compute_engine, "IDTokenCredentials", IdTokens)
    IdTokens.made.clear()
    monkeypatch.setattr(IdTokens, "fail", "")

    load = clouds.google_id_token(AWS_FAR, "trainstack")

    assert load() == "id-token-1" and IdTokens.made == [(None, "trainstack", {"use_metadata_identity_endpoint": True})]
    IdTokens.fail = "metadata server answered 404"
    with pytest.raises(CloudError) as e:
        load()
    assert str(e.value) == ("placement 2 (aws us-west-2): no Google ID token for the audience 'trainstack' from the "
                            "metadata server: metadata server answered 404")


class Fetcher:
    """botocore's AssumeRoleWithWebIdentityCredentialFetcher: records how it was made, answers or refuses."""

    made: list = []
    refuse = False

    def __init__(self, client_creator, web_identity_token_loader, role_arn, extra_args=None) -> None:
        Fetcher.made.append((client_creator, web_identity_token_loader, role_arn, extra_args))

    def fetch_credentials(self) -> dict:
        if Fetcher.refuse:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Not authorized to perform "
                                         "sts:AssumeRoleWithWebIdentity"}}, "AssumeRoleWithWebIdentity")
        return {"access_key": "ASIAFAKE", "secret_key": "s", "token": "t",
                "expiry_time": (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()}


def test_an_aws_group_from_gcp_is_reached_as_the_role_assumed_with_googles_token(monkeypatch):
    from botocore import credentials as botocore_credentials
    from botocore.config import Config

    monkeypatch.setattr(botocore_credentials, "AssumeRoleWithWebIdentityCredentialFetcher", Fetcher)
    Fetcher.made.clear()
    monkeypatch.setattr(Fetcher, "refuse", False)
    loader = lambda: "google-id-token"  # noqa: E731

    session = clouds.web_identity_session(AWS_FAR, loader)

    frozen = session.get_credentials().get_frozen_credentials()
    assert (frozen.access_key, frozen.secret_key, frozen.token) == ("ASIAFAKE", "s", "t")
    assert session.get_credentials().method == "assume-role-with-web-identity"
    [(make_client, token_loader, role, extra)] = Fetcher.made
    assert (token_loader, role, extra) == (loader, ROLE, {"RoleSessionName": "trainstack-controller"})
    sts = make_client("sts")
    retries = {"mode": "standard", "total_max_attempts": AWS_MAX_ATTEMPTS + 1}  # botocore counts the first call too
    assert (sts.meta.region_name, sts.meta.config.retries, sts.meta.config.read_timeout) == ("us-west-2", retries, 30)
    merged = make_client("sts", config=Config(read_timeout=5))  # botocore's own config merged over ours
    assert (merged.meta.region_name, merged.meta.config.retries, merged.meta.config.read_timeout) == (
        "us-west-2", retries, 5)


def test_aws_refusing_the_role_names_the_placement_role_and_audience(monkeypatch):
    from botocore import credentials as botocore_credentials

    monkeypatch.setattr(botocore_credentials, "AssumeRoleWithWebIdentityCredentialFetcher", Fetcher)
    monkeypatch.setattr(Fetcher, "refuse", True)

    session = clouds.web_identity_session(AWS_FAR, lambda: "token")

    with pytest.raises(CloudError) as e:
        session.get_credentials().get_frozen_credentials()
    assert str(e.value) == (
        f"placement 2 (aws us-west-2): AWS refused the role {ROLE} for this function's Google identity (audience "
        "'trainstack'): An error occurred (AccessDenied) when calling the AssumeRoleWithWebIdentity operation: Not "
        "authorized to perform sts:AssumeRoleWithWebIdentity")


def test_each_far_identity_gets_a_session_of_its_own_and_keeps_it(monkeypatch):
    made = []
    monkeypatch.setattr(clouds, "web_identity_session", lambda p, loader: made.append(p.group) or Session(Asg(_group())))
    groups = AwsGroups(Session(Asg(_group())), id_token=lambda p, audience: lambda: "tok")
    other = Placement(index=3, cloud="aws", region="us-west-2", group="ts-other",
                      access={"aws_role_arn": ROLE.replace("controller", "other"), "audience": "trainstack"})
    same_role = Placement(index=4, cloud="aws", region="eu-west-1", group="ts-eu", access=AWS_FAR.access)

    for p in (AWS_FAR, other, same_role, AWS_FAR):
        groups.desired(p)

    assert made == ["ts-far", "ts-other"]  # one per role, whatever its region

    gcp = GcpGroups(object(), iam_credentials="https://iam.example/v1")
    second = Placement(index=2, cloud="gcp", region="asia-east1", group="ts-asia", project="my-proj", access={
        **GCP_FAR.access, "service_account": "trainstack-2@my-proj.iam.gserviceaccount.com"})

    far, far2 = gcp.session_for(GCP_FAR), gcp.session_for(second)

    assert far is not far2 and gcp.session_for(GCP_FAR) is far
    assert far.credentials.scopes == [clouds.GCP_SCOPE]
    assert far2.credentials._service_account_impersonation_url == (
        "https://iam.example/v1/projects/-/serviceAccounts/trainstack-2@my-proj.iam.gserviceaccount.com:"
        "generateAccessToken")
