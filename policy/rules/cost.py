"""The cost rule: spot machines unless on-demand is explicit, and a runtime cap the cloud enforces.

Standard library only: the policy pack runs it in its own virtualenv.
"""

from __future__ import annotations

from collections.abc import Mapping

from policy.rules.base import (
    UNKNOWN,
    Context,
    Resource,
    Violation,
    _get,
    _known,
    _linked,
    _of,
    _true,
)
from policy.rules.machines import GCE_TEMPLATES, LAUNCH_TEMPLATES

ASGS = ("aws:autoscaling/group:Group",)
MIGS = ("gcp:compute/instanceGroupManager:InstanceGroupManager", "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager")


def _asg_is_spot(g: Resource, resources: list[Resource]) -> bool | None:
    dist = _get(g, "mixedInstancesPolicy.instancesDistribution")
    if dist == UNKNOWN:
        return None
    if isinstance(dist, Mapping):
        pct = dist.get("onDemandPercentageAboveBaseCapacity", 100)
        base = dist.get("onDemandBaseCapacity", 0)
        if not (_known(pct) and _known(base)):
            return None
        return pct == 0 and base == 0
    templates = _of(resources, *LAUNCH_TEMPLATES)
    market = [_get(t, "instanceMarketOptions.marketType") for t in templates]
    return bool(market) and all(m == "spot" for m in market)


def _stops_group(s: Resource, g: Resource) -> bool:
    desired, low = _get(s, "desiredCapacity"), _get(s, "minSize")
    return desired == 0 and (low == 0 or _get(g, "minSize") == 0)


def spot_with_runtime_cap(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Groups run spot machines unless compute.spot: false was said, and the cloud itself stops
    them after compute.maxRuntimeHours (a scheduled scale to zero / a max run duration)."""
    out: list[Violation] = []
    groups = _of(resources, *ASGS)
    for g in groups:
        spot = _asg_is_spot(g, resources)
        if spot is False and not ctx.on_demand:
            out.append(Violation("spot-with-runtime-cap", g["name"], "runs on-demand machines; use 0% on-demand "
                                 "(spot) or say compute.spot: false"))
        schedules = [s for s in _of(resources, "aws:autoscaling/schedule:Schedule")
                     if _linked(s, g, "autoscalingGroupName", ("name",), groups)]
        if any(UNKNOWN in (_get(s, "desiredCapacity"), _get(s, "minSize")) for s in schedules):
            continue
        if not any(_stops_group(s, g) for s in schedules):
            out.append(Violation("spot-with-runtime-cap", g["name"], "no scheduled action sets the group to zero at "
                                 "launch + compute.maxRuntimeHours; add an autoscaling Schedule with desiredCapacity 0, minSize 0"))
    templates = _of(resources, *GCE_TEMPLATES)
    if _of(resources, *MIGS):
        for t in templates:
            model = _get(t, "scheduling.provisioningModel")
            spot = model == "SPOT" or _true(_get(t, "scheduling.preemptible"))
            if _known(model) and not spot and not ctx.on_demand:
                out.append(Violation("spot-with-runtime-cap", t["name"], "scheduling is not SPOT; set provisioningModel "
                                     "SPOT or say compute.spot: false"))
            secs = _get(t, "scheduling.maxRunDuration.seconds")
            if _known(secs) and not (isinstance(secs, int | str) and str(secs).isdigit() and int(secs) > 0):
                out.append(Violation("spot-with-runtime-cap", t["name"], "no scheduling.maxRunDuration; set it to "
                                     "compute.maxRuntimeHours so GCE stops the machines"))
    return out
