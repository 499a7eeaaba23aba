"""The placement controller's function package: its files, the libraries it carries, their pins.

Both clouds' controller components (`components/*/controller.py`) build their package from
here: the controller's modules (`function_files`), the libraries a function runtime lacks at the
trainer's pins (`library_pins`, `library_files`), and for an AWS function reaching a GCP group the
compiled wheels built for Lambda's runtime (`lambda_wheel_files`: pip downloads them once into
build/, then the wheels are unzipped there). Standard library only; pip runs as a subprocess.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The controller function's package: the controller and the run folder's package it reads and marks
# runs with (runfolder/: layout, lease, store); its entry point is controller/handler.py:handler.
# Before runfolder/ was the ground floor the package carried the whole trainer: 45 files, 431,224 bytes
# of Python (controller/ + trainer/); with runfolder/ it is 23 files, 162,378 bytes (62 % less), measured
# when the change was made (function_files(ROOT)).
FUNCTION_PACKAGES = ("controller", "runfolder")
HANDLER_FILE = "controller/handler.py"
# Files of FUNCTION_PACKAGES the function never runs: the replay's command line (`python -m controller.replay`),
# which imports the simulated world (simworld/) and the stack's settings, neither of which the package carries.
NOT_SHIPPED = ("controller/replay.py",)
# The price decision's inputs (components/placement.py's decision_json) in the package, where
# controller/choice.py's INPUTS_FILE reads them: a file, since Lambda's environment holds 4 KB in all.
DECISION_FILE = "controller/decision.json"
# The libraries the controller's modules import that a function runtime may lack, each at the
# trainer's pin (trainer/requirements.txt). runfolder/storage's retries need tenacity; a placement on
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


def function_files(root: Path) -> dict[str, Path]:
    """The controller function's files under `root`: every .py of FUNCTION_PACKAGES, by its path in the
    package (`controller/handler.py`), sorted, but NOT_SHIPPED; no `__pycache__` (whose bytes differ from machine to
    machine and would change the function on every `pulumi up`)."""
    files = {}
    for package in FUNCTION_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if ("__pycache__" not in rel.parts and not any(part.startswith(".") for part in rel.parts)
                    and rel.as_posix() not in NOT_SHIPPED):
                files[rel.as_posix()] = path
    return files
