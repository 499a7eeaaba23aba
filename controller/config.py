"""The controller's configuration: the ``TRAINSTACK_PLACEMENTS`` document the stack writes.

::

    {"run_uri": "s3://B/runs/ID", "nodes": 1, "wait_minutes": 15,
     "placements": [{"cloud": "aws", "region": "us-east-1", "project": null, "group": "NAME"}, ...]}

Placement 0 is home (the bucket and the run folder live there). Group names are the stack's,
passed here, never guessed. Bad input is refused in one line naming the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

CLOUDS = ("aws", "gcp")
ENV_VAR = "TRAINSTACK_PLACEMENTS"


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
        placements.append(Placement(index=i, cloud=cloud, region=region, group=group, project=project))
    return Config(run_uri=run_uri.rstrip("/"), nodes=nodes, wait_minutes=wait, placements=tuple(placements))
