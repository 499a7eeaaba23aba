"""The checks of `trainstack:placements`: several places one run may train, home first.

The first placement is home (the bucket, the run folder, the controller) and is the stack's own
`cloud`, `region` and `project`; its `instanceTypes` and `zones` are the stack's
`compute.instanceTypes` and `compute.zones` (`merge_home`, before the schema). Every other
placement must give the same run: the same total replicas (`compute.gpusPerNode` ×
`compute.nodes`, so each of its types has `gpusPerNode` GPUs), machine types and zones its
cloud has in its region, and the same image (a built one is pushed to a repository of home's cloud
and project in each placement's region, so it cannot go to another cloud or project). Each is checked by its cloud's own `validate()`
on the stack's settings moved to that placement, with the keys said as the placement's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from components import catalog
from components.settings.errors import ConfigError
from components.settings.schema import Settings


def merge_home(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with the home placement's machine types and zones as `compute`'s, when placements are given.

    The first placement is the stack's own place: its cloud, region and project must be the stack's
    keys, and `compute.instanceTypes` / `compute.zones`, when also set, must be the same lists.
    """
    out = dict(raw)
    placements = raw.get("placements")
    if placements is None:
        return out
    if not isinstance(placements, list):
        raise ConfigError("placements", f"{placements!r}: expected a list of placements, e.g. "
                          "[{cloud: aws, region: us-east-1, instanceTypes: [g5.xlarge]}]")
    if not placements or not isinstance(placements[0], Mapping):
        return out  # the schema says what is wrong with it
    home = placements[0]
    for key, default in (("cloud", "aws"), ("region", None), ("project", "")):
        if key == "project" and raw.get("cloud", "aws") != "gcp":
            continue  # an aws placement takes no project: the schema says so
        want, given = raw.get(key, default), home.get(key)
        if want is not None and given is not None and given != want:
            raise ConfigError(f"placements[0].{key}", f"{given!r}: the first placement is home and must be the "
                              f"stack's trainstack:{key} {want!r}")
    compute = raw.get("compute")
    if compute is not None and not isinstance(compute, Mapping):
        return out
    compute = dict(compute or {})
    for key in ("instanceTypes", "zones"):
        if key not in home:
            continue
        if key in compute and compute[key] != home[key]:
            raise ConfigError(f"placements[0].{key}", f"{home[key]!r} differs from compute.{key} {compute[key]!r}: "
                              f"the first placement is home; give its {key} in one of the two places")
        compute[key] = home[key]
    out["compute"] = compute
    return out


def at(s: Settings, index: int) -> Settings:
    """The stack's settings moved to placement `index`: its cloud, region, project, machine types and
    zones. Home's are the stack's own; elsewhere the subnets (of the home region's VPC) are left out,
    so the group takes its region's default VPC, and on the other cloud home's N1 accelerator too (the
    placement's types come with their GPUs)."""
    if index == 0:
        return s
    p = s.placement_list[index]
    return s.model_copy(update={
        "cloud": p.cloud, "region": p.region, "project": p.project or "",
        "compute": s.compute.model_copy(update={
            "instance_types": list(p.instance_types), "zones": list(p.zones), "subnets": [],
            **({"accelerator": None} if p.cloud != s.cloud else {})}),
    })


# A key of a check run on the stack moved to placement i, said as that placement's key.
_MOVED_KEY = re.compile(r"^(?:compute\.(instanceTypes|zones)(\[\d+\])?|(region|project))$")


def _as_placement_key(key: str, i: int) -> str | None:
    m = _MOVED_KEY.match(key)
    if m is None:
        return None
    return f"placements[{i}]." + (m.group(3) or m.group(1) + (m.group(2) or ""))


def validate(s: Settings, cloud_checks: Mapping[str, Callable[[Settings], None]]) -> None:
    """Refuse placements that cannot give the same run, one ConfigError naming the placement's key."""
    if not s.placements:
        return
    c = s.compute
    replicas = c.gpus_per_node * c.nodes
    seen: dict[tuple[str, str, str | None], int] = {}
    for i, p in enumerate(s.placements):
        where = (p.cloud, p.region, p.project)
        if where in seen:
            raise ConfigError(f"placements[{i}]", f"{p.cloud} {p.region}"
                              + (f" (project {p.project})" if p.project else "")
                              + f" is placements[{seen[where]}] again; list each place once")
        seen[where] = i
        if i > 0 and s.image.build and (p.cloud != s.cloud or (p.cloud == "gcp" and p.project != s.project)):
            # The built image is pushed to a repository of home's cloud and project in each placement's region.
            elsewhere = f"in project {p.project}" if p.cloud == s.cloud else f"on {p.cloud}"
            owner = f"Artifact Registry repositories of home's project ({s.project})" if s.cloud == "gcp" \
                else "ECR repositories of home's account"
            raise ConfigError("image.build", f"true pushes the image to {owner} only, and placements[{i}] "
                              f"({p.region}) is {elsewhere}; set image.build: false (a public image runs "
                              "everywhere) or list placements of home's " + ("project" if s.cloud == "gcp" else "cloud"))
        for j, t in enumerate(p.instance_types):
            counts = catalog.gpus_of(p.cloud, t)
            if counts is not None and c.gpus_per_node not in counts:
                raise ConfigError(f"placements[{i}].instanceTypes[{j}]", f"{t!r} has "
                                  f"{' or '.join(map(str, counts))} GPU(s), so this placement would train "
                                  f"{min(counts) * c.nodes} replicas, not the run's {replicas} (compute.gpusPerNode "
                                  f"{c.gpus_per_node} x compute.nodes {c.nodes}); every placement trains the same "
                                  f"replicas: list types with {c.gpus_per_node} GPU(s)")
        if i == 0:
            continue  # home: the stack's own keys, checked as the stack
        if p.cloud != s.cloud and c.image_id:
            raise ConfigError("compute.imageId", f"{c.image_id!r}: an image of home's cloud ({s.cloud}), and "
                              f"placements[{i}] is on {p.cloud}; remove it (each placement looks up its cloud's GPU image) or list "
                              f"{s.cloud} placements only")
        if p.cloud == "aws" and c.image_id:
            raise ConfigError("compute.imageId", f"{c.image_id!r}: an AMI belongs to one region and placements[{i}] "
                              f"is in {p.region}; remove it (each region looks up the Deep Learning AMI) or keep one "
                              "placement")
        across = p.cloud != s.cloud
        moved = at(s, i)
        if across:
            # Across clouds the run's data and bucket stay home's, reached by federation (a GCE machine through
            # an AWS role, an EC2 machine through a workload identity pool and home's service account, which
            # home grants on the data buckets as it grants its own machines): the placement's cloud checks
            # neither their scheme, nor their names, nor run.dataGrant.
            moved = moved.model_copy(update={
                "run": s.run.model_copy(update={"data_uri": None, "validation_data_uri": None, "data_grant": True}),
                "storage": s.storage.model_copy(update={"bucket_name": None})})
        try:
            cloud_checks[p.cloud](moved)
        except ConfigError as e:
            key = _as_placement_key(e.key, i)
            message = str(e).split(": ", 1)[1]
            if key is None:
                raise ConfigError(e.key, f"{message} (in placements[{i}], {p.region})") from None
            raise ConfigError(key, message) from None
