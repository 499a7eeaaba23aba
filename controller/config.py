"""The controller's configuration: the ``TRAINSTACK_PLACEMENTS`` document the stack writes.

::

    {"run_uri": "s3://B/runs/ID", "nodes": 1, "wait_minutes": 15, "max_runtime_s": 86400,
     "placements": [{"cloud": "aws", "region": "us-east-1", "project": null, "group": "NAME"}, ...,
                    {"cloud": "gcp", "region": "us-central1", "project": "P", "group": "NAME-p2",
                     "access": {"gcp_audience": "//iam.googleapis.com/projects/N/locations/global/workloadIdentityPools/POOL/providers/PROVIDER",
                                "service_account": "NAME@P.iam.gserviceaccount.com"}}]}

Placement 0 is home (the bucket and the run folder live there); the controller runs in home's
cloud. Group names are the stack's, passed here, never guessed. A placement on the other cloud
carries ``access``, how the controller's own identity reaches it by federation (never a key):

- an AWS placement of a GCP-home stack: ``{"aws_role_arn", "audience"}``, the role the
  function assumes with a Google ID token for ``audience`` (``AssumeRoleWithWebIdentity``);
- a GCP placement of an AWS-home stack: ``{"gcp_audience", "service_account"}``, the Workload
  Identity Pool provider the function's AWS identity is exchanged at and the service account
  it then impersonates.

A placement on home's cloud has none. ``max_runtime_s`` (``compute.maxRuntimeHours``, optional) is the
run's cap: its deadline is the ``deadline`` file the first machine writes (first boot + the cap), or, when
the controller's tick comes first, the one it writes itself the same way. Bad input is refused in one
line naming the key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from runfolder import environment

CLOUDS = ("aws", "gcp")
ENV_VAR = environment.PLACEMENTS
# ``access`` of a placement on the other cloud, by that placement's cloud: each key and the form
# its value must have (an IAM role ARN; AWS's `aud` for Google tokens is any string the role's
# trust names; a Workload Identity Pool provider's full resource name; a service account email).
ACCESS_KEYS: dict[str, dict[str, tuple[str, re.Pattern[str]]]] = {
    "aws": {
        "aws_role_arn": ("an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)",
                         re.compile(r"arn:aws(-[a-z]+)*:iam::\d{12}:role/[\w+=,.@/-]{1,512}")),
        "audience": ("the audience the role's trust policy names (a non-empty string)", re.compile(r"\S+")),
    },
    "gcp": {
        "gcp_audience": ("//iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/workloadIdentityPools/"
                         "POOL/providers/PROVIDER",
                         re.compile(r"//iam\.googleapis\.com/projects/\d+/locations/global/workloadIdentityPools/"
                                    r"[a-z0-9-]{4,32}/providers/[a-z0-9-]{4,32}")),
        "service_account": ("a service account email (NAME@PROJECT.iam.gserviceaccount.com)",
                            re.compile(r"[a-z0-9-]{6,30}@[a-z0-9-]+\.iam\.gserviceaccount\.com")),
    },
}


class ConfigError(ValueError):
    """The configuration document is not usable; the message names the key."""


@dataclass(frozen=True)
class Placement:
    """One placement: a cloud region and the stack's group there."""

    index: int
    cloud: str
    region: str
    group: str
    project: str | None = None
    access: Mapping[str, str] | None = field(default=None, hash=False)
    """How the controller reaches a placement on the other cloud (module docstring); None on home's cloud."""

    @property
    def label(self) -> str:
        """``aws us-west-2`` (what an operator reads and types after ``--to``)."""
        return f"{self.cloud} {self.region}"


@dataclass(frozen=True)
class Config:
    """What the controller moves: the run, its size, the wait and the placements (0 = home)."""

    run_uri: str
    nodes: int
    wait_minutes: int
    placements: tuple[Placement, ...]
    max_runtime_s: int | None = None
    """The run's cap in seconds (None: the deadline comes only from the run folder's ``deadline`` file)."""

    @property
    def wait_s(self) -> float:
        return 60.0 * self.wait_minutes

    def find(self, where: str) -> Placement:
        """The placement ``where`` names: its index, its region, or ``cloud region`` / ``cloud:region``."""
        text = where.strip()
        if text.isdigit() and int(text) < len(self.placements):
            return self.placements[int(text)]
        cloud, _, region = text.replace(":", " ").rpartition(" ")
        found = [p for p in self.placements if p.region == region and (not cloud or p.cloud == cloud.strip())]
        if len(found) == 1:
            return found[0]
        names = ", ".join(f"{p.index} ({p.label})" for p in self.placements)
        which = "more than one placement is" if found else "no placement is"
        raise ConfigError(f"{which} {where!r}; the placements: {names} (give the index or cloud:region)")


def _need(doc: dict, key: str, kind: type, where: str):
    value = doc.get(key)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{where}{key}: expected {kind.__name__}, got {value!r}")
    return value


def parse(text: str | bytes | dict) -> Config:
    """The configuration in ``text`` (JSON, or the parsed document); raises :class:`ConfigError`."""
    if isinstance(text, dict):
        doc = text
    else:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{ENV_VAR}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{ENV_VAR}: expected a JSON object, got {type(doc).__name__}")
    run_uri = _need(doc, "run_uri", str, "")
    if not run_uri.startswith(("s3://", "gs://", "file://")):
        raise ConfigError(f"run_uri: expected s3://, gs:// or file://, got {run_uri!r}")
    nodes = _need(doc, "nodes", int, "")
    if nodes < 1:
        raise ConfigError(f"nodes: expected 1 or more, got {nodes}")
    wait = _need(doc, "wait_minutes", int, "")
    if wait < 1:
        raise ConfigError(f"wait_minutes: expected 1 or more, got {wait}")
    max_runtime = doc.get("max_runtime_s")
    if max_runtime is not None and (isinstance(max_runtime, bool) or not isinstance(max_runtime, int)
                                    or max_runtime < 1):
        raise ConfigError(f"max_runtime_s: expected a whole number of seconds, 1 or more, got {max_runtime!r}")
    raw = _need(doc, "placements", list, "")
    if not raw:
        raise ConfigError("placements: expected at least one placement")
    placements = []
    seen = set()
    for i, p in enumerate(raw):
        where = f"placements[{i}]."
        if not isinstance(p, dict):
            raise ConfigError(f"placements[{i}]: expected an object, got {p!r}")
        cloud = _need(p, "cloud", str, where)
        if cloud not in CLOUDS:
            raise ConfigError(f"{where}cloud: expected one of {', '.join(CLOUDS)}, got {cloud!r}")
        region = _need(p, "region", str, where)
        group = _need(p, "group", str, where)
        project = p.get("project")
        if cloud == "gcp" and not (isinstance(project, str) and project):
            raise ConfigError(f"{where}project: a gcp placement needs its project id, got {project!r}")
        if project is not None and not isinstance(project, str):
            raise ConfigError(f"{where}project: expected a string or null, got {project!r}")
        if (cloud, region, group) in seen:
            raise ConfigError(f"{where}group: {cloud} {region} {group} is listed twice")
        seen.add((cloud, region, group))
        access = _access(p.get("access"), cloud, placements[0].cloud if placements else cloud, where)
        placements.append(Placement(index=i, cloud=cloud, region=region, group=group, project=project,
                                    access=access))
    return Config(run_uri=run_uri.rstrip("/"), nodes=nodes, wait_minutes=wait, placements=tuple(placements),
                  max_runtime_s=max_runtime)


def _access(value, cloud: str, home: str, where: str) -> Mapping[str, str] | None:
    """A placement's ``access``, checked: required on the other cloud than home's, refused on home's."""
    if cloud == home:
        if value is not None:
            raise ConfigError(f"{where}access: a placement on home's cloud ({home}) is reached with the controller's "
                              f"own identity; expected none, got {value!r}")
        return None
    keys = ACCESS_KEYS[cloud]
    if not isinstance(value, dict):
        raise ConfigError(f"{where}access: a {cloud} placement of a {home} stack is reached by federation and needs "
                          f"{{{', '.join(keys)}}}, got {value!r}")
    for key in value:
        if key not in keys:
            raise ConfigError(f"{where}access.{key}: not a key of a {cloud} placement's access "
                              f"(expected {', '.join(keys)})")
    for key, (what, pattern) in keys.items():
        got = value.get(key)
        if not isinstance(got, str) or not pattern.fullmatch(got):
            raise ConfigError(f"{where}access.{key}: expected {what}, got {got!r}")
    return dict(value)
