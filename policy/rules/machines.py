"""The machine rules: IMDSv2, GCE metadata hardening, encrypted root volumes.

Standard library only: the policy pack runs it in its own virtualenv.
"""

from __future__ import annotations

from collections.abc import Mapping

from policy.rules.base import (
    UNKNOWN,
    Context,
    Resource,
    Violation,
    _as_list,
    _false,
    _get,
    _known,
    _of,
    _true,
)

LAUNCH_TEMPLATES = ("aws:ec2/launchTemplate:LaunchTemplate",)
GCE_TEMPLATES = ("gcp:compute/instanceTemplate:InstanceTemplate", "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate")


def imdsv2_required(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Launch templates require IMDSv2 session tokens with a hop limit of 1, so a request
    forwarded from outside the host (SSRF) cannot read the role's credentials."""
    out: list[Violation] = []
    for lt in _of(resources, *LAUNCH_TEMPLATES, "aws:ec2/instance:Instance"):
        tokens = _get(lt, "metadataOptions.httpTokens")
        hops = _get(lt, "metadataOptions.httpPutResponseHopLimit")
        if _known(tokens) and tokens != "required":
            out.append(Violation("imdsv2-required", lt["name"], f"metadataOptions.httpTokens is {tokens!r}; set 'required'"))
        if _known(hops) and hops not in (1, "1"):
            out.append(Violation("imdsv2-required", lt["name"], f"metadataOptions.httpPutResponseHopLimit is {hops!r}; set 1"))
    return out


def gce_metadata_hardened(resources: list[Resource], ctx: Context) -> list[Violation]:
    """GCE templates keep the legacy metadata endpoints off and Shielded VM's vTPM and
    integrity monitoring on (secure boot is left to the image: NVIDIA drivers must be signed)."""
    out: list[Violation] = []
    for t in _of(resources, *GCE_TEMPLATES):
        if _false(_get(t, "metadata.disable-legacy-endpoints")):
            out.append(Violation("gce-metadata-hardened", t["name"], "metadata disable-legacy-endpoints is false; remove it"))
        for f in ("enableVtpm", "enableIntegrityMonitoring"):
            if _false(_get(t, f"shieldedInstanceConfig.{f}")):
                out.append(Violation("gce-metadata-hardened", t["name"], f"shieldedInstanceConfig.{f} is false; set true"))
    return out


def root_volume_encrypted(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Every EBS volume a launch template defines is encrypted, and it defines the root one
    (otherwise the AMI's default applies). GCE disks are always encrypted at rest."""
    out: list[Violation] = []
    for lt in _of(resources, *LAUNCH_TEMPLATES):
        mappings = _get(lt, "blockDeviceMappings", [])
        if mappings == UNKNOWN:
            continue
        if not mappings:
            out.append(Violation("root-volume-encrypted", lt["name"], "no blockDeviceMappings; define the root volume with ebs.encrypted true"))
        for i, m in enumerate(_as_list(mappings)):
            enc = _get({"inputs": m}, "ebs.encrypted")
            if isinstance(m, Mapping) and "ebs" in m and _known(enc) and not _true(enc):
                out.append(Violation("root-volume-encrypted", lt["name"], f"blockDeviceMappings[{i}].ebs.encrypted is not true; set it"))
    for inst in _of(resources, "aws:ec2/instance:Instance"):
        enc = _get(inst, "rootBlockDevice.encrypted")
        if _known(enc) and not _true(enc):
            out.append(Violation("root-volume-encrypted", inst["name"], "rootBlockDevice.encrypted is not true; set it"))
    return out
