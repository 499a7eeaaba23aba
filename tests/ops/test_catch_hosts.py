"""Finding a stack's run, group and machines (`ops/hosts.py`) with fake `pulumi` and `gcloud` CLIs
and a stubbed EC2 / Auto Scaling client: every message an operator can get, every argument the
CLIs are given, and the machines in the order the commands use them.

The fakes are small shell scripts on PATH that record their arguments and print a canned
answer, so a changed flag, filter or word in a message fails here without a cloud.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from components.project import ROOT
from ops import hosts
from tests.ops.test_status import fake_pulumi


@pytest.fixture(autouse=True)
def _fresh_outputs():
    hosts._outputs_once.cache_clear()
    yield
    hosts._outputs_once.cache_clear()


def _on_path(monkeypatch, bin_dir: Path) -> None:
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")


def _gcloud(bin_dir: Path, answers: dict[str, object], *, rc: int = 0, stderr: str = "") -> Path:
    """A `gcloud` that appends its arguments to `calls` and prints the answer of the first key its
    arguments contain (`describe`, `list-errors`, `instances list`)."""
    bin_dir.mkdir(exist_ok=True)
    cases = []
    for i, (key, doc) in enumerate(answers.items()):
        (bin_dir / f"answer{i}.json").write_text("" if doc == "" else json.dumps(doc))  # "": prints nothing
        cases.append(f'  *"{key}"*) cat {bin_dir}/answer{i}.json;;')
    script = bin_dir / "gcloud"
    script.write_text("#!/bin/sh\n"
                      f'echo "$@" >> {bin_dir}/calls\n'
                      f"printf '%s' '{stderr}' >&2\n"
                      f"[ {rc} -eq 0 ] || exit {rc}\n"
                      'case "$*" in\n' + "\n".join(cases) + "\n  *) exit 2;;\nesac\n")
    script.chmod(0o755)
    return bin_dir / "calls"


# -- a machine's address -----------------------------------------------------------------


def test_a_machine_is_reached_by_its_public_address_or_its_private_one_when_asked():
    h = hosts.Host("i-1", "3.3.3.3", "10.0.0.1")
    assert (h.address(), h.address(private=True)) == ("3.3.3.3", "10.0.0.1")
    with pytest.raises(hosts.HostsError) as e:
        hosts.Host("i-2", None, "10.0.0.2").address()
    assert str(e.value) == "machine i-2 has no public IP; reach it over a VPN with --private"
    with pytest.raises(hosts.HostsError) as e:
        hosts.Host("i-3", "3.3.3.4", "").address(private=True)
    assert str(e.value) == "machine i-3 has no private IP"


# -- the operator's CLIs -------------------------------------------------------------------


def test_a_cli_that_fails_is_one_line_with_its_last_words(tmp_path):
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\necho 'first line' >&2\necho 'error: the last line' >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(hosts.HostsError) as e:
        hosts._run_cli([str(script)], "tool do", 30)
    assert str(e.value) == "tool do failed: error: the last line"
    script.write_text("#!/bin/sh\nexit 1\n")
    with pytest.raises(hosts.HostsError) as e:
        hosts._run_cli([str(script)], "tool do", 30)
    assert str(e.value) == "tool do failed: no message"


def test_a_cli_that_hangs_is_stopped_at_its_bound(tmp_path):
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    with pytest.raises(hosts.HostsError) as e:
        hosts._run_cli([str(script)], "tool do", 0.3)
    assert str(e.value) == "tool do took over 0.3 s; try again"


def test_the_stack_outputs_come_from_pulumi_run_in_the_project_folder(tmp_path, monkeypatch):
    args_file = fake_pulumi(tmp_path / "bin", {"runUri": "s3://b/runs/dev"})
    _on_path(monkeypatch, tmp_path / "bin")
    assert hosts.stack_outputs("dev") == {"runUri": "s3://b/runs/dev"}
    assert args_file.read_text().splitlines() == [str(ROOT), "stack", "output", "--json", "--stack", "dev"]
    assert hosts.stack_outputs("dev", cwd=tmp_path) == {"runUri": "s3://b/runs/dev"}
    assert args_file.read_text().splitlines()[0] == str(tmp_path)


@pytest.mark.parametrize(("stdout", "rc", "stderr", "message"), [
    ("not json", 0, "", "pulumi stack output --stack dev did not print JSON"),
    ("[1]", 0, "", "pulumi stack output --stack dev printed list, not an object"),
    ("", 255, "error: no stack named 'dev' found", "pulumi stack output --stack dev failed: error: no stack named "
                                                   "'dev' found"),
])
def test_pulumi_output_that_is_no_object_is_named(tmp_path, monkeypatch, stdout, rc, stderr, message):
    fake_pulumi(tmp_path / "bin", None, rc=rc, stderr=stderr)
    (tmp_path / "bin" / "pulumi-stdout").write_text(stdout)
    _on_path(monkeypatch, tmp_path / "bin")
    with pytest.raises(hosts.HostsError) as e:
        hosts.stack_outputs("dev")
    assert str(e.value) == message


def test_a_stack_with_no_outputs_yet_has_none(tmp_path, monkeypatch):
    fake_pulumi(tmp_path / "bin", None)
    _on_path(monkeypatch, tmp_path / "bin")
    assert hosts.stack_outputs("dev") == {}
    with pytest.raises(hosts.HostsError) as e:
        hosts.run_uri_for_stack("dev")
    assert str(e.value) == "stack dev has no runUri output; run `pulumi up` for it first"


def test_no_pulumi_on_path_says_what_to_install_or_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(hosts.HostsError) as e:
        hosts.stack_outputs("dev")
    assert str(e.value) == ("the pulumi CLI is not on PATH, so --stack cannot be resolved; install it "
                            "(https://www.pulumi.com/docs/install/) or pass --run-uri / --host")


@pytest.mark.parametrize("value", [None, "", 3, ["s3://b"]])
def test_an_output_that_is_not_a_name_is_missing(value):
    with pytest.raises(hosts.HostsError) as e:
        hosts.require_output({"groupName": value}, "groupName", "prod")
    assert str(e.value) == "stack prod has no groupName output; run `pulumi up` for it first"
    assert hosts.require_output({"groupName": "g"}, "groupName", "prod") == "g"


@pytest.mark.parametrize(("uri", "cloud"), [("s3://b/runs/r", "aws"), ("gs://b/runs/r", "gcp"), ("GS://b", "gcp"),
                                           ("s3://b/runs/from-gs://x", "aws")])
def test_the_cloud_comes_from_the_run_uris_scheme(uri, cloud):
    assert hosts.cloud_of(uri) == cloud


def test_a_local_run_has_no_machines_to_find():
    with pytest.raises(hosts.HostsError) as e:
        hosts.cloud_of("file:///tmp/runs/r")
    assert str(e.value) == "run URI 'file:///tmp/runs/r' is not on a cloud (s3:// or gs://): no machines to find"


# -- AWS ------------------------------------------------------------------------------------


def _client(service: str, monkeypatch) -> tuple[object, Stubber]:
    """A stubbed boto3 client, and boto3 sessions that hand it out."""
    client = boto3.client(service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    stub = Stubber(client)
    regions = []

    class Session:
        def client(self, name, region_name=None):
            assert name == service
            regions.append(region_name)
            return client

    monkeypatch.setattr(boto3.session, "Session", Session)
    client.regions = regions
    return client, stub


def _instance(iid: str, launched: datetime, public: str | None = "3.3.3.3", zone: str | None = "us-east-1b") -> dict:
    inst = {"InstanceId": iid, "PrivateIpAddress": "10.0.0.9", "LaunchTime": launched}
    if public:
        inst["PublicIpAddress"] = public
    if zone:
        inst["Placement"] = {"AvailabilityZone": zone}
    return inst


def test_aws_machines_are_the_groups_running_instances_oldest_first(monkeypatch):
    client, stub = _client("ec2", monkeypatch)
    filters = [{"Name": "tag:aws:autoscaling:groupName", "Values": ["g"]},
               {"Name": "instance-state-name", "Values": ["running"]}]
    t1, t2 = datetime(2026, 1, 1, 10), datetime(2026, 1, 1, 11)
    stub.add_response("describe_instances", {"Reservations": [
        {"Instances": [_instance("i-c", t2), _instance("i-b", t1, public=None, zone=None)]},
        {"Instances": [_instance("i-a", t1)]}, {}]}, {"Filters": filters})
    with stub:
        found = hosts.aws_hosts("g", "eu-west-1")
    assert client.regions == ["eu-west-1"]
    assert found == [hosts.Host("i-a", "3.3.3.3", "10.0.0.9", str(t1), "us-east-1b"),
                     hosts.Host("i-b", None, "10.0.0.9", str(t1), ""),
                     hosts.Host("i-c", "3.3.3.3", "10.0.0.9", str(t2), "us-east-1b")]


def test_an_aws_page_without_reservations_or_times_still_lists(monkeypatch):
    client, stub = _client("ec2", monkeypatch)
    filters = [{"Name": "tag:aws:autoscaling:groupName", "Values": ["g"]},
               {"Name": "instance-state-name", "Values": ["running"]}]
    stub.add_response("describe_instances", {}, {"Filters": filters})
    with stub:
        assert hosts.aws_hosts("g") == []
    stub.add_response("describe_instances", {"Reservations": [{"Instances": [
        {"InstanceId": "i-z", "LaunchTime": datetime(2026, 1, 1)}, {"InstanceId": "i-y"}]}]}, {"Filters": filters})
    with stub:
        assert [(h.name, h.launched) for h in hosts.aws_hosts("g")] == [("i-y", ""), ("i-z", "2026-01-01 00:00:00")]


def test_aws_machines_that_cannot_be_listed_name_the_group(monkeypatch):
    client, stub = _client("ec2", monkeypatch)
    stub.add_client_error("describe_instances", "UnauthorizedOperation", "You are not authorized")
    with stub, pytest.raises(hosts.HostsError) as e:
        hosts.aws_hosts("g")
    assert str(e.value).startswith("cannot list the instances of g: An error occurred (UnauthorizedOperation)")


def _group(instances: list[str], desired: int = 2) -> dict:
    return {"AutoScalingGroups": [{
        "AutoScalingGroupName": "g", "MinSize": 0, "MaxSize": 4, "DesiredCapacity": desired, "DefaultCooldown": 300,
        "AvailabilityZones": ["us-east-1a"], "HealthCheckType": "EC2", "CreatedTime": datetime(2026, 1, 1),
        "Instances": [{"InstanceId": f"i-{i}", "AvailabilityZone": "us-east-1a", "LifecycleState": state,
                       "HealthStatus": "Healthy", "ProtectedFromScaleIn": False}
                      for i, state in enumerate(instances)]}]}


def _activity(n: int, code: str, *, message: str = "", description: str = "Launching a new EC2 instance",
              hour: int | None = None) -> dict:
    a = {"ActivityId": f"a{n}", "AutoScalingGroupName": "g", "Cause": "c", "StatusCode": code,
         "Description": description, "StartTime": datetime(2026, 1, 1, n if hour is None else hour, 5)}
    return {**a, "StatusMessage": message} if message else a


def test_the_aws_group_counts_machines_in_service_and_its_failures_newest_first(monkeypatch):
    client, stub = _client("autoscaling", monkeypatch)
    stub.add_response("describe_auto_scaling_groups", _group(["InService", "Pending", "InService"]),
                      {"AutoScalingGroupNames": ["g"]})
    long = "x " * 150
    stub.add_response("describe_scaling_activities", {"Activities": [
        _activity(10, "Successful", description="Terminating an EC2 instance"),
        _activity(11, "Cancelled", message="  spaced\n  out  "),
        _activity(13, "Failed", message=long), _activity(9, "Failed", message="after a termination"),
        _activity(12, "InProgress"), _activity(8, "Successful"), _activity(7, "Failed", message="overcome")]},
        {"AutoScalingGroupName": "g", "MaxRecords": 20})
    with stub:
        state = hosts.aws_group_state("g", "us-west-2", limit=5)
    assert client.regions == ["us-west-2"]
    assert (state.running, state.desired) == (2, 2)
    # Newest first, up to the last successful launch (a successful termination is no launch): the
    # failure before that launch was overcome.
    assert state.launch_failures == ("13:05 " + ("x " * 99)[:197] + "...", "11:05 spaced out",
                                     "09:05 after a termination")
    for limit, shown in [(None, ("05:05 m5", "04:05 m4", "03:05 Launching a new EC2 instance")),
                         (2, ("05:05 m5", "04:05 m4"))]:
        stub.add_response("describe_auto_scaling_groups", _group([]), {"AutoScalingGroupNames": ["g"]})
        stub.add_response("describe_scaling_activities", {"Activities": [
            _activity(i, "Failed", message=f"m{i}" if i != 3 else "", description="" if i != 3 else
                      "Launching a new EC2 instance") for i in range(1, 6)]},
            {"AutoScalingGroupName": "g", "MaxRecords": 20})
        with stub:
            state = hosts.aws_group_state("g", client=client, **({"limit": limit} if limit else {}))
        assert state.launch_failures == shown


class _Answers:
    """An Auto Scaling client answering as the parsed API does when lists are empty (it leaves them out)."""

    def __init__(self, group: dict, activities: list[dict]) -> None:
        self.group, self.activities = group, activities

    def describe_auto_scaling_groups(self, AutoScalingGroupNames):  # noqa: N803 - boto3's argument names
        return {"AutoScalingGroups": [self.group]}

    def describe_scaling_activities(self, AutoScalingGroupName, MaxRecords):  # noqa: N803
        return {"Activities": self.activities}


def test_a_group_without_instances_and_a_failure_without_a_time():
    state = hosts.aws_group_state("g", client=_Answers({"DesiredCapacity": 1}, [{"StatusCode": "Failed"}]))
    assert state == hosts.GroupState(running=0, desired=1, launch_failures=("launch failed",))


def test_a_failure_without_any_words_or_time_still_counts(monkeypatch):
    client, stub = _client("autoscaling", monkeypatch)
    stub.add_response("describe_auto_scaling_groups", _group([]), {"AutoScalingGroupNames": ["g"]})
    activity = {"ActivityId": "a", "AutoScalingGroupName": "g", "Cause": "c", "StatusCode": "Failed",
                "StartTime": datetime(2026, 1, 1, 6, 30)}
    stub.add_response("describe_scaling_activities", {"Activities": [activity]},
                      {"AutoScalingGroupName": "g", "MaxRecords": 20})
    with stub:
        state = hosts.aws_group_state("g", client=client)
    assert state.launch_failures == ("06:30 launch failed",)


def test_a_line_of_exactly_the_limit_is_kept_whole():
    assert hosts._one_line("y" * 200) == "y" * 200
    assert hosts._one_line("y" * 201) == "y" * 197 + "..."
    assert hosts._one_line("a\n b", limit=3) == "a b"


@pytest.mark.parametrize(("error", "message"), [
    (None, "no Auto Scaling group g (was the stack destroyed?)"),
    ("AccessDenied", "cannot read the group g: An error occurred (AccessDenied)"),
])
def test_an_aws_group_that_cannot_be_read_says_why(monkeypatch, error, message):
    client, stub = _client("autoscaling", monkeypatch)
    if error:
        stub.add_client_error("describe_auto_scaling_groups", error, "no")
    else:
        stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": []}, {"AutoScalingGroupNames": ["g"]})
        stub.add_response("describe_scaling_activities", {"Activities": []},
                          {"AutoScalingGroupName": "g", "MaxRecords": 20})
    with stub, pytest.raises(hosts.HostsError) as e:
        hosts.aws_group_state("g", client=client)
    assert str(e.value).startswith(message)


# -- GCP ------------------------------------------------------------------------------------


def _gce(name: str, created: str, *, nat: str | None = "34.1.1.1", nic: bool = True) -> dict:
    inst = {"name": name, "creationTimestamp": created, "zone": "https://x/zones/europe-west4-b"}
    if nic:
        configs = [{"name": "none"}, {"natIP": nat}] if nat else [{"name": "none"}]
        inst["networkInterfaces"] = [{"networkIP": "10.1.0.2", "accessConfigs": configs}]
    return inst


def test_gcp_machines_are_the_groups_running_instances_oldest_first(tmp_path, monkeypatch):
    calls = _gcloud(tmp_path / "bin", {"instances list": [
        _gce("g-bbbb", "2026-01-01T10:00"), _gce("g-aaaa", "2026-01-01T10:00", nat=None),
        _gce("g-cccc", "2026-01-01T09:00", nic=False)]})
    _on_path(monkeypatch, tmp_path / "bin")
    found = hosts.gcp_hosts("g.x", "europe-west4", "proj-1")
    assert found == [hosts.Host("g-cccc", None, None, "2026-01-01T09:00", "europe-west4-b"),
                     hosts.Host("g-aaaa", None, "10.1.0.2", "2026-01-01T10:00", "europe-west4-b"),
                     hosts.Host("g-bbbb", "34.1.1.1", "10.1.0.2", "2026-01-01T10:00", "europe-west4-b")]
    assert calls.read_text().splitlines() == [
        "compute instances list --project proj-1 --format=json "
        "--filter=name~'^g\\.x-[a-z0-9]{4}$' AND status=RUNNING AND zone~'/zones/europe\\-west4-'"]


def test_gcp_machines_of_a_long_group_name_match_gces_cut_base(tmp_path, monkeypatch):
    calls = _gcloud(tmp_path / "bin", {"instances list": []})
    _on_path(monkeypatch, tmp_path / "bin")
    assert hosts.gcp_hosts("a" * 60) == []
    assert calls.read_text().splitlines() == [
        f"compute instances list --format=json --filter=name~'^{'a' * 54}-[a-z0-9]{{4}}$' AND status=RUNNING"]


def test_no_gcloud_on_path_says_to_pass_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(hosts.HostsError) as e:
        hosts.gcp_hosts("g")
    assert str(e.value) == "the gcloud CLI is not on PATH, so the stack's machines cannot be listed; pass --host"
    with pytest.raises(hosts.HostsError) as e:
        hosts.gcp_group_state("g")
    assert str(e.value) == "the gcloud CLI is not on PATH, so the stack's group cannot be read"


def test_the_gcp_group_reads_its_size_errors_and_running_machines(tmp_path, monkeypatch):
    calls = _gcloud(tmp_path / "bin", {
        "describe": {"targetSize": 2},
        "list-errors": [
            {"timestamp": "2026-11-30T20:01:02.000-08:00", "error": {"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                                                                    "message": "no  room"}},
            {"error": {"code": "QUOTA_EXCEEDED", "message": "GPUS_ALL_REGIONS"}}, {"timestamp": "x"},
            {"timestamp": "2026-11-30T19:00:00", "error": {"code": "A", "message": "b"}}],
        "instances list": [_gce("g-aaaa", "2026-01-01T10:00")]})
    _on_path(monkeypatch, tmp_path / "bin")
    state = hosts.gcp_group_state("g", "us-central1", project="p-1")
    assert state == hosts.GroupState(running=1, desired=2, launch_failures=(
        "20:01 ZONE_RESOURCE_POOL_EXHAUSTED: no room", "QUOTA_EXCEEDED: GPUS_ALL_REGIONS", ":"))
    assert calls.read_text().splitlines()[:2] == [
        "compute instance-groups managed describe g --region us-central1 --project p-1 --format=json",
        "compute instance-groups managed list-errors --limit=3 g --region us-central1 --project p-1 --format=json"]
    (tmp_path / "bin" / "calls").unlink()
    assert hosts.gcp_group_state("g", limit=1).launch_failures == ("20:01 ZONE_RESOURCE_POOL_EXHAUSTED: no room",)
    assert calls.read_text().splitlines()[:2] == [
        "compute instance-groups managed describe g --format=json",
        "compute instance-groups managed list-errors --limit=1 g --format=json"]


@pytest.mark.parametrize("said", [None, ""])
def test_a_gcp_group_with_nothing_to_say_is_empty(tmp_path, monkeypatch, said):
    _gcloud(tmp_path / "bin", {"describe": said, "list-errors": {"not": "a list"}, "instances list": ""})
    _on_path(monkeypatch, tmp_path / "bin")
    assert hosts.gcp_group_state("g") == hosts.GroupState(running=0, desired=None, launch_failures=())
    assert hosts.gcp_hosts("g") == []


def test_a_gce_instance_without_a_time_or_zone_still_counts(tmp_path, monkeypatch):
    _gcloud(tmp_path / "bin", {"instances list": [{"name": "g-aaaa"}, {"name": "g-bbbb", "zone": "europe-west4-b"}]})
    _on_path(monkeypatch, tmp_path / "bin")
    assert hosts.gcp_hosts("g") == [hosts.Host("g-aaaa", None, None, "", ""),
                                    hosts.Host("g-bbbb", None, None, "", "europe-west4-b")]


def test_gce_machines_that_cannot_be_listed_name_the_call(tmp_path, monkeypatch):
    _gcloud(tmp_path / "bin", {}, rc=1, stderr="ERROR: (gcloud.compute.instances.list) PERMISSION_DENIED")
    _on_path(monkeypatch, tmp_path / "bin")
    with pytest.raises(hosts.HostsError) as e:
        hosts.gcp_hosts("g")
    assert str(e.value) == "gcloud compute instances list failed: ERROR: (gcloud.compute.instances.list) PERMISSION_DENIED"


@pytest.mark.parametrize(("cli", "bound", "call", "said"), [
    ("gcloud", "GCLOUD_TIMEOUT_S", lambda: hosts.gcp_hosts("g"), "gcloud compute instances list"),
    ("pulumi", "PULUMI_TIMEOUT_S", lambda: hosts.stack_outputs("dev"), "pulumi stack output --stack dev"),
])
def test_a_gce_listing_or_pulumi_that_hangs_is_stopped(tmp_path, monkeypatch, cli, bound, call, said):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / cli).write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / cli).chmod(0o755)
    _on_path(monkeypatch, bin_dir)
    monkeypatch.setattr(hosts, bound, 0.3)
    with pytest.raises(hosts.HostsError) as e:
        call()
    assert str(e.value) == f"{said} took over 0.3 s; try again"


def test_a_gcp_group_that_cannot_be_read_is_one_line_naming_the_call(tmp_path, monkeypatch):
    _gcloud(tmp_path / "bin", {}, rc=1, stderr="ERROR: (gcloud) The group g was not found")
    _on_path(monkeypatch, tmp_path / "bin")
    with pytest.raises(hosts.HostsError) as e:
        hosts.gcp_group_state("g")
    assert str(e.value) == ("gcloud compute instance-groups managed describe g failed: ERROR: (gcloud) The group g "
                            "was not found")
    _gcloud(tmp_path / "bin", {}, rc=1)
    with pytest.raises(hosts.HostsError) as e:
        hosts.gcp_group_state("g")
    assert str(e.value) == "gcloud compute instance-groups managed describe g failed: no message"


def test_a_gcp_group_read_that_hangs_is_stopped(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / "gcloud").chmod(0o755)
    _on_path(monkeypatch, bin_dir)
    monkeypatch.setattr(hosts, "GCLOUD_TIMEOUT_S", 0.3)
    with pytest.raises(hosts.HostsError) as e:
        hosts.gcp_group_state("g")
    assert str(e.value) == "gcloud compute instance-groups managed describe took over 0.3 s"


# -- a stack's group and machines -------------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch):
    """The group readers and machine listers, recording how they were called."""
    calls = []
    for name in ("aws_group_state", "gcp_group_state", "aws_hosts", "gcp_hosts"):
        def fake(*args, _name=name, **kw):
            calls.append((_name, args, kw))
            return [hosts.Host("m", "1.1.1.1", "10.0.0.1")] if _name.endswith("hosts") else _name
        monkeypatch.setattr(hosts, name, fake)
    return calls


@pytest.mark.parametrize(("outputs", "call"), [
    ({"runUri": "s3://b/runs/r", "groupName": "g", "region": "eu-west-1"}, ("aws_group_state", ("g", "eu-west-1"), {})),
    ({"runUri": "s3://b/runs/r", "groupName": "g", "region": ""}, ("aws_group_state", ("g", None), {})),
    ({"runUri": "gs://b/runs/r", "groupName": "g", "region": "us-central1", "project": "p"},
     ("gcp_group_state", ("g", "us-central1"), {"project": "p"})),
])
def test_the_stacks_group_is_read_on_its_cloud_in_its_region(tmp_path, monkeypatch, recorded, outputs, call):
    args_file = fake_pulumi(tmp_path / "bin", outputs)
    _on_path(monkeypatch, tmp_path / "bin")
    assert hosts.stack_group_state("dev") == call[0]
    assert recorded == [call]
    # A watch reads the outputs once: the second read asks pulumi nothing.
    args_file.unlink()
    assert hosts.stack_group_state("dev") == call[0]
    assert not args_file.exists()


@pytest.mark.parametrize(("outputs", "missing"), [({"runUri": "s3://b/runs/r"}, "groupName"),
                                                  ({"groupName": "g"}, "runUri")])
def test_a_stack_without_a_group_or_run_output_says_so(tmp_path, monkeypatch, recorded, outputs, missing):
    fake_pulumi(tmp_path / "bin", outputs)
    _on_path(monkeypatch, tmp_path / "bin")
    with pytest.raises(hosts.HostsError, match=f"^stack dev has no {missing} output"):
        hosts.stack_group_state("dev")
    with pytest.raises(hosts.HostsError, match=f"^stack dev has no {missing} output"):
        hosts.stack_hosts("dev")


def _placements() -> dict:
    return {"run_uri": "s3://b/runs/r", "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": "us-east-1", "group": "g0"},
        {"cloud": "aws", "region": "us-west-2", "group": "g1"},
        {"cloud": "gcp", "region": "us-central1", "project": "p", "group": "g2",
         "access": {"gcp_audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/"
                                    "pool/providers/prov", "service_account": "ctrl-sa@p.iam.gserviceaccount.com"}}]}


@pytest.mark.parametrize("as_text", [False, True])
def test_a_placements_group_is_read_where_the_run_moved(tmp_path, monkeypatch, recorded, as_text):
    doc = _placements()
    fake_pulumi(tmp_path / "bin", {"runUri": "s3://b/runs/r", "placements": json.dumps(doc) if as_text else doc})
    _on_path(monkeypatch, tmp_path / "bin")
    hosts.placement_group_state("dev", 1)
    hosts.placement_group_state("dev", 2)
    assert recorded == [("aws_group_state", ("g1", "us-west-2"), {}),
                        ("gcp_group_state", ("g2", "us-central1"), {"project": "p"})]
    with pytest.raises(hosts.HostsError) as e:
        hosts.placement_group_state("dev", 3)
    assert str(e.value) == "stack dev's placements output has no placement 3: tuple index out of range"


def test_a_stack_without_placements_has_no_placement_group(tmp_path, monkeypatch, recorded):
    fake_pulumi(tmp_path / "bin", {"runUri": "s3://b/runs/r"})
    _on_path(monkeypatch, tmp_path / "bin")
    with pytest.raises(hosts.HostsError) as e:
        hosts.placement_group_state("dev", 1)
    assert str(e.value).startswith("stack dev's placements output has no placement 1: TRAINSTACK_PLACEMENTS: ")


@pytest.mark.parametrize(("outputs", "call"), [
    ({"runUri": "s3://b/runs/r", "groupName": "g", "region": "eu-west-1"}, ("aws_hosts", ("g", "eu-west-1"), {})),
    ({"runUri": "s3://b/runs/r", "groupName": "g"}, ("aws_hosts", ("g", None), {})),
    ({"runUri": "gs://b/runs/r", "groupName": "g", "region": "us-central1", "project": "p"},
     ("gcp_hosts", ("g", "us-central1", "p"), {})),
])
def test_the_stacks_machines_are_listed_on_its_cloud(tmp_path, monkeypatch, recorded, outputs, call):
    fake_pulumi(tmp_path / "bin", outputs)
    _on_path(monkeypatch, tmp_path / "bin")
    assert hosts.stack_hosts("dev") == [hosts.Host("m", "1.1.1.1", "10.0.0.1")]
    assert recorded == [call]


def test_the_machines_to_reach_are_the_host_or_the_stacks(tmp_path, monkeypatch, recorded):
    fake_pulumi(tmp_path / "bin", {"runUri": "s3://b/runs/r", "groupName": "g"})
    _on_path(monkeypatch, tmp_path / "bin")
    assert hosts.machine_addresses(argparse.Namespace(host="h.example", stack=None, private=False)) == ["h.example"]
    assert recorded == []
    assert hosts.machine_addresses(argparse.Namespace(host=None, stack="dev", private=False)) == ["1.1.1.1"]
    assert hosts.machine_addresses(argparse.Namespace(host=None, stack="dev", private=True)) == ["10.0.0.1"]
    monkeypatch.setattr(hosts, "aws_hosts", lambda *a, **k: [])
    with pytest.raises(hosts.HostsError) as e:
        hosts.machine_addresses(argparse.Namespace(host=None, stack="dev", private=False))
    assert str(e.value) == "stack dev has no running machine (the run may be finished or waiting for spot)"


# -- the shared options -----------------------------------------------------------------------


def _parser(extra_source: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ops logs")
    if extra_source:
        hosts.add_machine_args(p, extra_source=True)
    else:
        hosts.add_machine_args(p)  # as `logs` and `tunnel` call it: no --run-uri
    return p


def test_the_machine_options_and_their_defaults():
    args = _parser().parse_args(["--stack", "dev"])
    assert (args.stack, args.host, args.user, args.key, args.port, args.private, args.accept_new_host_key) == (
        "dev", None, "ubuntu", None, 22, False, False)
    args = _parser().parse_args(["--host", "h", "--user", "me", "--key", "k", "--port", "2222", "--private",
                                 "--accept-new-host-key"])
    assert (args.host, args.user, args.key, args.port, args.private, args.accept_new_host_key) == (
        "h", "me", "k", 2222, True, True)
    assert _parser(extra_source=True).parse_args(["--run-uri", "s3://b/runs/r"]).run_uri == "s3://b/runs/r"


@pytest.mark.parametrize(("argv", "error"), [
    ([], "one of the arguments --stack --host is required"),
    (["--stack", "dev", "--host", "h"], "argument --host: not allowed with argument --stack"),
    (["--stack", "dev", "--run-uri", "s3://b/runs/r"], "unrecognized arguments: --run-uri"),
])
def test_the_machine_options_need_one_place_to_look(capsys, argv, error):
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    assert error in capsys.readouterr().err


def test_the_machine_options_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per flag: argparse wraps at hyphens
    with pytest.raises(SystemExit):
        _parser(extra_source=True).parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for line in ["--stack STACK stack name: its running machines are found from its outputs",
                 "--host HOST address of the machine to reach (skips the lookup)",
                 "--run-uri RUN_URI the run's URI (s3://, gs://, file://), for --from-bucket",
                 "--user USER SSH user (default: ubuntu)",
                 "--key KEY SSH private key file (default: ssh-agent and ~/.ssh/id_*)",
                 "--port PORT SSH port (default: 22)",
                 "--private use the machines' private IPs (VPN, bastion)",
                 "--accept-new-host-key trust a machine not yet in ~/.ssh/known_hosts and save its key there (a "
                 "changed key is still refused)"]:
        assert line in text, line
