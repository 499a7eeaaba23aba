"""IamPropagation: a wait between IAM grants and what needs them, as a Pulumi dynamic resource.

Google documents that a change to an allow policy takes effect in about two minutes, and sometimes
in seven or more. A resource that uses a fresh grant at once can be refused: the placement
controller's function is built by a new service account with new grants (components/gcp/controller.py),
and a build refused for them fails the first `pulumi up`, now and then.

Why a dynamic resource of our own: the usual answer, the `time` provider's sleep (pulumiverse-time on
PyPI, last released at 0.1.1 in December 2024), is a Go provider plugin that `pulumi up` downloads
from GitHub, one more plugin for every user to fetch and trust, for a sleep. A dynamic resource runs
this module in the Python program's own environment (the dynamic provider host ships with the Pulumi
CLI), so the wait needs nothing installed. The engine calls it only on a real `pulumi up`: under the
SDK's mocks (`ops synth`, the tests) it is registered and never waits.

It sleeps when created and when what it waits for changes (`triggers`: the grants' ids, so a grant
replaced is waited for again), never on a refresh or a delete.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pulumi
import pulumi.dynamic

# Seconds between the build account's grants and the function's build: Google's "about two minutes",
# with a margin. The rarer propagation of seven minutes or more is not waited out on every first
# `pulumi up` (each would take that long): such a build fails with a permission error, and the next
# `pulumi up` builds it (the grants have long propagated, and the wait, its triggers unchanged, does not
# run again). docs/placements.md says so.
IAM_PROPAGATION_S = 180


class _Sleep(pulumi.dynamic.ResourceProvider):
    """Sleeps `seconds` on create, and on an update of its triggers."""

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        time.sleep(float(props["seconds"]))
        return pulumi.dynamic.CreateResult(id_=uuid.uuid4().hex, outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = [k for k in ("seconds", "triggers") if olds.get(k) != news.get(k)]
        return pulumi.dynamic.DiffResult(changes=bool(changed), replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        if olds.get("triggers") != news.get("triggers"):
            time.sleep(float(news["seconds"]))
        return pulumi.dynamic.UpdateResult(outs=news)


class IamPropagation(pulumi.dynamic.Resource):
    """A wait of `seconds` after `grants`: make what needs them depend on this."""

    def __init__(self, name: str, *, grants: list[pulumi.CustomResource], seconds: float = IAM_PROPAGATION_S,
                 opts: pulumi.ResourceOptions | None = None):
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=grants))
        super().__init__(_Sleep(), name, {"seconds": seconds, "triggers": [g.id for g in grants]}, opts)
