"""What a stack of several placements shares across both clouds: each placement's group name, the
stack's settings moved to a placement, and the controller's configuration.

The first placement is home: its group is the stack's own group (the name and resources every
one-placement stack has). Placement `i >= 1` has a group of its own in its region, named after the
home group with `-p<i>`, created at size zero; the controller (`TRAINSTACK_PLACEMENTS`, one JSON
document) is told every group's name and never guesses one. Standard library and settings only:
`ops` reads these without loading a provider SDK.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# The controller's function package (its files, libraries and Lambda wheels) is built by
# components/function_package.py; these names stay importable from here, as before.
from components.function_package import (  # noqa: F401 - re-exported
    AWS_LIBRARIES,
    DECISION_FILE,
    FEDERATION_LIBRARIES,
    FUNCTION_LIBRARIES,
    FUNCTION_PACKAGES,
    GCP_FUNCTION_LIBRARIES,
    HANDLER_FILE,
    LAMBDA_WHEELS,
    WHEEL_CACHE,
    function_files,
    lambda_wheel_files,
    library_files,
    library_pins,
)
from components.settings import Settings, placements


def max_price_warning(index: int, region: str, price: float) -> str:
    """What `pulumi up` says of an AWS home's `compute.maxPricePerHour` and its GCP placement `index`: GCE's
    Spot VMs have no maximum price (their scheduling takes none), so the price holds on the AWS placements only."""
    return (f"compute.maxPricePerHour ({price}) holds on the AWS placements only: placements[{index}] ({region}) is "
            "on GCP, whose Spot VMs have no maximum price; its machines pay GCE's current Spot price")


def group_name(home_group: str, index: int) -> str:
    """The group of placement `index` (0 = home): the home group's name, with `-p<index>` for the others.

    The suffix keeps every name within its cloud's limit: AWS group names of at most 245
    characters and GCE group names of at most 54 (components/*/naming.py) leave room for it.
    """
    if index < 0:
        raise ValueError(f"placement index {index}: expected 0 or more")
    return home_group if index == 0 else f"{home_group}-p{index}"


def group_names(settings: Settings, home_group: str) -> list[str]:
    """Every placement's group name, home first."""
    return [group_name(home_group, i) for i in range(len(settings.placement_list))]


def settings_at(settings: Settings, index: int) -> Settings:
    """The stack's settings moved to placement `index` (components/settings/placements.py's `at`, which the
    checks run on too)."""
    return placements.at(settings, index)


def controller_config(settings: Settings, run_uri: str, groups: list[str],
                      access: Mapping[int, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """The controller's configuration: the run, its size, the wait before a move and every placement's group.

    `{"run_uri", "nodes", "wait_minutes", "max_runtime_s", "placements": [{"cloud", "region", "project", "group"
    [, "access"]}]}`,
    placements in the stack's order (index 0 is home). `access` (by placement index) is how the controller,
    which runs in home's cloud, reaches a placement on the other cloud: for a GCP placement of an AWS home
    `{"gcp_audience": "//iam.googleapis.com/projects/NUMBER/locations/global/workloadIdentityPools/POOL/providers/
    PROVIDER", "service_account": "NAME@PROJECT.iam.gserviceaccount.com"}`. Every placement on the other cloud
    has one, and no other placement.
    """
    placements = settings.placement_list
    if len(groups) != len(placements):
        raise ValueError(f"{len(groups)} group names for {len(placements)} placements")
    access = dict(access or {})
    across = {i for i, p in enumerate(placements) if p.cloud != settings.cloud}
    if set(access) != across:
        raise ValueError(f"access for placements {sorted(access)}; the placements on another cloud than home are "
                         f"{sorted(across)}")
    entries = []
    for i, (p, g) in enumerate(zip(placements, groups, strict=True)):
        entry: dict[str, Any] = {"cloud": p.cloud, "region": p.region, "project": p.project, "group": g}
        if i in access:
            entry["access"] = dict(access[i])
        entries.append(entry)
    return {
        "run_uri": run_uri,
        "nodes": settings.compute.nodes,
        "wait_minutes": settings.placement.wait_minutes,
        "max_runtime_s": int(settings.compute.max_runtime_hours * 3600),  # as the machines count it (userdata)
        "placements": entries,
    }


def controller_config_json(settings: Settings, run_uri: str, groups: list[str],
                           access: Mapping[int, Mapping[str, str]] | None = None) -> str:
    """`controller_config` as the one-line JSON the function's environment holds (keys sorted)."""
    return json.dumps(controller_config(settings, run_uri, groups, access), sort_keys=True, separators=(",", ":"))

