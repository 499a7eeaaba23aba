"""The controller function's own grants, whole (what it may read, write and size, and up to what
size), and its entry point in this process: the configuration read from its variable, the tick's
answer printed and returned, and a bad configuration said in one line with exit 2.

The grants' enforcement under IAM is tests/iam/test_controller_identity.py's; the handler in a
fresh process as a function runs it, test_handler.py's.
"""

from __future__ import annotations

import io
import json
import sys

import pytest

from controller import grants, handler
from controller.clouds import Clouds
from controller.config import ENV_VAR
from controller.decide import GroupState
from runfolder import layout
from runfolder.storage import open_store
from tests.controller.helpers import FakeGroups, trained

GROUPS = [("us-east-1", "ts-home-gpu"), ("us-west-2", "ts-west-gpu")]
SIZE_GROUPS = {"Sid": "SizeGroups", "Effect": "Allow", "Action": ["autoscaling:UpdateAutoScalingGroup"],
               "Resource": ["arn:aws-cn:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/"
                            "ts-home-gpu",
                            "arn:aws-cn:autoscaling:us-west-2:123456789012:autoScalingGroup:*:autoScalingGroupName/"
                            "ts-west-gpu"],
               "Condition": {"NumericLessThanEquals": {"autoscaling:MinSize": "3", "autoscaling:MaxSize": "3"}}}
READ_GROUPS = {"Sid": "ReadGroups", "Effect": "Allow", "Resource": "*",
               "Action": ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeScalingActivities"]}
READ_PRICES = {"Sid": "ReadSpotPrices", "Effect": "Allow", "Resource": "*",
               "Action": ["ec2:DescribeSpotPriceHistory", "ec2:GetSpotPlacementScores"],
               "Condition": {"StringEquals": {"ec2:Region": ["us-east-1", "us-west-2"]}}}


def test_the_aws_function_may_read_its_run_write_its_own_objects_and_size_its_groups_up_to_nodes():
    policy = grants.aws_policy(bucket="b-1", run_id="r-7", groups=GROUPS, nodes=3, account_id="123456789012",
                               partition="aws-cn")

    assert policy == {"Version": "2012-10-17", "Statement": [
        {"Sid": "ListRunFolder", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws-cn:s3:::b-1",
         "Condition": {"StringLike": {"s3:prefix": ["runs/r-7/", "runs/r-7/*"]}}},
        {"Sid": "ReadRunFolder", "Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws-cn:s3:::b-1/runs/r-7/*"},
        {"Sid": "WritePlacement", "Effect": "Allow", "Action": "s3:PutObject", "Resource": [
            "arn:aws-cn:s3:::b-1/runs/r-7/placement.json", "arn:aws-cn:s3:::b-1/runs/r-7/machine-events/placement.jsonl",
            "arn:aws-cn:s3:::b-1/runs/r-7/deadline", "arn:aws-cn:s3:::b-1/runs/r-7/TIMED_OUT",
            "arn:aws-cn:s3:::b-1/runs/r-7/CANCELLED", "arn:aws-cn:s3:::b-1/runs/r-7/prices.json", "arn:aws-cn:s3:::b-1/runs/r-7/decisions/*"]},
        READ_GROUPS, SIZE_GROUPS, READ_PRICES]}


def test_the_role_a_gcp_home_assumes_in_aws_holds_the_groups_part_only():
    assert grants.aws_group_policy(groups=GROUPS, nodes=3, account_id="123456789012", partition="aws-cn") == {
        "Version": "2012-10-17", "Statement": [READ_GROUPS, SIZE_GROUPS, READ_PRICES]}
    named_x = grants.aws_policy(bucket="b", run_id="run-X", groups=[], nodes=1, account_id="1")
    assert named_x["Statement"][1]["Resource"] == "arn:aws:s3:::b/runs/run-X/*"  # only the slash goes
    default = grants.aws_group_policy(groups=GROUPS[:1], nodes=1, account_id="123456789012")
    assert default["Statement"][1]["Resource"] == [
        "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/ts-home-gpu"]
    assert grants.aws_policy(bucket="b", run_id="r", groups=[], nodes=1, account_id="1")["Statement"][0][
        "Resource"] == "arn:aws:s3:::b"


def test_the_gcp_groups_account_may_read_and_resize_groups_and_nothing_of_the_bucket():
    assert grants.GCP_GROUP_PERMISSIONS == ("compute.instanceGroupManagers.get", "compute.instanceGroupManagers.list",
                                            "compute.instanceGroupManagers.update")
    assert grants.WRITES == (layout.PLACEMENT_KEY, layout.PLACEMENT_EVENTS_KEY, layout.DEADLINE_KEY, layout.TIMED_OUT,
                             layout.CANCELLED, layout.PRICES_KEY)
    assert grants.WRITE_PREFIXES == (layout.DECISIONS_PREFIX,)


@pytest.fixture
def in_memory(monkeypatch):
    """The handler's clouds replaced by groups kept in memory (home up, the second left up too)."""
    groups = FakeGroups({"g0": 1, "g1": 1}, state=lambda p: GroupState(1, 1))
    monkeypatch.setattr(handler, "Clouds", lambda: Clouds(aws=groups))
    return groups


def test_the_handler_ticks_the_configured_run_prints_and_returns_what_it_did(file_run, in_memory, monkeypatch, capsys):
    import time

    trained(open_store(file_run.uri), step=10, last_beat=time.time())
    start = int(time.time())
    doc = {"run_uri": file_run.uri + "/", "nodes": 1, "wait_minutes": 15, "max_runtime_s": 7200, "placements": [
        {"cloud": "aws", "region": r, "group": f"g{i}"} for i, r in enumerate(("us-east-1", "us-west-2"))]}
    monkeypatch.setenv(ENV_VAR, json.dumps(doc))

    result = handler.handler({}, None)

    assert result == {"action": "stay", "reason": "aws us-east-1: 1 machine(s) running", "move": None,
                      "waiting": None, "resized": [{"placement": 1, "group": "g1", "size": 0}]}
    assert json.loads(capsys.readouterr().out) == {"run_uri": file_run.uri, **result}
    assert in_memory.sizes == {"g0": 1, "g1": 0}
    assert start + 7200 <= int(open_store(file_run.uri).get_bytes(layout.DEADLINE_KEY)) <= time.time() + 7200

    class Log(io.StringIO):
        """The function's stdout: what it held when it was last flushed (a frozen Lambda keeps only that)."""

        flushed = ""

        def flush(self) -> None:
            super().flush()
            self.flushed = self.getvalue()

    log = Log()
    monkeypatch.setattr(sys, "stdout", log)
    again = handler.handler({}, None)
    assert log.flushed == json.dumps({"run_uri": file_run.uri, **again}) + "\n"
    assert handler.main() == 0  # the same tick again, from the job's command


def test_the_handler_reads_the_clock_again_before_it_sizes_a_group_back(file_run, monkeypatch, capsys):
    from controller.decide import LAUNCH_MARGIN_S

    start = 1_800_000_000.0
    reads = []

    class Clock:  # each read of the wall clock a minute on: a tick that ran long
        @staticmethod
        def time() -> float:
            reads.append(start + 60 * len(reads))
            return reads[-1]

    store = open_store(file_run.uri)
    trained(store, step=10, last_beat=start)
    store.put_bytes(layout.DEADLINE_KEY, f"{int(start) + LAUNCH_MARGIN_S + 30}\n".encode())
    groups = FakeGroups({"g0": 0}, state=lambda p: GroupState(0, 0))
    monkeypatch.setattr(handler, "Clouds", lambda: Clouds(aws=groups))
    monkeypatch.setattr(handler, "time", Clock)
    monkeypatch.setenv(ENV_VAR, json.dumps({"run_uri": file_run.uri, "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": "us-east-1", "group": "g0"}]}))

    result = handler.handler()

    assert "sized back to 1" in result["reason"] and groups.calls == [] and len(reads) == 2


@pytest.mark.parametrize(("value", "says"), [
    (None, f"controller: {ENV_VAR} is not set: the stack sets it on the function"),
    ("", f"controller: {ENV_VAR} is not set: the stack sets it on the function"),
    ('{"run_uri": "http://x"}', "controller: run_uri: expected s3://, gs:// or file://, got 'http://x'"),
])
def test_the_jobs_command_says_a_bad_configuration_in_one_line_and_exits_2(monkeypatch, capsys, in_memory, value,
                                                                           says):
    if value is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, value)

    assert handler.main() == 2

    out = capsys.readouterr()
    assert out.err == says + "\n" and out.out == "" and in_memory.calls == []


def test_parliament_finds_nothing_in_the_policy_and_the_price_calls_take_no_resource_but_their_region():
    import pathlib

    import parliament
    from parliament import analyze_policy_string

    policy = grants.aws_policy(bucket="b-1", run_id="r-7", groups=GROUPS, nodes=1, account_id="123456789012")
    assert [(f.issue, f.detail) for f in analyze_policy_string(json.dumps(policy)).findings] == []
    definition = json.loads((pathlib.Path(parliament.__file__).parent / "iam_definition.json").read_text())
    (ec2,) = [s for s in definition if s["prefix"] == "ec2"]
    found = {p["privilege"]: p["resource_types"] for p in ec2["privileges"]}
    for action in grants.PRICE_ACTIONS:
        assert found[action.split(":")[1]] == [{"condition_keys": ["ec2:Region"], "dependent_actions": [],
                                                "resource_type": ""}]
    assert grants.price_statements([]) == []
