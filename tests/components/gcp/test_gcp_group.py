"""SpotGroup (GCP): Spot template, firewall rules, the managed group, compact placement and the cloud's runtime cap."""

import datetime as dt

import pytest

from components.gcp.group import IMAGE_FAMILY, cap_cron, compact_placement, no_compact_reason
from tests.components.gcp.helpers import (
    FIREWALL,
    MIG,
    SSH_KEY,
    TEMPLATE,
    gcp,
    one,
)


def test_template_is_spot_with_max_run_duration_shielded_and_no_ssh_key():
    r = gcp()
    t = one(r, TEMPLATE)["inputs"]
    assert t["scheduling"] == {
        "provisioningModel": "SPOT", "preemptible": True, "automaticRestart": False,
        "onHostMaintenance": "TERMINATE", "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": 6 * 3600},
    }
    assert t["shieldedInstanceConfig"] == {"enableSecureBoot": False, "enableVtpm": True, "enableIntegrityMonitoring": True}
    meta = t["metadata"]
    assert (meta["block-project-ssh-keys"], meta["disable-legacy-endpoints"]) == ("true", "true")
    assert "ssh-keys" not in meta
    (disk,) = t["disks"]
    assert disk["boot"] is True and disk["autoDelete"] is True and disk["diskSizeGb"] == 200
    assert IMAGE_FAMILY in disk["sourceImage"]
    (lookup,) = [i for i in r.invokes if i["token"] == "gcp:compute/getImage:getImage"]
    assert lookup["args"] == {"family": IMAGE_FAMILY, "project": "ubuntu-os-accelerator-images"}
    assert t["machineType"] == "g2-standard-8"


def test_nothing_inbound_by_default():
    walls = gcp().of_type(FIREWALL)
    assert len(walls) == 1
    deny = walls[0]["inputs"]
    assert deny["denies"] == [{"protocol": "all"}] and deny["sourceRanges"] == ["0.0.0.0/0"]
    assert "allows" not in deny and deny["targetTags"] == ["trainstack-unit"]


def test_ssh_from_allowed_cidrs_and_workers_from_each_other_only():
    r = gcp({"compute": {"nodes": 2}, "access": {"sshPublicKey": SSH_KEY, "allowedCidrs": ["203.0.113.0/24"]}})
    walls = {w["name"].rsplit("-", 1)[-1]: w["inputs"] for w in r.of_type(FIREWALL)}
    assert sorted(walls) == ["inbound", "ssh", "workers"]
    deny_priority = walls["inbound"]["priority"]
    assert walls["ssh"]["sourceRanges"] == ["203.0.113.0/24"]
    assert walls["ssh"]["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert walls["workers"]["sourceTags"] == walls["workers"]["targetTags"] == ["trainstack-unit"]
    # Every port between members only: NCCL's collectives use ephemeral ports.
    assert walls["workers"]["allows"] == [{"protocol": "all"}]
    assert "sourceRanges" not in walls["workers"]
    assert walls["ssh"]["priority"] < deny_priority and walls["workers"]["priority"] < deny_priority
    assert one(r, TEMPLATE)["inputs"]["metadata"]["ssh-keys"] == f"ubuntu:{SSH_KEY}"


def test_group_keeps_nodes_over_ranked_types_and_ignores_its_size_later():
    r = gcp({"compute": {"nodes": 3, "instanceTypes": ["g2-standard-12", "g2-standard-8", "g2-standard-16"],
                         "zones": ["us-central1-a", "us-central1-b"]}})
    mig = one(r, MIG)
    m = mig["inputs"]
    assert (m["name"], m["targetSize"], m["region"]) == ("trainstack-unit--exp-7-gpu", 3, "us-central1")
    selections = m["instanceFlexibilityPolicy"]["instanceSelections"]
    assert [(s["rank"], s["machineTypes"]) for s in selections] == [
        (1, ["g2-standard-12"]), (2, ["g2-standard-8"]), (3, ["g2-standard-16"])]
    assert m["distributionPolicyZones"] == ["us-central1-a", "us-central1-b"]
    assert m["versions"][0]["instanceTemplate"].endswith(tuple("0123456789"))  # the template's unique link
    assert mig["options"]["ignoreChanges"] == ["targetSize", "distributionPolicyZones"]
    assert "trainstack-identity-resize" in mig["options"]["dependsOn"]
    single = one(gcp({"compute": {"instanceTypes": ["g2-standard-8"]}}), MIG)["inputs"]
    assert "instanceFlexibilityPolicy" not in single


def test_on_demand_accelerator_and_own_image():
    r = gcp({"compute": {"spot": False, "instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4",
                         "gpusPerNode": 2, "imageId": "projects/my-proj-123/global/images/my-gpu-image"}})
    t = one(r, TEMPLATE)["inputs"]
    assert t["scheduling"]["provisioningModel"] == "STANDARD" and t["scheduling"]["preemptible"] is False
    assert t["scheduling"]["maxRunDuration"] == {"seconds": 6 * 3600}
    assert t["guestAccelerators"] == [{"type": "nvidia-tesla-t4", "count": 2}]
    assert t["disks"][0]["sourceImage"] == "projects/my-proj-123/global/images/my-gpu-image"
    assert [i["token"] for i in r.invokes] == ["gcp:compute/getZones:getZones"]  # no image lookup


def test_cloud_scheduler_resizes_the_group_to_zero_at_the_cap():
    before = dt.datetime.now(dt.UTC)
    job = one(gcp({"compute": {"maxRuntimeHours": 10}}, stack="capped"), "gcp:cloudscheduler/job:Job")
    after = dt.datetime.now(dt.UTC)
    j = job["inputs"]
    assert j["httpTarget"]["uri"] == ("https://compute.googleapis.com/compute/v1/projects/my-proj-123/regions/"
                                      "us-central1/instanceGroupManagers/trainstack-capped--exp-7-gpu/resize?size=0")
    assert j["httpTarget"]["httpMethod"] == "POST"
    assert j["httpTarget"]["oauthToken"]["serviceAccountEmail"].endswith("@my-proj-123.iam.gserviceaccount.com")
    assert j["timeZone"] == "Etc/UTC"
    assert j["schedule"] in {cap_cron(10, before), cap_cron(10, after)}
    assert job["options"]["ignoreChanges"] == ["schedule"]
    assert cap_cron(2, dt.datetime(2030, 12, 31, 23, 30, 5, tzinfo=dt.UTC)) == "31 1 1 1 *"



def test_repairs_use_the_current_template_and_the_group_switches_before_the_old_template_goes():
    r = gcp()
    template, mig = one(r, TEMPLATE), one(r, MIG)
    # A preempted VM is recreated from the group's current template, not the one it was
    # created with (that may be deleted after a `pulumi up` that changed the code or image).
    assert mig["inputs"]["instanceLifecyclePolicy"] == {"forceUpdateOnRepair": "YES", "defaultActionOnFailure": "REPAIR"}
    # No proactive rollout: a running job is never replaced by a template change.
    assert mig["inputs"]["updatePolicy"]["type"] == "OPPORTUNISTIC"
    # The update order of a template change: a template cannot change in place, so Pulumi
    # replaces it; with a generated name (name_prefix) and create-before-delete, the new
    # template exists first, the group that refers to it is updated to it, and only then is
    # the old one deleted (never while the group still names it).
    prefix = f"{r.outputs['groupName'][:36]}-"
    assert template["inputs"]["namePrefix"] == prefix and "name" not in template["inputs"]
    assert template["options"]["deleteBeforeReplace"] is False
    assert template["name"] in mig["options"]["dependsOn"]
    (version,) = mig["inputs"]["versions"]
    link = version["instanceTemplate"]
    assert f"/global/instanceTemplates/{prefix}" in link and "?uniqueId=" in link


POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"


def test_several_machines_of_a_compact_series_are_placed_close_together():
    r = gcp({"compute": {"nodes": 2, "instanceTypes": ["a2-highgpu-2g"], "gpusPerNode": 2}}, stack="multi")
    policy = one(r, POLICY)
    p = policy["inputs"]
    assert p["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}  # no vmCount: repairs add one VM
    assert (p["name"], p["region"]) == (f"{r.outputs['groupName']}-place", "us-central1")
    assert len(p["name"]) <= 63
    template = one(r, TEMPLATE)
    assert template["inputs"]["resourcePolicies"] == p["name"]
    assert policy["name"] in template["options"]["dependsOn"]
    # A compact policy needs the group in one zone.
    assert one(r, MIG)["inputs"]["distributionPolicyTargetShape"] == "ANY_SINGLE_ZONE"


@pytest.mark.parametrize(
    ("types", "nodes", "compact"),
    [
        (["g2-standard-8"], 1, False),  # one machine: nothing to place
        (["g2-standard-8"], 2, True),
        (["a2-highgpu-1g", "g2-standard-8"], 3, True),
        (["n1-standard-8"], 2, False),  # N1 has no compact placement
        (["g2-standard-8", "n1-standard-8"], 2, False),  # every type the group may pick must allow it
        (["a3-highgpu-8g"], 2, False),  # A3 High wants a workload policy instead
    ],
)
def test_compact_placement_only_where_the_machine_series_supports_it(types, nodes, compact):
    assert compact_placement(types, nodes) is compact
    reason = no_compact_reason(types, nodes)
    if compact or nodes == 1:
        assert reason is None
    else:  # skipped with the reason said: which series, and what would get it
        assert reason is not None and "no compact placement" in reason and "A2, G2" in reason
        assert any(t.split("-", 1)[0].upper() in reason for t in types if not t.startswith(("a2-", "g2-")))


def test_no_placement_policy_for_one_machine_or_n1():
    assert gcp().of_type(POLICY) == []
    assert "resourcePolicies" not in one(gcp(), TEMPLATE)["inputs"]
    n1 = gcp({"compute": {"nodes": 2, "instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4"}})
    assert n1.of_type(POLICY) == []


@pytest.mark.parametrize("nodes", [1, 2])
def test_without_compute_zones_the_group_may_use_every_zone_of_the_region(nodes):
    # GCE gives a regional group three zones when none are named; the synth fakes' region has
    # four (us-central1 a, b, c, f), and a GPU may be in the fourth only.
    r = gcp({"compute": {"nodes": nodes}})
    (lookup,) = [i for i in r.invokes if i["token"] == "gcp:compute/getZones:getZones"]
    assert (lookup["args"]["region"], lookup["args"]["project"]) == ("us-central1", "my-proj-123")
    assert lookup["provider"] == "trainstack-gcp"  # through the stack's provider, after the Compute API is on
    mig = one(r, MIG)["inputs"]
    assert mig["distributionPolicyZones"] == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    assert mig["distributionPolicyTargetShape"] == "ANY_SINGLE_ZONE"


def test_preflight_checks_the_zones_the_group_is_given():
    from ops import preflight
    from ops.fakes import gcp as fake_gcp
    from tests.components.gcp.helpers import BASE

    class Api:
        def region_zones(self, project, region):
            return fake_gcp.call("gcp:compute/getZones:getZones", {"region": region}, region, project)["names"]

    for zones in ([], ["us-central1-b"]):
        raw = {**BASE, "compute": {**BASE["compute"], "zones": zones}}
        settings = preflight.config.load_settings(raw, stack="unit")
        program = one(gcp({"compute": {"zones": zones}}), MIG)["inputs"]["distributionPolicyZones"]
        assert preflight.gcp_zones(settings, Api()) == program and program
