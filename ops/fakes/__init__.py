"""The fake cloud `ops synth` runs the program against: one `Mocks` routing to each cloud's answers.

`ops.fakes.aws` and `ops.fakes.gcp` give each resource type its fake id and outputs and
answer each lookup; `ops.fakes.common` holds what they share. Every value is well formed
and obviously fake (account 123456789012, ami-0123…, fake-project).

This is the project's one fake cloud under the Pulumi mocks. The tests build on it for two
other jobs: `tests/fixtures/registrations.py` (one component built directly, every request's
options kept) and `tests/fixtures/fake_cloud.py` (the engine's state and the cloud's rules
across `up`s and `destroy`s).
"""

from __future__ import annotations

from typing import Any

import pulumi

from ops.fakes import aws, gcp
from ops.fakes.common import (
    DOCKER_IMAGE,
    DYNAMIC,
    RANDOM_ID,
    docker_image,
    fake_hex,
    jsonable,
    random_id,
    signing_public_key,
    urn_name,
)


class Mocks(pulumi.runtime.Mocks):
    """Resource outputs and lookups for both clouds; records each lookup in `invokes`."""

    def __init__(self, region: str, gcp_project: str = ""):
        self.region = region
        self.gcp_project = gcp_project or "fake-project"
        self.invokes: list[dict[str, Any]] = []
        self.made: set[str] = set()
        # Each provider's region, by its name: a stack of several placements has one provider per region,
        # and a lookup or resource made through it answers for that region.
        self.provider_regions: dict[str, str] = {}
        self.provider_projects: dict[str, str] = {}
        # The stack's own region and project are the user's, even where the fake cloud repeats them.
        self._real = {region, gcp_project} - {""}
        """Every id and value the fake cloud made up (not the program's own inputs): the plan marks them."""

    def _remember(self, value: Any, inputs: Any = None) -> None:
        if isinstance(value, str):
            if len(value) >= 6 and value not in self._real and not _holds(inputs, value):
                self.made.add(value)
        elif isinstance(value, dict):
            for v in value.values():
                self._remember(v, inputs)
        elif isinstance(value, list | tuple):
            for v in value:
                self._remember(v, inputs)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        """The fake id and outputs (the inputs plus what the cloud would add) of one resource."""
        t, name, inputs = args.typ, args.name, dict(args.inputs)
        if not args.custom:
            return None, {}
        h = fake_hex(t, name)
        out = dict(inputs)
        if t.startswith("aws:"):
            rid, extra = aws.resource(t, name, inputs, h, self._region_of(args.provider))
        elif t.startswith("gcp:"):
            # A resource of another project (an AWS-home stack's GCP placement) says which, or its provider does.
            project = inputs.get("project") or self.provider_projects.get(urn_name(args.provider or "")) \
                or self.gcp_project
            rid, extra = gcp.resource(t, name, inputs, h, project)
        elif t == DOCKER_IMAGE:
            rid, extra = docker_image(name, inputs, h)
        elif t == RANDOM_ID:
            rid, extra = random_id(inputs, h)
        elif t == DYNAMIC and {"key", "repository_urls", "digest"} <= inputs.keys() and not inputs.get("public_key"):
            # An ImageSignature (components/image_signature.py): KMS would give its key's public half at `pulumi up`.
            rid, extra = f"{name}-{h[:7]}", {"public_key": signing_public_key(h)}
            self._remember(list(extra.values()), inputs)
        elif t.startswith("pulumi:providers:"):
            rid, extra = f"{name}-provider-id", {}
            self.note_provider(args)
        else:
            rid, extra = f"{name}-{h[:7]}", {}
        out.update(extra)
        # Only what the fake cloud invented: values carrying this resource's fake hex or the fake
        # account; an output composed of the program's own inputs (gs://<its bucket name>) is real.
        invented = [v for v in (rid, *extra.values()) if _mentions(v, (h[:7], aws.FAKE_ACCOUNT, "fake"))]
        self._remember(invented, inputs)
        return rid, out

    def note_provider(self, args: pulumi.runtime.MockResourceArgs) -> None:
        """Remember a provider's region: what is made or looked up through it answers for that region."""
        if args.typ.startswith("pulumi:providers:") and args.inputs.get("region"):
            self.provider_regions[args.name] = str(args.inputs["region"])
        if args.typ == "pulumi:providers:gcp" and args.inputs.get("project"):
            self.provider_projects[args.name] = str(args.inputs["project"])

    def _region_of(self, provider: str | None) -> str:
        """The region of the provider a request names (`urn::id`), else the stack's."""
        return self.provider_regions.get(urn_name(provider or ""), self.region)

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        """The fake answer to one lookup; an unknown lookup fails loudly instead of answering nothing."""
        fn, a = args.token, dict(args.args)
        self.invokes.append({"token": fn, "args": jsonable(a), "provider": urn_name(args.provider or "") or None})
        answer = None
        region = self._region_of(args.provider)
        if fn.startswith("aws:"):
            answer = aws.call(fn, a, region)
        elif fn.startswith("gcp:"):
            answer = gcp.call(fn, a, region, self.gcp_project)
        if answer is None:
            raise NotImplementedError(f"ops synth has no fake answer for {fn}")
        self._remember(answer, a)
        return answer


def _mentions(value: Any, markers: tuple[str, ...]) -> bool:
    """Whether any string in `value` contains one of `markers`."""
    if isinstance(value, str):
        return any(m in value for m in markers)
    if isinstance(value, dict):
        return any(_mentions(v, markers) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_mentions(v, markers) for v in value)
    return False


def _holds(inputs: Any, value: str) -> bool:
    """Whether `value` is one of the strings in `inputs` (the program's own, not made up)."""
    if isinstance(inputs, str):
        return inputs == value
    if isinstance(inputs, dict):
        return any(_holds(v, value) for v in inputs.values())
    if isinstance(inputs, list | tuple):
        return any(_holds(v, value) for v in inputs)
    return False


__all__ = ["DOCKER_IMAGE", "Mocks", "aws", "fake_hex", "gcp", "jsonable", "urn_name"]
