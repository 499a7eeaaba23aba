"""What every rule shares: the resource shape, violations, the config context and small readers.

A resource is a dict in the shape `ops synth` writes and the policy pack builds from the
engine's view: `{"type": "aws:s3/bucket:Bucket", "name", "parent", "inputs" (camelCase
property names), "options" ({"retainOnDelete", ...})}`. A value the engine cannot know yet
(during `pulumi preview`) arrives as `UNKNOWN`; rules do not judge such a value.

Standard library only (and `components.config_shared`, itself stdlib only): the policy
pack runs this in its own virtualenv.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components import config_shared
from policy import iam

UNKNOWN = "<unknown during preview>"

Resource = Mapping[str, Any]


@dataclass(frozen=True)
class Violation:
    """A rule broken by a resource: the rule id, the resource name, what is wrong and the fix."""

    rule: str
    resource: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.resource}: {self.message}"


@dataclass(frozen=True)
class Context:
    """What the stack's config says that the resources alone cannot: the user's explicit choices."""

    allowed_ssh_cidrs: tuple[str, ...] = ()
    """access.allowedCidrs: the only sources port 22 may be open to."""
    on_demand: bool = False
    """compute.spot: false was said explicitly, so on-demand machines are intended."""
    keep_bucket: bool = True
    """storage.keepOnDestroy: the bucket must survive `pulumi destroy`."""
    stack: str | None = None
    """When set, the stack tag/label must hold this value."""
    run_id: str | None = None
    """When set, the run tag/label must hold this value."""


def context_from_settings(settings: Any) -> Context:
    """The rule context for a validated `components.settings.Settings`."""
    return Context(
        allowed_ssh_cidrs=tuple(settings.access.allowed_cidrs),
        on_demand=not settings.compute.spot,
        keep_bucket=settings.storage.keep_on_destroy,
        stack=settings.stack,
        run_id=settings.run_id,
    )


def _pick(block: Any, camel: str, snake: str, default: Any) -> Any:
    if not isinstance(block, Mapping):
        return default
    v = block.get(camel, block.get(snake))
    return default if v is None else v


def context_from_config(raw: Mapping[str, Any], stack: str | None) -> Context:
    """The same context from the stack's raw `trainstack:` config, as the policy pack reads it.

    The pack runs without pydantic; the program has validated this config already, so only
    the values are read here, with the defaults `components.config_shared` holds for both.
    """
    run, compute = raw.get("run") or {}, raw.get("compute") or {}
    storage, access = raw.get("storage") or {}, raw.get("access") or {}
    return Context(
        allowed_ssh_cidrs=tuple(_pick(access, "allowedCidrs", "allowed_cidrs", config_shared.DEFAULT_ALLOWED_CIDRS)),
        on_demand=_pick(compute, "spot", "spot", config_shared.DEFAULT_SPOT) is False,
        keep_bucket=_pick(storage, "keepOnDestroy", "keep_on_destroy", config_shared.DEFAULT_KEEP_ON_DESTROY) is not False,
        stack=stack,
        run_id=config_shared.run_id_or_stack(_pick(run, "id", "id", config_shared.DEFAULT_RUN_ID), stack),
    )


def inputs_of(r: Resource) -> Mapping[str, Any]:
    return r.get("inputs") or {}


def get(r: Resource, path: str, default: Any = None) -> Any:
    """inputs[a][b][0][c] for path "a.b.0.c"; default when any step is missing."""
    cur: Any = inputs_of(r)
    for part in path.split("."):
        if cur == UNKNOWN:
            return UNKNOWN  # a whole block unknown: so is everything inside it
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return default
        if cur is None:
            return default
    return cur


def known(v: Any) -> bool:
    return v != UNKNOWN


def is_true(v: Any) -> bool:
    """True for true and "true" (EC2 launch templates type some booleans as strings)."""
    return v is True or (isinstance(v, str) and v.lower() == "true")


def is_false(v: Any) -> bool:
    return v is False or (isinstance(v, str) and v.lower() == "false")


def of_type(resources: Iterable[Resource], *types: str) -> list[Resource]:
    return [r for r in resources if r.get("type") in types]


def as_list(v: Any) -> list[Any]:
    return iam.as_list(v)


def keys_of(r: Resource, *fields: str) -> set[str]:
    """Every string another resource may use to point at `r` (its name, id, given name)."""
    out = {r.get("name"), r.get("id")}
    for f in fields:
        out.add(inputs_of(r).get(f))
        out.add((r.get("outputs") or {}).get(f))
    return {k for k in out if isinstance(k, str) and k and k != UNKNOWN}


def linked(child: Resource, owner: Resource, ref_field: str, owner_fields: tuple[str, ...],
            owners: list[Resource], *, engine_ids: bool = False) -> bool:
    """Whether `child` (a bucket's public access block, a group's schedule) belongs to `owner`.

    By reference when the child's input names the owner. When the reference cannot be read
    (unknown during preview), or, with `engine_ids`, is an id only the engine knows (a mock's
    or the cloud's) matching no owner, by sharing the owner's parent component alone.
    """
    ref = inputs_of(child).get(ref_field)
    if isinstance(ref, str) and known(ref):
        if ref in keys_of(owner, *owner_fields):
            return True
        if not engine_ids or any(ref in keys_of(o, *owner_fields) for o in owners):
            return False
    siblings = [o for o in owners if o.get("parent") == owner.get("parent")]
    return child.get("parent") is not None and child.get("parent") == owner.get("parent") and len(siblings) == 1


def json_doc(text: Any) -> Any:
    if isinstance(text, Mapping):
        return text
    if not isinstance(text, str) or not known(text):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def has_unknown(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_unknown(v) for v in value)
    return value == UNKNOWN
