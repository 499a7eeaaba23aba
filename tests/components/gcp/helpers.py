"""Shared helpers for the GCP component tests: synthesize a stack from a few settings.

Each call runs the real `__main__.py` under the SDK's mocks through `ops.synth`
(pulumi-gcp inputs, camelCase); results are cached per settings, since tests only read
them. The GCP twin of tests/components/aws/helpers.py.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache

from ops import synth

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test@trainstack"
BASE = {
    "cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
    "run": {"id": "exp-7", "synthetic": True, "steps": 100},
    "compute": {"instanceTypes": ["g2-standard-8", "g2-standard-12"], "maxRuntimeHours": 6},
}
AWS_BASE = {"cloud": "aws", "region": "us-east-1", "run": {"id": "exp-7", "synthetic": True, "steps": 100}}
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"
FIREWALL = "gcp:compute/firewall:Firewall"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
IMAGE = "docker-build:index:Image"
CLIENT_CONFIG = "gcp:organizations/getClientConfig:getClientConfig"
AR_URL = "us-central1-docker.pkg.dev/my-proj-123/trainstack-unit/trainer"


@lru_cache(maxsize=16)
def _cached(frozen: str, stack: str) -> synth.Result:
    return synth.synthesize(json.loads(frozen), stack=stack)


def gcp(overrides: dict | None = None, stack: str = "unit") -> synth.Result:
    """Synthesize BASE + overrides (blocks updated key by key) as stack `stack`."""
    raw = copy.deepcopy(BASE)
    for k, v in (overrides or {}).items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    return _cached(json.dumps(raw, sort_keys=True), stack)


def one(result: synth.Result, type_token: str) -> dict:
    """The single resource of a type; fails when there are none or several."""
    found = result.of_type(type_token)
    assert len(found) == 1, f"expected one {type_token}, found {len(found)}"
    return found[0]
