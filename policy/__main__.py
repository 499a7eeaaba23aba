"""trainstack's Pulumi policy pack: `pulumi preview --policy-pack policy` runs `policy.rules` on the stack.

One implementation, two entry points: each rule of `policy.rules.RULES` becomes one policy
that converts the engine's view of the resources (type, name, props, options) to the dict
shape `ops synth` writes and calls the same function the tests call. Rules that judge one
resource run as resource policies (on inputs, before anything is created); rules that
relate several resources (a bucket and its public access block, a group and its
schedule) run as stack policies.

The user's explicit choices (allowed SSH CIDRs, on-demand, a disposable bucket) come from
the stack's own `trainstack:` config, which the engine hands to the pack. Every policy is
mandatory; a waiver is an explicit `--policy-pack-config` entry (see policy/README.md).

The pack runs in its own virtualenv (`.venv-policy`, from policy/requirements.txt):
pulumi-policy pins a protobuf that TensorFlow's cannot share.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# The engine runs this file with policy/ as the working directory; the rules import as
# the `policy` package from the project root.
# (components/project.py's ROOT, which cannot be imported until this puts it on the path).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from pulumi_policy import (  # noqa: E402
    EnforcementLevel,
    PolicyPack,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy import proxy as _proxy  # noqa: E402

from policy import rules  # noqa: E402

PACK_NAME = "trainstack"
CONFIG_BLOCKS = ("run", "compute", "storage", "access")

_UNKNOWN_SENTINELS = frozenset({
    _proxy.UNKNOWN_BOOLEAN_VALUE, _proxy.UNKNOWN_NUMBER_VALUE, _proxy.UNKNOWN_STRING_VALUE,
    _proxy.UNKNOWN_ARRAY_VALUE, _proxy.UNKNOWN_ASSET_VALUE, _proxy.UNKNOWN_ARCHIVE_VALUE,
    _proxy.UNKNOWN_OBJECT_VALUE,
})


def plain(value: Any) -> Any:
    """Props as plain dicts and lists, unknown values as `rules.UNKNOWN`.

    The engine's props raise on any unknown value read; a rule must instead see that the
    value is unknown and leave it to the next preview, so the proxies are unwrapped here
    (their `__target` is the wrapped container).
    """
    if isinstance(value, str):
        return rules.UNKNOWN if value in _UNKNOWN_SENTINELS else value
    if isinstance(value, Mapping):
        raw = value["__target"] if isinstance(value, _proxy._DictProxy) else value
        return {str(k): plain(v) for k, v in raw.items()}
    if isinstance(value, Sequence):
        raw = value["__target"] if isinstance(value, _proxy._ListProxy) else value
        return [plain(v) for v in raw]
    return value


def _urn_name(urn: str | None) -> str | None:
    return urn.split("::")[-1] if urn else None


def _options(opts: Any) -> dict[str, Any]:
    # The engine does not tell policy packs about retainOnDelete: unknown, not false.
    return {
        "retainOnDelete": rules.UNKNOWN,
        "protect": bool(getattr(opts, "protect", False)),
        "ignoreChanges": list(getattr(opts, "ignore_changes", None) or []),
    }


def resource_from_args(args: ResourceValidationArgs) -> dict[str, Any]:
    """One resource under validation, in the synth shape."""
    return {
        "type": args.resource_type,
        "name": args.name,
        "parent": _urn_name(getattr(args.opts, "parent", None)),
        "inputs": plain(args.props),
        "options": _options(args.opts),
    }


def resources_from_stack(args: StackValidationArgs) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The stack's resources in the synth shape, and each name's URN (for the report)."""
    out, urns = [], {}
    for r in args.resources:
        out.append({
            "type": r.resource_type,
            "name": r.name,
            "parent": r.parent.name if r.parent is not None else None,
            "inputs": plain(r.props),
            "options": _options(r.opts),
        })
        urns[r.name] = r.urn
    return out, urns


def stack_context() -> rules.Context:
    """The rule context from the stack's `trainstack:` config, as the engine passes it to the pack."""
    import pulumi

    cfg = pulumi.Config("trainstack")
    raw = {}
    for k in CONFIG_BLOCKS:
        try:
            v = cfg.get_object(k)
        except Exception:  # noqa: BLE001 - a malformed block is the program's error to report, not the pack's
            v = None
        if v is not None:
            raw[k] = v
    return rules.context_from_config(raw, os.environ.get("PULUMI_STACK"))


def _resource_policy(rule: rules.Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report: Callable[..., None]) -> None:
        for v in rule.check([resource_from_args(args)], stack_context()):
            report(f"{v.message} ({rule.why})")

    return ResourceValidationPolicy(name=rule.id, description=rule.description, validate=validate)


def _stack_policy(rule: rules.Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report: Callable[..., None]) -> None:
        resources, urns = resources_from_stack(args)
        for v in rule.check(resources, stack_context()):
            report(f"{v.resource}: {v.message} ({rule.why})", urns.get(v.resource))

    return StackValidationPolicy(name=rule.id, description=rule.description, validate=validate)


def build_policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """One policy per rule, same id and description."""
    return [_resource_policy(r) if r.scope == "resource" else _stack_policy(r) for r in rules.RULES]


POLICIES = build_policies()

if __name__ == "__main__":
    PolicyPack(name=PACK_NAME, policies=POLICIES, enforcement_level=EnforcementLevel.MANDATORY)
