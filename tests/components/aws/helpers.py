"""Shared helpers for the AWS component tests: synthesize a stack from a few settings.

Each call runs the real `__main__.py` under the SDK's mocks through `ops.synth`;
results are cached per settings, since tests only read them.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

from ops import synth

ROOT = Path(__file__).resolve().parents[3]
STACKS = ROOT / "stacks"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test@trainstack"

BASE = {
    "cloud": "aws",
    "region": "eu-west-1",
    "run": {"id": "exp-7", "synthetic": True, "steps": 100},
    "compute": {"instanceTypes": ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"], "maxRuntimeHours": 6},
}


def merged(overrides: dict | None = None) -> dict:
    """BASE with blocks updated key by key from `overrides`."""
    raw = copy.deepcopy(BASE)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    return raw


@lru_cache(maxsize=32)
def _cached(frozen: str, stack: str) -> synth.Result:
    return synth.synthesize(json.loads(frozen), stack=stack)


def synth_raw(overrides: dict | None = None, *, stack: str = "unit") -> synth.Result:
    """Synthesize BASE + overrides as stack `stack`."""
    return _cached(json.dumps(merged(overrides), sort_keys=True), stack)


def synth_stack(name: str) -> synth.Result:
    """Synthesize stacks/Pulumi.<name>.yaml."""
    return synth.synthesize(STACKS / f"Pulumi.{name}.yaml")


def one(result: synth.Result, type_token: str) -> dict:
    """The single resource of a type; fails when there are none or several."""
    found = result.of_type(type_token)
    assert len(found) == 1, f"expected one {type_token}, found {len(found)}"
    return found[0]
