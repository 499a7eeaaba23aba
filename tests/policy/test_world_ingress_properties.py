"""Property tests of "the whole internet": every spelling the providers accept is caught.

The AWS provider (terraform-bridged) takes a CIDR when Go's `net.ParseCIDR` reads it and its
address and network print as the canonical ones: `0.0.0.0/00`, `0::/0`, `0:0:0:0:0:0:0:0/0`,
`::0.0.0.0/0` all pass that check, and each opens port 22 to everyone. A rule comparing
strings with `0.0.0.0/0` and `::/0` would let them by; the rule, and the config's own check of
access.allowedCidrs, must read the network, not the text. Only such accepted spellings are
generated (no leading zeros in an IPv4 octet, which Go and Python both refuse).
"""

from __future__ import annotations

import base64
import ipaddress
import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from components.settings import AccessSettings
from policy import rules
from policy.rules import Context
from tests.policy import resources as R


def _ed25519_public_key() -> str:
    """A well-formed OpenSSH public key: access.allowedCidrs needs one beside it."""
    blob = struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + bytes(range(32))
    return "ssh-ed25519 " + base64.b64encode(blob).decode() + " me@laptop"


_KEY = _ed25519_public_key()
MASK_ZERO = st.integers(1, 3).map(lambda n: "/" + "0" * n)
ZERO_GROUP = st.integers(1, 4).map(lambda n: "0" * n)


@st.composite
def v6_zero(draw) -> str:
    """`::` written any way IPv6 allows: groups of 1-4 zeros, one run of them elided as `::`,
    the last 32 bits optionally as dotted IPv4."""
    dotted = draw(st.booleans())
    groups = draw(st.lists(ZERO_GROUP, min_size=6 if dotted else 8, max_size=6 if dotted else 8))
    tail = ["0.0.0.0"] if dotted else []
    if draw(st.booleans()):
        start = draw(st.integers(0, len(groups) - 1))
        end = draw(st.integers(start + 1, len(groups)))
        left, right = groups[:start], groups[end:] + tail
        text = ":".join(left) + "::" + ":".join(right)
    else:
        text = ":".join(groups + tail)
    return text + draw(MASK_ZERO)


WORLD = st.one_of(MASK_ZERO.map(lambda m: "0.0.0.0" + m), v6_zero())


def _stacks_with(cidr: str) -> list[tuple[list[dict], set[str]]]:
    """The clean AWS and GCP stacks, each with `cidr` allowed to port 22 by every resource shape
    that declares ingress, and the names that must be flagged."""
    v6 = ipaddress.ip_network(cidr, strict=False).version == 6
    aws = R.aws_stack()
    aws += [
        {"type": "aws:ec2/securityGroup:SecurityGroup", "name": "dev-extra-sg", "parent": "dev-group", "options": {},
         "inputs": {"ingress": [{"protocol": "tcp", "fromPort": 22, "toPort": 22,
                                 ("ipv6CidrBlocks" if v6 else "cidrBlocks"): [cidr]}], "tags": dict(R.TAGS)}},
        {"type": "aws:ec2/securityGroupRule:SecurityGroupRule", "name": "dev-open-rule", "parent": "dev-group",
         "options": {}, "inputs": {"type": "ingress", "protocol": "tcp", "fromPort": 22, "toPort": 22,
                                   ("ipv6CidrBlocks" if v6 else "cidrBlocks"): [cidr]}},
        {"type": "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "name": "dev-open", "parent": "dev-group",
         "options": {}, "inputs": {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22,
                                   ("cidrIpv6" if v6 else "cidrIpv4"): cidr, "tags": dict(R.TAGS)}},
    ]
    gcp = R.gcp_stack()
    gcp.append({"type": "gcp:compute/firewall:Firewall", "name": "dev-ssh", "parent": "dev-group", "options": {},
                "inputs": {"sourceRanges": [cidr], "allows": [{"protocol": "tcp", "ports": ["22"]}]}})
    return [(aws, {"dev-extra-sg", "dev-open-rule", "dev-open"}), (gcp, {"dev-ssh"})]


def _world_findings(res: list[dict]) -> set[str]:
    return {v.resource for v in rules.check(res, Context(stack=R.STACK, run_id=R.RUN)) if v.rule == "no-world-ingress"}


def test_the_clean_stacks_have_no_world_ingress():
    # The AWS stack's egress to 0.0.0.0/0 is outbound: not this rule's business.
    for res in (R.aws_stack(), R.gcp_stack()):
        assert _world_findings(res) == set()


@given(WORLD)
@example("0.0.0.0/0")
@example("::/0")
@example("0::/0")
@example("0.0.0.0/00")
@example("0:0:0:0:0:0:0:0/0")
@example("::0.0.0.0/0")
def test_every_spelling_of_the_whole_internet_is_flagged(cidr):
    net = ipaddress.ip_network(cidr, strict=True)
    assert net.prefixlen == 0  # the generator makes only the whole internet
    checked = 0
    for res, names in _stacks_with(cidr):
        assert _world_findings(res) == names, cidr
        checked += 1
    assert checked == 2


@given(WORLD)
@example("0::/0")
@example("0.0.0.0/00")
def test_the_config_refuses_every_spelling_without_allow_world(cidr):
    with pytest.raises(ValidationError) as info:
        AccessSettings.model_validate({"sshPublicKey": _KEY, "allowedCidrs": [cidr]})
    assert "whole internet" in str(info.value), str(info.value)
    assert AccessSettings.model_validate({"sshPublicKey": _KEY, "allowedCidrs": [cidr], "allowWorld": True})


@given(st.one_of(st.ip_addresses(v=4).flatmap(lambda a: st.integers(1, 32).map(lambda n: ipaddress.ip_network(
    f"{a}/{n}", strict=False))), st.ip_addresses(v=6).flatmap(lambda a: st.integers(1, 128).map(
        lambda n: ipaddress.ip_network(f"{a}/{n}", strict=False)))))
def test_a_narrower_network_is_not_the_whole_internet(net):
    """The other side: a rule that flagged every CIDR would pass the test above."""
    for res, _names in _stacks_with(str(net)):
        assert _world_findings(res) == set(), net


@pytest.mark.parametrize(("cidr", "world"), [
    ("0.0.0.0/0", True), ("0.0.0.1/0", True), ("::1/0", True), ("10.0.0.0/8", False), ("not-a-cidr", False), ("", False),
])
def test_the_whole_internet_however_its_host_bits_are_spelled(cidr, world):
    from policy.rules.network import _is_world

    assert _is_world(cidr) is world


@pytest.mark.parametrize(("cidr", "allowed", "inside"), [
    ("10.0.0.1/24", ["10.0.0.0/16"], True),  # host bits set on the rule's side
    ("10.0.0.0/24", ["10.0.0.1/16"], True),  # and on the allowed side
    ("10.1.0.0/16", ["garbage", "10.0.0.0/8"], True),  # an unreadable entry is passed over, not the end
    ("10.0.0.0/8", ["192.168.0.0/16"], False),
    ("10.0.0.0/8", ["10.0.0.0/16"], False),  # wider than what is allowed
    ("2001:db8::/48", ["10.0.0.0/8"], False),
    ("garbage", ["0.0.0.0/0"], False),
])
def test_a_cidr_is_within_the_allowed_ones_only_when_it_is_a_subnet_of_one(cidr, allowed, inside):
    from policy.rules.network import _within

    assert _within(cidr, allowed) is inside
