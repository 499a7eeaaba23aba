"""What a stack of several placements shares across both clouds: each placement's group name, the
stack's settings moved to a placement, and the controller's configuration.

The first placement is home: its group is the stack's own group (the name and resources every
one-placement stack has). Placement `i >= 1` has a group of its own in its region, named after the
home group with `-p<i>`, created at size zero; the controller (`TRAINSTACK_PLACEMENTS`, one JSON
document) is told every group's name and never guesses one. Standard library and settings only:
`ops` reads these without loading a provider SDK.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
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
# The libraries the controller's modules import that a function runtime may lack, each at the
# trainer's pin (trainer/requirements.txt). trainer/storage's retries need tenacity; a placement on
# the other cloud needs google-auth (an AWS function reaching a GCP group: `external_account`
# credentials with an AWS source, and its `requests` transport) or boto3 (a GCP function reaching an
# AWS group: botocore's web-identity credentials).
# - AWS: Lambda's python3.12 runtime brings boto3 and its own dependencies (botocore, s3transfer,
#   jmespath, dateutil, urllib3, six) and nothing else, and a Lambda package is not built by the
#   cloud, so the package carries the rest, pure Python, copied from this program's environment
#   (which must hold the trainer's pins): FUNCTION_LIBRARIES always, FEDERATION_LIBRARIES only when a
#   placement is on GCP. urllib3 stays the runtime's: its botocore imports it, and requests takes any
#   1.26 or 2.x. google-auth's credentials module imports cryptography, which loads cffi's compiled
#   backend: those two cannot be copied from this environment (its Python and platform need not be
#   Lambda's), so a package reaching GCP takes their wheels built for Lambda's runtime
#   (LAMBDA_WHEELS, `lambda_wheel_files`).
# - GCP: Cloud Functions installs requirements.txt: the GCS client (which brings google-auth and
#   requests), GCP_FUNCTION_LIBRARIES, and AWS_LIBRARIES only when a placement is on AWS.
FUNCTION_LIBRARIES = ("tenacity",)
FEDERATION_LIBRARIES = ("google-auth", "pyasn1-modules", "pyasn1", "requests", "charset-normalizer", "idna", "certifi",
                        "pycparser")
GCP_FUNCTION_LIBRARIES = ("tenacity", "google-auth")
AWS_LIBRARIES = ("boto3",)
TRAINER_REQUIREMENTS = Path(__file__).resolve().parents[1] / "trainer" / "requirements.txt"
# The compiled libraries of the AWS package, as wheels for Lambda's python3.12 on x86_64 (the
# function's default architecture; the runtime is Amazon Linux 2023, glibc 2.34), fetched once by
# pip from the package index and kept under build/ (the first `pulumi up` needs the index).
LAMBDA_WHEELS = ("cryptography", "cffi")
LAMBDA_PYTHON = "3.12"
LAMBDA_PLATFORMS = ("manylinux_2_34_x86_64", "manylinux2014_x86_64")
WHEEL_CACHE = Path(__file__).resolve().parents[1] / "build" / "function-wheels"
PIP_TIMEOUT_S = 600


def library_pins(names: tuple[str, ...] = GCP_FUNCTION_LIBRARIES) -> list[str]:
    """`names` as the trainer pins them (`name==version` lines of trainer/requirements.txt): by default,
    what the GCP function's requirements.txt adds to the GCS client."""
    lines = TRAINER_REQUIREMENTS.read_text().splitlines()
    return [next(line for line in lines if line.startswith(f"{name}==")) for name in names]


def library_files(*, federation: bool) -> dict[str, Path]:
    """The files of FUNCTION_LIBRARIES, and with `federation` (a placement on GCP) those of
    FEDERATION_LIBRARIES and LAMBDA_WHEELS, by their path in the package (`tenacity/retry.py`,
    `google/auth/aws.py`, `certifi/cacert.pem`), from this environment's installed distributions:
    their modules and data, no compiled file (`__pycache__`, `.so`: the runtime's Python is not
    this one, and each of these libraries has a pure-Python path); refused when an installed version
    is not the trainer's pin (the function would run another library than the one the trainer is
    tested with)."""
    import importlib.metadata

    files = {}
    names = FUNCTION_LIBRARIES + (FEDERATION_LIBRARIES if federation else ())
    for name, pin in zip(names, library_pins(names), strict=True):
        wanted, installed = pin.split("==", 1)[1], importlib.metadata.version(name)
        if installed != wanted:
            raise RuntimeError(f"the placement controller's package takes {name} from this environment, which has "
                               f"{installed}; the trainer pins {wanted}: pip install -r requirements.txt")
        dist = importlib.metadata.distribution(name)
        for entry in dist.files or ():
            parts = entry.parts
            if (parts[0] == ".." or parts[0].endswith((".dist-info", ".egg-info")) or "__pycache__" in parts
                    or entry.suffix in (".so", ".pyd", ".pyc")):
                continue
            files[entry.as_posix()] = Path(str(dist.locate_file(entry)))
    if federation:
        files.update(lambda_wheel_files())
    return dict(sorted(files.items()))


def lambda_wheel_files(cache: Path = WHEEL_CACHE) -> dict[str, Path]:
    """The files of LAMBDA_WHEELS' wheels for Lambda's runtime, by their path in the package, unpacked
    under `cache` (downloaded by pip at the trainer's pins the first time; later calls read the cache)."""
    pins = library_pins(LAMBDA_WHEELS)
    key = hashlib.sha256("\n".join([*pins, LAMBDA_PYTHON, *LAMBDA_PLATFORMS]).encode()).hexdigest()[:16]
    where = cache / key
    if not (where / "files").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache))
        try:
            platforms = [arg for p in LAMBDA_PLATFORMS for arg in ("--platform", p)]
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                 "--implementation", "cp", "--python-version", LAMBDA_PYTHON, *platforms, "--dest",
                 str(work / "wheels"), *pins], capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"the placement controller's package needs {', '.join(pins)} built for Lambda's "
                                   f"python{LAMBDA_PYTHON} (x86_64) and pip could not fetch them: {last}")
            for wheel in sorted((work / "wheels").glob("*.whl")):
                with zipfile.ZipFile(wheel) as z:
                    z.extractall(work / "files", [m for m in z.namelist()
                                                  if not m.split("/")[0].endswith((".dist-info", ".data"))])
            try:
                os.replace(work, where)  # atomic: a concurrent run's finished copy is as good as this one
            except OSError:
                if not (where / "files").is_dir():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    base = where / "files"
    return {path.relative_to(base).as_posix(): path for path in sorted(base.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts}


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
    """The stack's settings moved to placement `index`: its cloud, region, project, machine types and
    zones. Home's are the stack's own; elsewhere the subnets (of the home region's VPC) are left out,
    so the group takes its region's default VPC, and on the other cloud home's N1 accelerator too (the
    placement's types come with their GPUs)."""
    if index == 0:
        return settings
    p = settings.placement_list[index]
    return settings.model_copy(update={
        "cloud": p.cloud, "region": p.region, "project": p.project or "",
        "compute": settings.compute.model_copy(update={
            "instance_types": list(p.instance_types), "zones": list(p.zones), "subnets": [],
            **({"accelerator": None} if p.cloud != settings.cloud else {})}),
    })


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
