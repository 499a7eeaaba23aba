"""The network rules: no inbound rule from the whole internet, SSH only from access.allowedCidrs."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policy.rules import base
from policy.rules.base import UNKNOWN, Context, Resource, Violation


@dataclass(frozen=True)
class Ingress:
    """One inbound permission, whatever resource shape declared it."""

    resource: str
    where: str
    protocol: str
    from_port: int | None
    to_port: int | None
    cidrs: tuple[str, ...]
    from_own_group: bool
    unknown: bool = False
    """Some part is unknown during preview: only its known CIDRs are judged."""




def _ingresses(resources: list[Resource]) -> list[Ingress]:
    out: list[Ingress] = []

    def add(r: Resource, where: str, proto: Any, lo: Any, hi: Any, cidrs: list[Any], own_refs: tuple[Any, ...],
            own: bool) -> None:
        cs = tuple(str(c) for c in cidrs if c and base.known(c))
        unknown = base.has_unknown([proto, lo, hi, cidrs]) or (not cs and base.has_unknown(list(own_refs)))
        out.append(Ingress(r["name"], where, str(proto).lower(), lo if isinstance(lo, int) else None,
                           hi if isinstance(hi, int) else None, cs, own and not cs, unknown))

    for sg in base.of_type(resources, "aws:ec2/securityGroup:SecurityGroup"):
        rules_ = base.get(sg, "ingress", [])
        if rules_ == UNKNOWN:
            continue
        for i, rule in enumerate(base.as_list(rules_)):
            if not isinstance(rule, Mapping):
                continue
            cidrs = base.as_list(rule.get("cidrBlocks")) + base.as_list(rule.get("ipv6CidrBlocks"))
            add(sg, f"ingress[{i}]", rule.get("protocol"), rule.get("fromPort"), rule.get("toPort"), cidrs,
                (rule.get("self"), rule.get("securityGroups")), base.is_true(rule.get("self")))
    for r in base.of_type(resources, "aws:ec2/securityGroupRule:SecurityGroupRule"):
        if base.get(r, "type") != "ingress":
            continue
        cidrs = base.as_list(base.get(r, "cidrBlocks")) + base.as_list(base.get(r, "ipv6CidrBlocks"))
        src, own_sg = base.get(r, "sourceSecurityGroupId"), base.get(r, "securityGroupId")
        add(r, "rule", base.get(r, "protocol"), base.get(r, "fromPort"), base.get(r, "toPort"), cidrs, (base.get(r, "self"), src, own_sg),
            base.is_true(base.get(r, "self")) or (src is not None and src == own_sg))
    for r in base.of_type(resources, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"):
        cidrs = [c for c in (base.get(r, "cidrIpv4"), base.get(r, "cidrIpv6")) if c]
        ref, own_sg = base.get(r, "referencedSecurityGroupId"), base.get(r, "securityGroupId")
        add(r, "rule", base.get(r, "ipProtocol"), base.get(r, "fromPort"), base.get(r, "toPort"), cidrs, (ref, own_sg),
            ref is not None and ref == own_sg)
    for fw in base.of_type(resources, "gcp:compute/firewall:Firewall"):
        if str(base.get(fw, "direction", "INGRESS")).upper() != "INGRESS":
            continue
        cidrs = base.as_list(base.get(fw, "sourceRanges"))
        src_raw, tgt_raw = base.get(fw, "sourceTags"), base.get(fw, "targetTags")
        src_tags, tgt_tags = set(map(str, base.as_list(src_raw))), set(map(str, base.as_list(tgt_raw)))
        allows = base.get(fw, "allows", [])
        if allows == UNKNOWN:
            allows = [{"protocol": UNKNOWN}]
        for j, allow in enumerate(base.as_list(allows)):
            allow = allow if isinstance(allow, Mapping) else {"protocol": UNKNOWN}
            ports = base.as_list(allow.get("ports")) or [None]
            for p in ports:
                lo = hi = UNKNOWN if p == UNKNOWN else None
                if isinstance(p, str) and re.fullmatch(r"\d+(-\d+)?", p):
                    lo, _, h = p.partition("-")
                    lo, hi = int(lo), int(h or lo)
                add(fw, f"allows[{j}]", allow.get("protocol"), lo, hi, cidrs, (src_raw, tgt_raw),
                    bool(src_tags) and src_tags == tgt_tags)
    return out


def _is_world(cidr: str) -> bool:
    try:
        return ipaddress.ip_network(cidr, strict=False).prefixlen == 0
    except ValueError:
        return False


def no_world_ingress(resources: list[Resource], ctx: Context) -> list[Violation]:
    """No inbound rule from 0.0.0.0/0 or ::/0. Fires even when the config says allowWorld: true:
    the config accepts the explicit choice, this rule keeps it visible (README: how to waive it)."""
    return [Violation("no-world-ingress", ing.resource, f"{ing.where} allows {c} (the whole internet); name your own CIDR")
            for ing in _ingresses(resources) for c in ing.cidrs if _is_world(c)]


def _within(cidr: str, allowed: Iterable[str]) -> bool:
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False
    for a in allowed:
        try:
            an = ipaddress.ip_network(a, strict=False)
        except ValueError:
            continue
        if net.version == an.version and net.subnet_of(an):
            return True
    return False


def ssh_only_from_allowed(resources: list[Resource], ctx: Context) -> list[Violation]:
    """The only inbound traffic from outside the group is TCP port 22 from access.allowedCidrs
    (none by default); machines of the group may reach each other (multi-node training)."""
    out: list[Violation] = []
    for ing in _ingresses(resources):
        if ing.from_own_group or ing.unknown:
            continue
        if not ing.cidrs:
            out.append(Violation("ssh-only-from-allowed", ing.resource, f"{ing.where} allows another source than "
                                 "this group or a CIDR; only port 22 from access.allowedCidrs is allowed"))
            continue
        if ing.protocol not in ("tcp", "6") or ing.from_port != 22 or ing.to_port != 22:
            out.append(Violation("ssh-only-from-allowed", ing.resource, f"{ing.where} opens {ing.protocol} "
                                 f"{ing.from_port}-{ing.to_port}; only TCP 22 may be open"))
        for c in ing.cidrs:
            # The whole internet is no-world-ingress's finding; one cause, one violation.
            if not _is_world(c) and not _within(c, ctx.allowed_ssh_cidrs):
                allowed = ", ".join(ctx.allowed_ssh_cidrs) or "none"
                out.append(Violation("ssh-only-from-allowed", ing.resource, f"{ing.where} allows {c}, not in "
                                     f"access.allowedCidrs ({allowed})"))
    return out
