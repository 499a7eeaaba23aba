"""The network rules read every provider's ingress shape into one form, field by field.

Both network rules judge what `_ingresses` makes of the resources: a protocol read from the
wrong key, a port range split wrongly, a rule taken for the group's own traffic, or a part
unknown during preview taken as known, and the rules pass or flag the wrong thing. Each case
here is one resource and the exact records it must give; then each rule's whole findings on
records that differ in one field.
"""

from __future__ import annotations

import pytest

from policy.rules import UNKNOWN, Context, Violation
from policy.rules.network import Ingress, _ingresses, no_world_ingress, ssh_only_from_allowed

SG = "aws:ec2/securityGroup:SecurityGroup"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
FIREWALL = "gcp:compute/firewall:Firewall"


def _r(type_: str, inputs, name: str = "r") -> dict:
    return {"type": type_, "name": name, "parent": None, "inputs": inputs, "options": {}}


def _ing(where: str, protocol: str = "tcp", lo: int | None = 22, hi: int | None = 22, cidrs: tuple[str, ...] = (),
         own: bool = False, unknown: bool = False, resource: str = "r") -> Ingress:
    return Ingress(resource, where, protocol, lo, hi, cidrs, own, unknown)


def _sg(*rules) -> dict:
    return _r(SG, {"ingress": list(rules)})


SSH = {"protocol": "tcp", "fromPort": 22, "toPort": 22}
NET = "203.0.113.0/24"
NET6 = "2001:db8::/32"

CASES = [
    # --- aws:ec2/securityGroup's inline ingress blocks
    ("sg: v4 and v6 blocks, in that order", _sg({**SSH, "cidrBlocks": [NET], "ipv6CidrBlocks": [NET6]}),
     [_ing("ingress[0]", cidrs=(NET, NET6))]),
    ("sg: protocol lowered", _sg({**SSH, "protocol": "TCP", "cidrBlocks": [NET]}),
     [_ing("ingress[0]", cidrs=(NET,))]),
    ("sg: non-integer ports are no ports", _sg({"protocol": "tcp", "fromPort": "22", "toPort": 22.0,
                                               "cidrBlocks": [NET]}),
     [_ing("ingress[0]", lo=None, hi=None, cidrs=(NET,))]),
    ("sg: each block by its own index; a non-mapping entry skipped but counted",
     _sg("junk", {**SSH, "cidrBlocks": [NET]}, {**SSH, "ipv6CidrBlocks": [NET6]}),
     [_ing("ingress[1]", cidrs=(NET,)), _ing("ingress[2]", cidrs=(NET6,))]),
    ("sg: empty and unknown CIDRs dropped, the unknown one marks the record",
     _sg({**SSH, "cidrBlocks": ["", NET, UNKNOWN]}),
     [_ing("ingress[0]", cidrs=(NET,), unknown=True)]),
    ("sg: self: true", _sg({**SSH, "self": True}), [_ing("ingress[0]", own=True)]),
    ("sg: self: \"true\" (typed as a string)", _sg({**SSH, "self": "true"}), [_ing("ingress[0]", own=True)]),
    ("sg: self: false and no source", _sg({**SSH, "self": False}), [_ing("ingress[0]")]),
    ("sg: self with a CIDR is a CIDR rule", _sg({**SSH, "self": True, "cidrBlocks": [NET]}),
     [_ing("ingress[0]", cidrs=(NET,))]),
    ("sg: another group as the source", _sg({**SSH, "securityGroups": ["sg-0abc"]}), [_ing("ingress[0]")]),
    ("sg: an unknown source group without CIDRs", _sg({**SSH, "securityGroups": [UNKNOWN]}),
     [_ing("ingress[0]", unknown=True)]),
    ("sg: an unknown self without CIDRs", _sg({**SSH, "self": UNKNOWN}), [_ing("ingress[0]", unknown=True)]),
    ("sg: an unknown source group beside a known CIDR is judged on the CIDR",
     _sg({**SSH, "securityGroups": [UNKNOWN], "cidrBlocks": [NET]}), [_ing("ingress[0]", cidrs=(NET,))]),
    ("sg: unknown protocol", _sg({**SSH, "protocol": UNKNOWN, "cidrBlocks": [NET]}),
     [_ing("ingress[0]", protocol=UNKNOWN.lower(), cidrs=(NET,), unknown=True)]),
    ("sg: unknown from port", _sg({**SSH, "fromPort": UNKNOWN, "cidrBlocks": [NET]}),
     [_ing("ingress[0]", lo=None, cidrs=(NET,), unknown=True)]),
    ("sg: unknown to port", _sg({**SSH, "toPort": UNKNOWN, "cidrBlocks": [NET]}),
     [_ing("ingress[0]", hi=None, cidrs=(NET,), unknown=True)]),
    ("sg: the whole ingress list unknown gives nothing", _r(SG, {"ingress": UNKNOWN}), []),
    ("sg: no ingress", _r(SG, {"egress": [{**SSH, "cidrBlocks": [NET]}]}), []),
    # --- aws:ec2/securityGroupRule
    ("rule: ingress, both families", _r(SG_RULE, {"type": "ingress", **SSH, "cidrBlocks": [NET],
                                                  "ipv6CidrBlocks": [NET6]}),
     [_ing("rule", cidrs=(NET, NET6))]),
    ("rule: egress is not ingress", _r(SG_RULE, {"type": "egress", **SSH, "cidrBlocks": [NET]}), []),
    ("rule: self", _r(SG_RULE, {"type": "ingress", **SSH, "self": True, "securityGroupId": "sg-1"}),
     [_ing("rule", own=True)]),
    ("rule: an unknown self without CIDRs", _r(SG_RULE, {"type": "ingress", **SSH, "self": UNKNOWN}),
     [_ing("rule", unknown=True)]),
    ("rule: self as a string", _r(SG_RULE, {"type": "ingress", **SSH, "self": "TRUE"}), [_ing("rule", own=True)]),
    ("rule: the source is the rule's own group",
     _r(SG_RULE, {"type": "ingress", **SSH, "sourceSecurityGroupId": "sg-1", "securityGroupId": "sg-1"}),
     [_ing("rule", own=True)]),
    ("rule: the source is another group",
     _r(SG_RULE, {"type": "ingress", **SSH, "sourceSecurityGroupId": "sg-2", "securityGroupId": "sg-1"}),
     [_ing("rule")]),
    ("rule: no source and no group is no own traffic", _r(SG_RULE, {"type": "ingress", **SSH}), [_ing("rule")]),
    ("rule: an unknown own group without CIDRs",
     _r(SG_RULE, {"type": "ingress", **SSH, "sourceSecurityGroupId": "sg-2", "securityGroupId": UNKNOWN}),
     [_ing("rule", unknown=True)]),
    ("rule: protocol lowered, ports as given",
     _r(SG_RULE, {"type": "ingress", "protocol": "UDP", "fromPort": 60000, "toPort": 61000, "cidrBlocks": [NET]}),
     [_ing("rule", protocol="udp", lo=60000, hi=61000, cidrs=(NET,))]),
    # --- aws:vpc/securityGroupIngressRule
    ("ingress rule: v4", _r(INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": NET}),
     [_ing("rule", cidrs=(NET,))]),
    ("ingress rule: v6, protocol lowered, the generic protocol key ignored",
     _r(INGRESS_RULE, {"ipProtocol": "TCP", "protocol": "udp", "fromPort": 22, "toPort": 22, "cidrIpv6": NET6}),
     [_ing("rule", cidrs=(NET6,))]),
    ("ingress rule: both families, v4 first",
     _r(INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": NET, "cidrIpv6": NET6}),
     [_ing("rule", cidrs=(NET, NET6))]),
    ("ingress rule: the referenced group is its own",
     _r(INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "referencedSecurityGroupId": "sg-1",
                       "securityGroupId": "sg-1"}),
     [_ing("rule", own=True)]),
    ("ingress rule: another referenced group",
     _r(INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "referencedSecurityGroupId": "sg-2",
                       "securityGroupId": "sg-1"}),
     [_ing("rule")]),
    ("ingress rule: no reference and no group",
     _r(INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22}), [_ing("rule")]),
    ("ingress rule: an unknown reference",
     _r(INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "referencedSecurityGroupId": UNKNOWN,
                       "securityGroupId": "sg-1"}),
     [_ing("rule", unknown=True)]),
    # --- gcp:compute/firewall
    ("firewall: one port", _r(FIREWALL, {"sourceRanges": [NET], "allows": [{"protocol": "tcp", "ports": ["22"]}]}),
     [_ing("allows[0]", cidrs=(NET,))]),
    ("firewall: a port range, and each port of each allow",
     _r(FIREWALL, {"sourceRanges": [NET], "allows": [{"protocol": "TCP", "ports": ["8000-8080", "22"]},
                                                     {"protocol": "udp", "ports": ["53"]}]}),
     [_ing("allows[0]", lo=8000, hi=8080, cidrs=(NET,)), _ing("allows[0]", cidrs=(NET,)),
      _ing("allows[1]", protocol="udp", lo=53, hi=53, cidrs=(NET,))]),
    ("firewall: no ports is every port", _r(FIREWALL, {"sourceRanges": [NET], "allows": [{"protocol": "all"}]}),
     [_ing("allows[0]", protocol="all", lo=None, hi=None, cidrs=(NET,))]),
    ("firewall: a port that is no number or range",
     _r(FIREWALL, {"sourceRanges": [NET], "allows": [{"protocol": "tcp", "ports": ["ssh", "22-", "x22"]}]}),
     [_ing("allows[0]", lo=None, hi=None, cidrs=(NET,))] * 3),
    ("firewall: an unknown port",
     _r(FIREWALL, {"sourceRanges": [NET], "allows": [{"protocol": "tcp", "ports": [UNKNOWN]}]}),
     [_ing("allows[0]", lo=None, hi=None, cidrs=(NET,), unknown=True)]),
    ("firewall: the allows unknown", _r(FIREWALL, {"sourceRanges": [NET], "allows": UNKNOWN}),
     [_ing("allows[0]", protocol=UNKNOWN.lower(), lo=None, hi=None, cidrs=(NET,), unknown=True)]),
    ("firewall: an allow that is no mapping",
     _r(FIREWALL, {"sourceRanges": [NET], "allows": ["tcp:22", {"protocol": "tcp", "ports": ["22"]}]}),
     [_ing("allows[0]", protocol=UNKNOWN.lower(), lo=None, hi=None, cidrs=(NET,), unknown=True),
      _ing("allows[1]", cidrs=(NET,))]),
    ("firewall: direction lower-case ingress",
     _r(FIREWALL, {"direction": "ingress", "sourceRanges": [NET], "allows": [{"protocol": "tcp", "ports": ["22"]}]}),
     [_ing("allows[0]", cidrs=(NET,))]),
    ("firewall: egress is not ingress",
     _r(FIREWALL, {"direction": "EGRESS", "sourceRanges": [NET], "allows": [{"protocol": "tcp", "ports": ["22"]}]}),
     []),
    ("firewall: the group's own tags",
     _r(FIREWALL, {"sourceTags": ["gpu"], "targetTags": ["gpu"], "allows": [{"protocol": "tcp"}]}),
     [_ing("allows[0]", lo=None, hi=None, own=True)]),
    ("firewall: other source tags",
     _r(FIREWALL, {"sourceTags": ["web"], "targetTags": ["gpu"], "allows": [{"protocol": "tcp"}]}),
     [_ing("allows[0]", lo=None, hi=None)]),
    ("firewall: neither tags nor ranges is no own traffic", _r(FIREWALL, {"allows": [{"protocol": "tcp"}]}),
     [_ing("allows[0]", lo=None, hi=None)]),
    ("firewall: unknown source tags", _r(FIREWALL, {"sourceTags": UNKNOWN, "targetTags": ["gpu"],
                                                    "allows": [{"protocol": "tcp"}]}),
     [_ing("allows[0]", lo=None, hi=None, unknown=True)]),
    ("firewall: unknown target tags", _r(FIREWALL, {"sourceTags": ["gpu"], "targetTags": [UNKNOWN],
                                                    "allows": [{"protocol": "tcp"}]}),
     [_ing("allows[0]", lo=None, hi=None, unknown=True)]),
    ("other types are not ingress", _r("aws:ec2/instance:Instance", {"ingress": [{**SSH, "cidrBlocks": [NET]}]}), []),
]


@pytest.mark.parametrize(("resource", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_shape_is_read_into_one_record_per_permission(resource, want):
    assert _ingresses([resource]) == want


def test_the_records_keep_the_order_of_the_resources_by_shape():
    res = [_r(FIREWALL, {"sourceRanges": [NET], "allows": [{"protocol": "tcp", "ports": ["22"]}]}, name="fw"),
           _r(INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": NET}, name="ir"),
           _r(SG_RULE, {"type": "ingress", **SSH, "cidrBlocks": [NET]}, name="sr"),
           _r(SG, {"ingress": [{**SSH, "cidrBlocks": [NET]}]}, name="sg")]
    assert [i.resource for i in _ingresses(res)] == ["sg", "sr", "ir", "fw"]


def test_a_resource_passed_over_does_not_end_the_reading_of_the_others():
    """An unknown ingress list, an egress rule or an egress firewall is skipped, not the end of its shape."""
    res = [_r(SG, {"ingress": UNKNOWN}, name="sg-unknown"), _r(SG, {"ingress": [{**SSH, "cidrBlocks": [NET]}]}, name="sg"),
           _r(SG_RULE, {"type": "egress", **SSH, "cidrBlocks": [NET]}, name="out-rule"),
           _r(SG_RULE, {"type": "ingress", **SSH, "cidrBlocks": [NET]}, name="in-rule"),
           _r(FIREWALL, {"direction": "EGRESS", "sourceRanges": [NET], "allows": [{"protocol": "tcp"}]}, name="out-fw"),
           _r(FIREWALL, {"sourceRanges": [NET], "allows": [{"protocol": "tcp", "ports": ["22"]}]}, name="in-fw")]
    assert _ingresses(res) == [_ing("ingress[0]", cidrs=(NET,), resource="sg"), _ing("rule", cidrs=(NET,), resource="in-rule"),
                               _ing("allows[0]", cidrs=(NET,), resource="in-fw")]


def _ctx(*cidrs: str) -> Context:
    return Context(allowed_ssh_cidrs=cidrs)


def test_the_world_is_flagged_once_per_cidr_with_where_it_is():
    res = [_sg({**SSH, "cidrBlocks": [NET, "0.0.0.0/0"], "ipv6CidrBlocks": ["::/0"]}, {**SSH, "cidrBlocks": ["0.0.0.0/0"]})]
    assert no_world_ingress(res, _ctx()) == [
        Violation("no-world-ingress", "r", "ingress[0] allows 0.0.0.0/0 (the whole internet); name your own CIDR"),
        Violation("no-world-ingress", "r", "ingress[0] allows ::/0 (the whole internet); name your own CIDR"),
        Violation("no-world-ingress", "r", "ingress[1] allows 0.0.0.0/0 (the whole internet); name your own CIDR"),
    ]


ANOTHER_SOURCE = "allows another source than this group or a CIDR; only port 22 from access.allowedCidrs is allowed"


@pytest.mark.parametrize(("ingress", "ctx", "want"), [
    ({**SSH, "cidrBlocks": [NET]}, _ctx(NET), []),
    ({**SSH, "protocol": "6", "cidrBlocks": [NET]}, _ctx(NET), []),  # TCP by number
    ({**SSH, "protocol": "TCP", "cidrBlocks": ["203.0.113.9/32"]}, _ctx("10.0.0.0/8", NET), []),
    ({**SSH, "self": True}, _ctx(), []),
    ({**SSH, "securityGroups": [UNKNOWN]}, _ctx(), []),  # judged once known
    ({**SSH, "securityGroups": ["sg-0abc"]}, _ctx(), [f"ingress[0] {ANOTHER_SOURCE}"]),
    ({**SSH, "protocol": "udp", "cidrBlocks": [NET]}, _ctx(NET), ["ingress[0] opens udp 22-22; only TCP 22 may be open"]),
    ({**SSH, "protocol": "17", "cidrBlocks": [NET]}, _ctx(NET), ["ingress[0] opens 17 22-22; only TCP 22 may be open"]),
    ({**SSH, "toPort": 23, "cidrBlocks": [NET]}, _ctx(NET), ["ingress[0] opens tcp 22-23; only TCP 22 may be open"]),
    ({**SSH, "fromPort": 21, "cidrBlocks": [NET]}, _ctx(NET), ["ingress[0] opens tcp 21-22; only TCP 22 may be open"]),
    ({**SSH, "fromPort": None, "toPort": None, "cidrBlocks": [NET]}, _ctx(NET),
     ["ingress[0] opens tcp None-None; only TCP 22 may be open"]),
    ({**SSH, "cidrBlocks": ["198.51.100.7/32"]}, _ctx(),
     ["ingress[0] allows 198.51.100.7/32, not in access.allowedCidrs (none)"]),
    ({**SSH, "cidrBlocks": ["198.51.100.7/32", NET]}, _ctx(NET, "10.0.0.0/8"),
     [f"ingress[0] allows 198.51.100.7/32, not in access.allowedCidrs ({NET}, 10.0.0.0/8)"]),
    # Both findings of one record: the port and each CIDR outside; the whole internet is the other rule's.
    ({"protocol": "tcp", "fromPort": 0, "toPort": 65535, "cidrBlocks": ["0.0.0.0/0", "198.51.100.0/24", NET]},
     _ctx(NET),
     ["ingress[0] opens tcp 0-65535; only TCP 22 may be open",
      f"ingress[0] allows 198.51.100.0/24, not in access.allowedCidrs ({NET})"]),
], ids=["allowed", "tcp-as-6", "inside-second-allowed", "own-group", "unknown-source", "other-group", "udp", "udp-as-17",
        "to-port", "from-port", "no-ports", "none-allowed", "listed-allowed", "ports-and-cidr"])
def test_ssh_only_from_allowed_finds_exactly_these(ingress, ctx, want):
    assert [v.message for v in ssh_only_from_allowed([_sg(ingress)], ctx)] == want


def test_ssh_only_from_allowed_goes_on_past_each_finding():
    """A finding on one record, of either kind, does not end the look at the others."""
    res = [_sg({**SSH, "securityGroups": ["sg-0abc"]}, {**SSH, "self": True}, {**SSH, "securityGroups": [UNKNOWN]},
               {**SSH, "securityGroups": ["sg-0def"]}, {**SSH, "cidrBlocks": ["198.51.100.7/32"]})]
    found = ssh_only_from_allowed(res, _ctx(NET))
    assert [(v.rule, v.resource, v.message) for v in found] == [
        ("ssh-only-from-allowed", "r", f"ingress[0] {ANOTHER_SOURCE}"),
        ("ssh-only-from-allowed", "r", f"ingress[3] {ANOTHER_SOURCE}"),
        ("ssh-only-from-allowed", "r", f"ingress[4] allows 198.51.100.7/32, not in access.allowedCidrs ({NET})"),
    ]
