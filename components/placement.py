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
from pathlib import Path
from typing import Any

from components.settings import Settings

# The controller function's environment variable holding its configuration (`controller_config`).
CONFIG_ENV = "TRAINSTACK_PLACEMENTS"
# The controller function's package: the controller and the trainer modules it reads the run folder
# with (trainer/layout.py, lease.py, storage/); its entry point is controller/handler.py:handler.
FUNCTION_PACKAGES = ("controller", "trainer")
HANDLER_FILE = "controller/handler.py"
# The libraries those modules import that neither function runtime has: trainer/storage's retries
# (tenacity). Lambda's Python runtime brings boto3 and nothing else, and a Lambda package is not
# built by the cloud, so the AWS package carries them (pure Python, copied from this program's
# environment, which must hold the trainer's pin); Cloud Functions installs requirements.txt.
FUNCTION_LIBRARIES = ("tenacity",)
TRAINER_REQUIREMENTS = Path(__file__).resolve().parents[1] / "trainer" / "requirements.txt"


def library_pins() -> list[str]:
    """FUNCTION_LIBRARIES as the trainer pins them (`name==version` lines of trainer/requirements.txt)."""
    lines = TRAINER_REQUIREMENTS.read_text().splitlines()
    return [next(line for line in lines if line.startswith(f"{name}==")) for name in FUNCTION_LIBRARIES]


def library_files() -> dict[str, Path]:
    """The .py files of FUNCTION_LIBRARIES, by their path in the package (`tenacity/retry.py`), from this
    environment; refused when an installed version is not the trainer's pin (the function would run
    another library than the one the trainer is tested with)."""
    import importlib.metadata
    import importlib.util

    files = {}
    for name, pin in zip(FUNCTION_LIBRARIES, library_pins(), strict=True):
        wanted, installed = pin.split("==", 1)[1], importlib.metadata.version(name)
        if installed != wanted:
            raise RuntimeError(f"the placement controller's package takes {name} from this environment, which has "
                               f"{installed}; the trainer pins {wanted}: pip install -r requirements.txt")
        (where,) = importlib.util.find_spec(name).submodule_search_locations
        base = Path(where)
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base.parent)
            if "__pycache__" not in rel.parts:
                files[rel.as_posix()] = path
    return files


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
    """The stack's settings moved to placement `index`: its cloud, region, project, machine types and
    zones. Home's are the stack's own; elsewhere the subnets (of the home region's VPC) are left out,
    so the group takes its region's default VPC."""
    if index == 0:
        return settings
    p = settings.placement_list[index]
    return settings.model_copy(update={
        "cloud": p.cloud, "region": p.region, "project": p.project or "",
        "compute": settings.compute.model_copy(update={
            "instance_types": list(p.instance_types), "zones": list(p.zones), "subnets": []}),
    })


def controller_config(settings: Settings, run_uri: str, groups: list[str],
                      access: Mapping[int, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """The controller's configuration: the run, its size, the wait before a move and every placement's group.

    `{"run_uri", "nodes", "wait_minutes", "placements": [{"cloud", "region", "project", "group"[, "access"]}]}`,
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
        "placements": entries,
    }


def controller_config_json(settings: Settings, run_uri: str, groups: list[str],
                           access: Mapping[int, Mapping[str, str]] | None = None) -> str:
    """`controller_config` as the one-line JSON the function's environment holds (keys sorted)."""
    return json.dumps(controller_config(settings, run_uri, groups, access), sort_keys=True, separators=(",", ":"))


def function_files(root: Path) -> dict[str, Path]:
    """The controller function's files under `root`: every .py of FUNCTION_PACKAGES, by its path in the
    package (`controller/handler.py`), sorted; no `__pycache__` (whose bytes differ from machine to
    machine and would change the function on every `pulumi up`)."""
    files = {}
    for package in FUNCTION_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if "__pycache__" not in rel.parts and not any(part.startswith(".") for part in rel.parts):
                files[rel.as_posix()] = path
    return files
