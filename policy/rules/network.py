"""The network rules: no inbound rule from the whole internet, SSH only from access.allowedCidrs.

Standard library only: the policy pack runs it in its own virtualenv.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policy.rules.base import (
    UNKNOWN,
    Context,
    Resource,
    Violation,
    _as_list,
    _get,
    _has_unknown,
    _known,
    _of,
    _true,
)


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
        cs = tuple(str(c) for c in cidrs if c and _known(c))
        unknown = _has_unknown([proto, lo, hi, cidrs]) or (not cs and _has_unknown(list(own_refs)))
        out.append(Ingress(r["name"], where, str(proto).lower(), lo if isinstance(lo, int) else None,
                           hi if isinstance(hi, int) else None, cs, own and not cs, unknown))

    for sg in _of(resources, "aws:ec2/securityGroup:SecurityGroup"):
        rules_ = _get(sg, "ingress", [])
        if rules_ == UNKNOWN:
            continue
        for i, rule in enumerate(_as_list(rules_)):
            if not isinstance(rule, Mapping):
                continue
            cidrs = _as_list(rule.get("cidrBlocks")) + _as_list(rule.get("ipv6CidrBlocks"))
            add(sg, f"ingress[{i}]", rule.get("protocol"), rule.get("fromPort"), rule.get("toPort"), cidrs,
                (rule.get("self"), rule.get("securityGroups")), _true(rule.get("self")))
    for r in _of(resources, "aws:ec2/securityGroupRule:SecurityGroupRule"):
        if _get(r, "type") != "ingress":
            continue
        cidrs = _as_list(_get(r, "cidrBlocks")) + _as_list(_get(r, "ipv6CidrBlocks"))
        src, own_sg = _get(r, "sourceSecurityGroupId"), _get(r, "securityGroupId")
        add(r, "rule", _get(r, "protocol"), _get(r, "fromPort"), _get(r, "toPort"), cidrs, (_get(r, "self"), src, own_sg),
            _true(_get(r, "self")) or (src is not None and src == own_sg))
    for r in _of(resources, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"):
        cidrs = [c for c in (_get(r, "cidrIpv4"), _get(r, "cidrIpv6")) if c]
        ref, own_sg = _get(r, "referencedSecurityGroupId"), _get(r, "securityGroupId")
        add(r, "rule", _get(r, "ipProtocol"), _get(r, "fromPort"), _get(r, "toPort"), cidrs, (ref, own_sg),
            ref is not None and ref == own_sg)
    for fw in _of(resources, "gcp:compute/firewall:Firewall"):
        if str(_get(fw, "direction", "INGRESS")).upper() != "INGRESS":
            continue
        cidrs = _as_list(_get(fw, "sourceRanges"))
        src_raw, tgt_raw = _get(fw, "sourceTags"), _get(fw, "targetTags")
        src_tags, tgt_tags = set(map(str, _as_list(src_raw))), set(map(str, _as_list(tgt_raw)))
        allows = _get(fw, "allows", [])
        if allows == UNKNOWN:
            allows = [{"protocol": UNKNOWN}]
        for j, allow in enumerate(_as_list(allows)):
            allow = allow if isinstance(allow, Mapping) else {"protocol": UNKNOWN}
            ports = _as_list(allow.get("ports")) or [None]
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
