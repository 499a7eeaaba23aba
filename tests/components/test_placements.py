"""A stack of several placements: one group per placement, each in its region through its own provider,
only home at the run's size, one machine identity that reaches every group and only this run's prefix,
and a later `pulumi up` that leaves alone a size the controller set.

The stacks run the real `__main__.py` under the mocks (`ops synth`); the engine test runs it on the
fake cloud's engine (tests/fixtures/fake_cloud.py) across two `up`s with a `refresh` between them.
"""

from __future__ import annotations

import json
from functools import cache

import pytest
import yaml

from components import placement
from components.machine import ENV_FILE
from components.settings import load_settings
from ops import synth
from tests.fixtures.fake_cloud import Engine, FakeCloud

AWS_TYPES = ["g5.xlarge", "g6.xlarge"]
GCP_TYPES = ["g2-standard-4", "g2-standard-8"]
RAW = {
    "aws": {
        "cloud": "aws", "region": "us-east-1", "run": {"id": "exp-7", "synthetic": True, "steps": 100},
        "placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": AWS_TYPES},
                       {"cloud": "aws", "region": "us-west-2", "instanceTypes": AWS_TYPES, "zones": ["us-west-2b"]},
                       {"cloud": "aws", "region": "eu-west-1", "instanceTypes": ["g5.xlarge"]}],
        "placement": {"waitMinutes": 20},
    },
    "gcp": {
        "cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
        "run": {"id": "exp-7", "synthetic": True, "steps": 100},
        "placements": [{"cloud": "gcp", "region": "us-central1", "project": "my-proj-123", "instanceTypes": GCP_TYPES},
                       {"cloud": "gcp", "region": "europe-west4", "project": "my-proj-123", "instanceTypes": GCP_TYPES,
                        "zones": ["europe-west4-b"]},
                       {"cloud": "gcp", "region": "us-east4", "project": "my-proj-123",
                        "instanceTypes": ["g2-standard-4"]}],
    },
}
REGIONS = {cloud: [p["region"] for p in raw["placements"]] for cloud, raw in RAW.items()}
GROUP = {"aws": "aws:autoscaling/group:Group", "gcp": "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"}
TEMPLATE = {"aws": synth.LAUNCH_TEMPLATE, "gcp": synth.INSTANCE_TEMPLATE}
HOME_GROUP = "trainstack-places--exp-7-gpu"


@cache
def synthesized(cloud: str) -> synth.Result:
    return synth.synthesize(RAW[cloud], stack="places")


def _env(user_data: str) -> dict[str, str]:
    (text,) = [f["content"] for f in yaml.safe_load(user_data)["write_files"] if f["path"] == ENV_FILE]
    return {k: v.strip("'") for k, v in (line.split("=", 1) for line in text.splitlines())}


def _component_of(r: synth.Result, name: str) -> str:
    """The SpotGroup component a resource belongs to (its nearest ancestor of that type)."""
    by_name = {x["name"]: x for x in r.resources}
    while name is not None and not by_name[name]["type"].endswith(":SpotGroup"):
        name = by_name[name]["parent"]
    return name


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_each_placement_has_its_group_in_its_region_and_only_home_has_machines(cloud):
    r = synthesized(cloud)
    providers = {x["name"]: x["inputs"]["region"] for x in r.of_type(f"pulumi:providers:{cloud}")
                 if x["name"] != "trainstack-gcp-apis"}
    groups = sorted(r.of_type(GROUP[cloud]), key=lambda g: g["inputs"]["name"])
    assert [g["inputs"]["name"] for g in groups] == [HOME_GROUP, f"{HOME_GROUP}-p1", f"{HOME_GROUP}-p2"]
    size = "desiredCapacity" if cloud == "aws" else "targetSize"
    # `choose: cheapest` (the default): every group at 0, the controller's first tick launches the run.
    assert [g["inputs"][size] for g in groups] == [0, 0, 0]
    if cloud == "aws":
        assert [g["inputs"]["maxSize"] for g in groups] == [1, 1, 1]  # the controller may set any of them to nodes
    # Every group, and everything in its component, is made through the provider of its placement's region.
    for i, g in enumerate(groups):
        assert providers[g["options"]["provider"]] == REGIONS[cloud][i]
        assert size in g["options"]["ignoreChanges"], "a later `pulumi up` would undo the controller's move"
        component = _component_of(r, g["name"])
        members = [x for x in r.resources if x["options"]["custom"] and _component_of(r, x["name"]) == component]
        assert len(members) >= 3
        assert {providers[x["options"]["provider"]] for x in members} == {REGIONS[cloud][i]}, component
    if cloud == "aws":
        # The lookups (AMI, VPC, subnets) of each group are asked of its own region.
        amis = [providers[i["provider"]] for i in r.invokes if i["token"] == "aws:ec2/getAmi:getAmi"]
        assert sorted(amis) == sorted(REGIONS[cloud])
        by_region = {providers[g["options"]["provider"]]: g for g in groups}
        west = by_region["us-west-2"]["inputs"]["vpcZoneIdentifiers"]
        assert west and all(i.startswith("subnet-") for i in west)
    else:
        zones = [g["inputs"]["distributionPolicyZones"] for g in groups]
        assert zones[1] == ["europe-west4-b"] and all(z.startswith("us-east4-") for z in zones[2])
        # The firewall rules are the project's: made once, for the tag every placement's machines carry.
        assert len(r.of_type("gcp:compute/firewall:Firewall")) == 1


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
@pytest.mark.parametrize(("choose", "sizes"), [("inOrder", [1, 0, 0]), ("cheapest", [0, 0, 0])])
def test_home_starts_at_the_run_size_in_order_and_at_zero_for_the_first_tick_to_decide_by_price(cloud, choose, sizes):
    raw = {**RAW[cloud], "placement": {**RAW[cloud].get("placement", {}), "choose": choose}}
    r = synth.synthesize(raw, stack="places")
    size = "desiredCapacity" if cloud == "aws" else "targetSize"
    groups = sorted(r.of_type(GROUP[cloud]), key=lambda g: g["inputs"]["name"])
    assert [g["inputs"][size] for g in groups] == sizes
    assert all(size in g["options"]["ignoreChanges"] for g in groups)  # a later `pulumi up` keeps the tick's size
    # The controller's schedule ticks every minute: the first tick decides within a minute of the deploy.
    if cloud == "aws":
        (schedule,) = r.of_type("aws:scheduler/schedule:Schedule")
        assert schedule["inputs"]["scheduleExpression"] == "rate(1 minute)"
    else:
        ticks = [j["inputs"]["schedule"] for j in r.of_type("gcp:cloudscheduler/job:Job") if "controller" in j["name"]]
        assert ticks == ["*/1 * * * *"]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_second_run_has_new_groups_at_zero_for_its_own_first_tick(cloud):
    """A new run.id names new groups (tests/components/test_second_run.py): created at 0 like the first run's,
    they wait for the controller's first tick over the new run folder, whatever size the old run's groups had."""
    raw = {**RAW[cloud], "run": {**RAW[cloud]["run"], "id": "exp-8"}}
    r = synth.synthesize(raw, stack="places")
    size = "desiredCapacity" if cloud == "aws" else "targetSize"
    groups = sorted(r.of_type(GROUP[cloud]), key=lambda g: g["inputs"]["name"])
    assert [g["inputs"]["name"] for g in groups] == [HOME_GROUP.replace("exp-7", "exp-8") + s for s in ("", "-p1", "-p2")]
    assert [g["inputs"][size] for g in groups] == [0, 0, 0]
    assert r.outputs["runUri"].endswith("/runs/exp-8")


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_every_placement_runs_the_same_image_and_run_folder_and_scales_only_its_own_group(cloud):
    r = synthesized(cloud)
    envs = {}
    for t in r.of_type(TEMPLATE[cloud]):
        envs[_component_of(r, t["name"])] = _env(r.user_data[t["name"]])
    assert sorted(envs) == ["trainstack-group", "trainstack-group-p1", "trainstack-group-p2"]
    home = envs["trainstack-group"]
    for i, name in enumerate(sorted(envs)):
        env = envs[name]
        assert env["TRAINSTACK_RUN_URI"] == r.outputs["runUri"]  # the home bucket's run folder
        assert env["TRAINSTACK_IMAGE"] == home["TRAINSTACK_IMAGE"] == r.outputs["imageRef"]
        assert env["TRAINSTACK_CODE_URI"] == r.outputs["codeUri"]
        assert env["TRAINSTACK_REGION"] == REGIONS[cloud][i]
        # Recorded with each attempt, so status and COMPLETE split the run's time and cost by placement.
        assert env["TRAINSTACK_PLACEMENT"] == f"{cloud} {REGIONS[cloud][i]}"
        assert env["TRAINSTACK_GROUP"] == placement.group_name(HOME_GROUP, i)
        # Everything else about the run is the same in every placement (the price is the placement's own).
        own = {"TRAINSTACK_REGION", "TRAINSTACK_PLACEMENT", "TRAINSTACK_GROUP", "TRAINSTACK_PRICE_PER_HOUR",
               "TRAINSTACK_PRICE_NOTE"}
        assert {k: v for k, v in env.items() if k not in own} == {k: v for k, v in home.items() if k not in own}
        assert len(home.keys() - own) >= 15


def test_the_aws_role_may_set_each_placements_group_to_zero_and_reaches_only_this_runs_prefix():
    r, one = synthesized("aws"), synth.synthesize({**RAW["aws"], "placements": RAW["aws"]["placements"][:1]},
                                                  stack="places")
    policy, single = r.named("trainstack-identity-policy"), one.named("trainstack-identity-policy")
    statements = {s["Sid"]: s for s in json.loads(policy["inputs"]["policy"])["Statement"]}
    alone = {s["Sid"]: s for s in json.loads(single["inputs"]["policy"])["Statement"]}
    assert statements["ScaleOwnGroup"]["Resource"] == [
        f"arn:aws:autoscaling:{region}:{synth.FAKE_ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/"
        f"{placement.group_name(HOME_GROUP, i)}" for i, region in enumerate(REGIONS["aws"])]
    assert statements["ScaleOwnGroup"]["Condition"] == alone["ScaleOwnGroup"]["Condition"]  # only to zero
    # Everything else is the one-placement stack's: this run's prefix in the home bucket, the image, nothing more.
    assert {k: v for k, v in statements.items() if k != "ScaleOwnGroup"} == \
        {k: v for k, v in alone.items() if k != "ScaleOwnGroup"}
    assert statements["ReadWriteRun"]["Resource"].endswith("/runs/exp-7/*")
    # One role and one instance profile serve every region (IAM is global); the controller's roles are its own.
    machine_roles = [x for x in r.of_type("aws:iam/role:Role") if x["parent"] == "trainstack-identity"]
    assert len(machine_roles) == len(r.of_type("aws:iam/instanceProfile:InstanceProfile")) == 1
    profiles = {t["inputs"]["iamInstanceProfile"]["arn"] for t in r.of_type(synth.LAUNCH_TEMPLATE)}
    assert len(profiles) == 1


def test_the_gcp_account_may_resize_each_placements_group_and_nothing_else():
    r = synthesized("gcp")
    (resize,) = [m for m in r.of_type("gcp:projects/iAMMember:IAMMember") if m["name"].endswith("-resize")]
    names = [f'resource.name == "projects/my-proj-123/regions/{region}/instanceGroupManagers/'
             f'{placement.group_name(HOME_GROUP, i)}"' for i, region in enumerate(REGIONS["gcp"])]
    assert resize["inputs"]["condition"]["expression"] == " || ".join(names)
    assert len([x for x in r.of_type("gcp:serviceaccount/account:Account") if x["parent"] == "trainstack-identity"]) == 1
    emails = {t["inputs"]["serviceAccount"]["email"] for t in r.of_type(synth.INSTANCE_TEMPLATE)}
    assert len(emails) == 1


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_one_placement_stack_is_what_it_was(cloud):
    """No `placements` key: one group, its own name, one provider, the grant on one group as before."""
    raw = {k: v for k, v in RAW[cloud].items() if k not in ("placements", "placement")}
    raw["compute"] = {"instanceTypes": RAW[cloud]["placements"][0]["instanceTypes"]}
    r = synth.synthesize(raw, stack="places")
    assert [g["inputs"]["name"] for g in r.of_type(GROUP[cloud])] == [HOME_GROUP]
    assert len([p for p in r.of_type(f"pulumi:providers:{cloud}") if p["name"] != "trainstack-gcp-apis"]) == 1
    if cloud == "aws":
        (policy,) = r.of_type("aws:iam/rolePolicy:RolePolicy")
        (scale,) = [s for s in json.loads(policy["inputs"]["policy"])["Statement"] if s["Sid"] == "ScaleOwnGroup"]
        assert isinstance(scale["Resource"], str) and scale["Resource"].endswith(f"/{HOME_GROUP}")


def test_the_function_files_are_the_packages_python_only(tmp_path):
    (tmp_path / "controller" / "__pycache__").mkdir(parents=True)
    (tmp_path / "controller" / "handler.py").write_text("")
    (tmp_path / "controller" / "__pycache__" / "handler.cpython-311.pyc").write_text("")
    (tmp_path / "runfolder" / "storage").mkdir(parents=True)
    (tmp_path / "runfolder" / "storage" / "s3.py").write_text("")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "loop.py").write_text("")  # the trainer is not the controller's
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "move.py").write_text("")
    (tmp_path / "controller" / "replay.py").write_text("")  # the replay's command line: the function never runs it
    (tmp_path / "simworld").mkdir()
    (tmp_path / "simworld" / "world.py").write_text("")
    assert list(placement.function_files(tmp_path)) == ["controller/handler.py", "runfolder/storage/s3.py"]


def test_the_real_function_package_carries_no_replay_and_no_simulated_world():
    from components.project import ROOT

    files = placement.function_files(ROOT)
    assert "controller/tick.py" in files and "controller/handler.py" in files
    assert "controller/replay.py" not in files
    assert not [f for f in files if f.startswith(("simworld/", "tests/"))]


def test_group_names_and_the_settings_of_a_placement():
    s = load_settings(RAW["aws"], stack="places")
    assert placement.group_names(s, "g") == ["g", "g-p1", "g-p2"]
    with pytest.raises(ValueError):
        placement.group_name("g", -1)
    west = placement.settings_at(s, 1)
    assert (west.region, west.compute.instance_types, west.compute.zones) == ("us-west-2", AWS_TYPES, ["us-west-2b"])
    assert placement.settings_at(s, 0) is s
    assert west.run == s.run and west.compute.nodes == s.compute.nodes and west.compute.subnets == []
    config = json.loads(placement.controller_config_json(s, "s3://b/runs/exp-7", placement.group_names(s, "g")))
    assert config == {
        "run_uri": "s3://b/runs/exp-7", "nodes": 1, "wait_minutes": 20, "max_runtime_s": int(s.compute.max_runtime_hours * 3600),
        "placements": [{"cloud": "aws", "region": r, "project": None, "group": g}
                       for r, g in zip(REGIONS["aws"], ["g", "g-p1", "g-p2"], strict=True)]}


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
@pytest.mark.parametrize("keep_ignore", [True, False], ids=["as-built", "without-ignore-changes"])
@pytest.mark.parametrize("choose", ["inOrder", "cheapest"])
def test_a_later_up_leaves_the_sizes_the_controller_set(cloud, keep_ignore, choose, moto_server, monkeypatch):
    """The controller sizes the groups (``inOrder``: moves the run, home to 0 and the next placement to nodes;
    ``cheapest``: every group starts at 0 and its first tick launches placement 1); `pulumi refresh` reads the
    sizes, and the next `up` changes nothing. Without the group's ignoreChanges the same `up` would put every
    group back to its size at creation: the control case shows the check can fail."""
    raw = {**RAW[cloud], "placement": {**RAW[cloud].get("placement", {}), "choose": choose}}
    cloud_ = FakeCloud(cloud, raw["region"], moto_server, project=raw.get("project", ""))
    engine = Engine(cloud_, "places")
    engine.up(raw)
    names = [placement.group_name(HOME_GROUP, i) for i in range(3)]
    created = [1, 0, 0] if choose == "inOrder" else [0, 0, 0]
    assert [cloud_.groups[n] for n in names] == created
    cloud_.resize(names[0], 0)  # the controller's move, or its first launch
    cloud_.resize(names[1], 1)
    engine.refresh()
    if not keep_ignore:
        monkeypatch.setattr(Engine, "_with_ignored", staticmethod(lambda old, res: res.inputs))
    up = engine.up(raw)
    group_steps = {op for op, urn in up.steps if urn.split("::")[-1].endswith(("-asg", "-mig"))}
    assert len([u for _, u in up.steps if u.split("::")[-1].endswith(("-asg", "-mig"))]) == 3
    if keep_ignore:
        assert [cloud_.groups[n] for n in names] == [0, 1, 0]
        assert group_steps == {"same"}
    else:
        assert [cloud_.groups[n] for n in names] == created
        assert "update" in group_steps
