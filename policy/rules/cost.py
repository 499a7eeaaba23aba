"""The cost rule: spot machines unless on-demand is explicit, and a runtime cap the cloud enforces."""

from __future__ import annotations

from collections.abc import Mapping

from policy.rules import base
from policy.rules.base import UNKNOWN, Context, Resource, Violation
from policy.rules.machines import GCE_TEMPLATES, LAUNCH_TEMPLATES

ASGS = ("aws:autoscaling/group:Group",)
MIGS = ("gcp:compute/instanceGroupManager:InstanceGroupManager", "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager")


def _asg_is_spot(g: Resource, resources: list[Resource]) -> bool | None:
    dist = base.get(g, "mixedInstancesPolicy.instancesDistribution")
    if dist == UNKNOWN:
        return None
    if isinstance(dist, Mapping):
        pct = dist.get("onDemandPercentageAboveBaseCapacity", 100)
        base_capacity = dist.get("onDemandBaseCapacity", 0)
        if not (base.known(pct) and base.known(base_capacity)):
            return None
        return pct == 0 and base_capacity == 0
    templates = base.of_type(resources, *LAUNCH_TEMPLATES)
    market = [base.get(t, "instanceMarketOptions.marketType") for t in templates]
    return bool(market) and all(m == "spot" for m in market)


def _stops_group(s: Resource, g: Resource) -> bool:
    desired, low = base.get(s, "desiredCapacity"), base.get(s, "minSize")
    return desired == 0 and (low == 0 or base.get(g, "minSize") == 0)


def spot_with_runtime_cap(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Groups run spot machines unless compute.spot: false was said, and the cloud itself stops
    them after compute.maxRuntimeHours (a scheduled scale to zero / a max run duration)."""
    out: list[Violation] = []
    groups = base.of_type(resources, *ASGS)
    for g in groups:
        spot = _asg_is_spot(g, resources)
        if spot is False and not ctx.on_demand:
            out.append(Violation("spot-with-runtime-cap", g["name"], "runs on-demand machines; use 0% on-demand "
                                 "(spot) or say compute.spot: false"))
        schedules = [s for s in base.of_type(resources, "aws:autoscaling/schedule:Schedule")
                     if base.linked(s, g, "autoscalingGroupName", ("name",), groups)]
        if any(UNKNOWN in (base.get(s, "desiredCapacity"), base.get(s, "minSize")) for s in schedules):
            continue
        if not any(_stops_group(s, g) for s in schedules):
            out.append(Violation("spot-with-runtime-cap", g["name"], "no scheduled action sets the group to zero at "
                                 "launch + compute.maxRuntimeHours; add an autoscaling Schedule with desiredCapacity 0, minSize 0"))
    templates = base.of_type(resources, *GCE_TEMPLATES)
    if base.of_type(resources, *MIGS):
        for t in templates:
            model = base.get(t, "scheduling.provisioningModel")
            spot = model == "SPOT" or base.is_true(base.get(t, "scheduling.preemptible"))
            if base.known(model) and not spot and not ctx.on_demand:
                out.append(Violation("spot-with-runtime-cap", t["name"], "scheduling is not SPOT; set provisioningModel "
                                     "SPOT or say compute.spot: false"))
            secs = base.get(t, "scheduling.maxRunDuration.seconds")
            if base.known(secs) and not (isinstance(secs, int | str) and str(secs).isdigit() and int(secs) > 0):
                out.append(Violation("spot-with-runtime-cap", t["name"], "no scheduling.maxRunDuration; set it to "
                                     "compute.maxRuntimeHours so GCE stops the machines"))
    return out
