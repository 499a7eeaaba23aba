"""The tag rule and the cost rule (policy/rules/tags.py, cost.py) line by line: which resources must
carry the stack and run tags and what each refusal says; spot machines and the runtime cap the
cloud enforces, on AWS groups and GCE templates (a value unknown during preview is not judged)."""

from __future__ import annotations

import pytest

from policy.rules import UNKNOWN, Context, cost, tags
from tests.policy import resources as R

CTX = Context(stack=R.STACK, run_id=R.RUN)
LT, ASG, TPL = "dev-group-lt", "dev-group-asg", "dev-group-tpl"


def _lines(rule, res: list[dict], ctx: Context = CTX) -> list[str]:
    return [f"{v.resource}: {v.message}" for v in rule(res, ctx)]


def _inputs(res: list[dict], name: str) -> dict:
    return R.by_name(res, name)["inputs"]


def _resource(type_: str, rname: str, **inputs) -> dict:
    return {"type": type_, "name": rname, "parent": None, "inputs": inputs, "options": {}}


# -- tagged --


def test_the_clean_stacks_are_tagged():
    assert _lines(tags.tagged, R.aws_stack()) == [] and _lines(tags.tagged, R.gcp_stack()) == []


@pytest.mark.parametrize("sep", [":", "_", "-"])
def test_the_tag_keys_may_use_any_separator(sep):
    res = [_resource("aws:s3/bucket:Bucket", "b", tags={f"trainstack{sep}stack": "dev", f"trainstack{sep}run": "dev"})]
    assert _lines(tags.tagged, res) == []


def test_missing_and_wrong_tags_are_named():
    res = [_resource("aws:s3/bucket:Bucket", "b", tags={"trainstack.stack": "dev", "trainstack-run": "other"})]
    assert _lines(tags.tagged, res) == [
        "b: missing tag(s) trainstack-stack, trainstack-run=dev (has 'other'); tag it from the one tags function"]
    # Without a stack or run in the context, any value passes; an unknown one is not judged.
    assert _lines(tags.tagged, res, Context()) == [
        "b: missing tag(s) trainstack-stack; tag it from the one tags function"]
    res = [_resource("aws:s3/bucket:Bucket", "b", tags={"trainstack-stack": UNKNOWN, "trainstack-run": UNKNOWN})]
    assert _lines(tags.tagged, res) == []


def test_gcp_labels_compare_lowercased_and_aws_tags_exactly():
    ctx = Context(stack="Dev", run_id="Dev")
    gcp = [_resource("gcp:storage/bucket:Bucket", "g", labels={"trainstack-stack": "dev", "trainstack-run": "dev"})]
    assert _lines(tags.tagged, gcp, ctx) == []
    aws = [_resource("aws:s3/bucket:Bucket", "a", tags={"trainstack-stack": "dev", "trainstack-run": "Dev"})]
    assert _lines(tags.tagged, aws, ctx) == [
        "a: missing tag(s) trainstack-stack=Dev (has 'dev'); tag it from the one tags function"]


def test_which_resources_are_judged():
    res = [
        _resource("docker-build:index:Image", "img", tags=["repo:tag"]),  # image tags, not cloud tags
        _resource("aws:iam/rolePolicy:RolePolicy", "untaggable"),  # takes no tags
        _resource("aws:sns/topic:Topic", "carries-tags", tags={}),  # any resource with tags
        _resource("aws:ecr/repository:Repository", "no-tags-input"),  # taggable, none given
        _resource("aws:iam/role:Role", "tags-not-a-map", tags=["trainstack-stack"]),
        _resource("aws:iam/policy:Policy", "tags-unknown", tags=UNKNOWN),
    ]
    assert _lines(tags.tagged, res) == [
        f"{n}: missing tag(s) trainstack-stack, trainstack-run; tag it from the one tags function"
        for n in ("carries-tags", "no-tags-input", "tags-not-a-map")]


def test_a_groups_tags_are_a_list_of_keys_and_values():
    res = R.aws_stack()
    _inputs(res, ASG)["tags"] = [{"key": "trainstack-stack", "value": "dev"}, "junk",
                                 {"key": "trainstack-run", "value": "dev", "propagateAtLaunch": False}]
    assert _lines(tags.tagged, res) == []
    _inputs(res, ASG)["tags"] = [{"key": "trainstack-stack", "value": "dev"}]
    assert _lines(tags.tagged, res) == [
        "dev-group-asg: missing tag(s) trainstack-run; tag it from the one tags function"]
    _inputs(res, ASG)["tags"] = [{"key": "trainstack-stack", "value": UNKNOWN}]
    assert _lines(tags.tagged, res) == []


def test_a_launch_template_passes_the_tags_to_machines_and_disks():
    res = R.aws_stack()
    _inputs(res, LT)["tagSpecifications"] = [{"resourceType": "instance", "tags": {"trainstack-stack": "dev"}}]
    assert _lines(tags.tagged, res) == [
        "dev-group-lt: tagSpecifications for instance lack trainstack-run; machines and disks must carry the stack "
        "and run tags",
        "dev-group-lt: tagSpecifications for volume lack all; machines and disks must carry the stack and run tags"]
    _inputs(res, LT)["tagSpecifications"] = [{"resourceType": "instance", "tags": None},
                                             {"resourceType": "volume", "tags": dict(R.TAGS)}]
    assert _lines(tags.tagged, res) == [
        "dev-group-lt: tagSpecifications for instance lack trainstack-stack, trainstack-run; machines and disks must "
        "carry the stack and run tags"]
    # Unknown specifications wait; the template's own tags are still judged, and the next template too.
    _inputs(res, LT).update(tagSpecifications=[{"resourceType": "instance", "tags": UNKNOWN}], tags={})
    res.append(_resource("aws:ec2/launchTemplate:LaunchTemplate", "second", tags=dict(R.TAGS)))
    assert _lines(tags.tagged, res) == [
        "dev-group-lt: missing tag(s) trainstack-stack, trainstack-run; tag it from the one tags function",
        "second: tagSpecifications for instance lack all; machines and disks must carry the stack and run tags",
        "second: tagSpecifications for volume lack all; machines and disks must carry the stack and run tags"]


# -- spot-with-runtime-cap --

ON_DEMAND = "dev-group-asg: runs on-demand machines; use 0% on-demand (spot) or say compute.spot: false"
NO_CAP = ("dev-group-asg: no scheduled action sets the group to zero at launch + compute.maxRuntimeHours; add an "
          "autoscaling Schedule with desiredCapacity 0, minSize 0")


def test_the_clean_stacks_are_spot_with_a_cap():
    assert _lines(cost.spot_with_runtime_cap, R.aws_stack()) == []
    assert _lines(cost.spot_with_runtime_cap, R.gcp_stack()) == []


@pytest.mark.parametrize(("dist", "want"), [
    ({"onDemandBaseCapacity": 0, "onDemandPercentageAboveBaseCapacity": 0}, []),
    ({"onDemandBaseCapacity": 1, "onDemandPercentageAboveBaseCapacity": 0}, [ON_DEMAND]),
    ({"onDemandBaseCapacity": 0, "onDemandPercentageAboveBaseCapacity": 50}, [ON_DEMAND]),
    ({"onDemandPercentageAboveBaseCapacity": 0}, []),  # AWS's default base capacity is 0
    ({"onDemandBaseCapacity": 0}, [ON_DEMAND]),  # and its default percentage 100
    ({"onDemandBaseCapacity": UNKNOWN, "onDemandPercentageAboveBaseCapacity": 0}, []),
    ({"onDemandBaseCapacity": 0, "onDemandPercentageAboveBaseCapacity": UNKNOWN}, []),
    (UNKNOWN, []),
])
def test_a_group_is_spot_by_its_instances_distribution(dist, want):
    res = R.aws_stack()
    _inputs(res, ASG)["mixedInstancesPolicy"]["instancesDistribution"] = dist
    assert _lines(cost.spot_with_runtime_cap, res) == want
    assert _lines(cost.spot_with_runtime_cap, res, Context(on_demand=True)) == []


@pytest.mark.parametrize(("markets", "want"), [(["spot"], []), (["spot", "spot"], []), (["spot", None], [ON_DEMAND]),
                                               ([], [ON_DEMAND])])
def test_a_group_without_a_distribution_is_spot_by_its_launch_templates(markets, want):
    res = [r for r in R.aws_stack() if r["name"] != LT]
    del _inputs(res, ASG)["mixedInstancesPolicy"]
    for i, m in enumerate(markets):
        res.append(_resource("aws:ec2/launchTemplate:LaunchTemplate", f"lt{i}", tags=dict(R.TAGS),
                             instanceMarketOptions={"marketType": m} if m else {}))
    assert _lines(cost.spot_with_runtime_cap, res) == want


@pytest.mark.parametrize(("schedule", "group_min", "want"), [
    ({"desiredCapacity": 0, "minSize": 0}, 0, []),
    ({"desiredCapacity": 0}, 0, []),  # the schedule leaves minSize as the group has it: 0
    ({"desiredCapacity": 0}, 1, [NO_CAP]),
    ({"desiredCapacity": 0, "minSize": 1}, 1, [NO_CAP]),
    ({"desiredCapacity": 1, "minSize": 0}, 0, [NO_CAP]),
    ({"desiredCapacity": UNKNOWN, "minSize": 0}, 0, []),
    ({"desiredCapacity": 0, "minSize": UNKNOWN}, 1, []),
])
def test_the_runtime_cap_is_a_schedule_that_empties_the_group(schedule, group_min, want):
    res = R.aws_stack()
    cap = _inputs(res, "dev-group-runtime-cap")
    for k in ("desiredCapacity", "minSize"):
        cap.pop(k)
    cap.update(schedule)
    _inputs(res, ASG)["minSize"] = group_min
    assert _lines(cost.spot_with_runtime_cap, res) == want


def test_each_group_is_judged_after_one_whose_cap_is_unknown():
    res = R.aws_stack()
    _inputs(res, "dev-group-runtime-cap")["desiredCapacity"] = UNKNOWN
    res.append(_resource("aws:autoscaling/group:Group", "dev-other-asg", name="other", minSize=0,
                         mixedInstancesPolicy={"instancesDistribution": {"onDemandPercentageAboveBaseCapacity": 0}},
                         tags=[]))
    assert _lines(cost.spot_with_runtime_cap, res) == [NO_CAP.replace("dev-group-asg", "dev-other-asg")]


NOT_SPOT = "dev-group-tpl: scheduling is not SPOT; set provisioningModel SPOT or say compute.spot: false"
NO_RUN_CAP = "dev-group-tpl: no scheduling.maxRunDuration; set it to compute.maxRuntimeHours so GCE stops the machines"


@pytest.mark.parametrize(("scheduling", "want"), [
    ({"provisioningModel": "SPOT", "maxRunDuration": {"seconds": 3600}}, []),
    ({"preemptible": True, "maxRunDuration": {"seconds": "3600"}}, []),
    ({"provisioningModel": "STANDARD", "preemptible": "true", "maxRunDuration": {"seconds": 3600}}, []),
    ({"provisioningModel": "STANDARD", "maxRunDuration": {"seconds": 3600}}, [NOT_SPOT]),
    ({"provisioningModel": UNKNOWN, "maxRunDuration": {"seconds": 3600}}, []),
    ({"provisioningModel": "SPOT", "maxRunDuration": {"seconds": 1}}, []),  # any positive duration is a cap
    ({"provisioningModel": "SPOT", "maxRunDuration": {"seconds": 0}}, [NO_RUN_CAP]),
    ({"provisioningModel": "SPOT", "maxRunDuration": {"seconds": "1h"}}, [NO_RUN_CAP]),
    ({"provisioningModel": "SPOT", "maxRunDuration": {"seconds": 1.5}}, [NO_RUN_CAP]),
    ({"provisioningModel": "SPOT"}, [NO_RUN_CAP]),
    ({"provisioningModel": "SPOT", "maxRunDuration": {"seconds": UNKNOWN}}, []),
    ({"provisioningModel": "STANDARD"}, [NOT_SPOT, NO_RUN_CAP]),
])
def test_a_gce_template_is_spot_with_a_max_run_duration(scheduling, want):
    res = R.gcp_stack()
    _inputs(res, TPL)["scheduling"] = scheduling
    assert _lines(cost.spot_with_runtime_cap, res) == want
    on_demand = [w for w in want if w != NOT_SPOT]
    assert _lines(cost.spot_with_runtime_cap, res, Context(on_demand=True)) == on_demand


def test_a_template_no_group_uses_is_not_judged():
    res = [r for r in R.gcp_stack() if r["name"] != "dev-group-mig"]
    _inputs(res, TPL)["scheduling"] = {"provisioningModel": "STANDARD"}
    assert _lines(cost.spot_with_runtime_cap, res) == []
    res.append(_resource("gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager", "dev-rmig"))
    assert _lines(cost.spot_with_runtime_cap, res) == [NOT_SPOT, NO_RUN_CAP]


def test_a_resource_after_one_with_unknown_tags_is_still_judged():
    res = [_resource("aws:iam/policy:Policy", "tags-unknown", tags=UNKNOWN),
           _resource("gcp:pubsub/topic:Topic", "labels-only", labels={"trainstack-stack": "dev"}),
           {"name": "typeless", "inputs": {"tags": {"trainstack-stack": "dev"}}}]
    assert _lines(tags.tagged, res) == [
        f"{n}: missing tag(s) trainstack-run; tag it from the one tags function" for n in ("labels-only", "typeless")]


def test_label_values_compare_lowercased_and_machine_tags_exactly():
    gcp = [_resource("gcp:storage/bucket:Bucket", "g", labels={"trainstack-stack": "Dev", "trainstack-run": "DEV"})]
    assert _lines(tags.tagged, gcp) == []
    res = R.aws_stack()
    _inputs(res, LT)["tagSpecifications"] = [{"resourceType": rt, "tags": {**R.TAGS, "trainstack-stack": "Dev"}}
                                             for rt in ("instance", "volume")]
    assert _lines(tags.tagged, res) == [
        f"dev-group-lt: tagSpecifications for {rt} lack trainstack-stack=dev (has 'Dev'); machines and disks must "
        "carry the stack and run tags" for rt in ("instance", "volume")]
