"""Every AWS and GCP resource, and every lookup, names its provider: none falls to a default provider.

pulumi-aws's default provider needs an `aws:region` the stacks never set, and reads a profile the explicit
providers may not: a resource on it fails a real `pulumi up`, or lands in another account. pulumi-gcp's
reads the project from the environment. The real `__main__.py` runs under the mocks (`ops synth`) for every
stack file and every variant that reaches the optional resources (tests/components/test_provider_values.py),
and the mock monitor records the provider each registration and each lookup names: a default one is none.
"""

from __future__ import annotations

import copy

import pytest

from tests.components.test_provider_values import CASES, synthesized

# The clouds whose default providers read the deployer's environment (kubernetes': the kubeconfig's current
# context); `random` and `docker-build` have no account to pick.
CLOUDS = ("aws", "gcp", "kubernetes")


def on_default_provider(resources: list[dict]) -> list[str]:
    """The custom resources of an AWS or GCP type that name no provider (the engine would give them the default)."""
    return [f"{r['type']} {r['name']}" for r in resources
            if r["options"]["custom"] and r["type"].split(":")[0] in CLOUDS and not r["options"]["provider"]]


def lookups_on_default_provider(invokes: list[dict]) -> list[str]:
    """The AWS or GCP lookups that name no provider."""
    return [i["token"] for i in invokes if i["token"].split(":")[0] in CLOUDS and not i.get("provider")]


@pytest.mark.parametrize("key", CASES)
def test_no_resource_or_lookup_uses_a_default_provider(key):
    r = synthesized(key)
    checked = [x for x in r.resources if x["options"]["custom"] and x["type"].split(":")[0] in CLOUDS]
    assert len(checked) >= 10, len(checked)
    assert on_default_provider(r.resources) == []
    # A GKE kubernetes stack looks nothing up.
    assert (r.invokes or r.of_type("pulumi:providers:kubernetes")) and lookups_on_default_provider(r.invokes) == []


def test_the_check_sees_a_resource_and_a_lookup_with_no_provider():
    """The AWS home with a GCP placement once made its machines' federated role on the default provider."""
    r = synthesized("aws-home-gcp-placement")
    resources = copy.deepcopy(r.resources)
    (role,) = [x for x in resources if x["name"] == "trainstack-federation-p1-role"]
    assert role["options"]["provider"]
    role["options"]["provider"] = None
    assert on_default_provider(resources) == ["aws:iam/role:Role trainstack-federation-p1-role"]
    invokes = copy.deepcopy(r.invokes)
    invokes[0]["provider"] = None
    assert lookups_on_default_provider(invokes) == [invokes[0]["token"]]
