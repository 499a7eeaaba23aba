"""The machine rules: IMDSv2, GCE metadata hardening, encrypted root volumes."""

from __future__ import annotations

from collections.abc import Mapping

from policy.rules import base
from policy.rules.base import UNKNOWN, Context, Resource, Violation

LAUNCH_TEMPLATES = ("aws:ec2/launchTemplate:LaunchTemplate",)
GCE_TEMPLATES = ("gcp:compute/instanceTemplate:InstanceTemplate", "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate")


def imdsv2_required(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Launch templates require IMDSv2 session tokens with a hop limit of 1, so a request
    forwarded from outside the host (SSRF) cannot read the role's credentials."""
    out: list[Violation] = []
    for lt in base.of_type(resources, *LAUNCH_TEMPLATES, "aws:ec2/instance:Instance"):
        tokens = base.get(lt, "metadataOptions.httpTokens")
        hops = base.get(lt, "metadataOptions.httpPutResponseHopLimit")
        if base.known(tokens) and tokens != "required":
            out.append(Violation("imdsv2-required", lt["name"], f"metadataOptions.httpTokens is {tokens!r}; set 'required'"))
        if base.known(hops) and hops not in (1, "1"):
            out.append(Violation("imdsv2-required", lt["name"], f"metadataOptions.httpPutResponseHopLimit is {hops!r}; set 1"))
    return out


def gce_metadata_hardened(resources: list[Resource], ctx: Context) -> list[Violation]:
    """GCE templates keep the legacy metadata endpoints off and Shielded VM's vTPM and
    integrity monitoring on (secure boot is left to the image: NVIDIA drivers must be signed)."""
    out: list[Violation] = []
    for t in base.of_type(resources, *GCE_TEMPLATES):
        if base.is_false(base.get(t, "metadata.disable-legacy-endpoints")):
            out.append(Violation("gce-metadata-hardened", t["name"], "metadata disable-legacy-endpoints is false; remove it"))
        for f in ("enableVtpm", "enableIntegrityMonitoring"):
            if base.is_false(base.get(t, f"shieldedInstanceConfig.{f}")):
                out.append(Violation("gce-metadata-hardened", t["name"], f"shieldedInstanceConfig.{f} is false; set true"))
    return out


def root_volume_encrypted(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Every EBS volume a launch template defines is encrypted, and it defines the root one
    (otherwise the AMI's default applies). GCE disks are always encrypted at rest."""
    out: list[Violation] = []
    for lt in base.of_type(resources, *LAUNCH_TEMPLATES):
        mappings = base.get(lt, "blockDeviceMappings", [])
        if mappings == UNKNOWN:
            continue
        if not mappings:
            out.append(Violation("root-volume-encrypted", lt["name"], "no blockDeviceMappings; define the root volume with ebs.encrypted true"))
        for i, m in enumerate(base.as_list(mappings)):
            enc = base.get({"inputs": m}, "ebs.encrypted")
            if isinstance(m, Mapping) and "ebs" in m and base.known(enc) and not base.is_true(enc):
                out.append(Violation("root-volume-encrypted", lt["name"], f"blockDeviceMappings[{i}].ebs.encrypted is not true; set it"))
    for inst in base.of_type(resources, "aws:ec2/instance:Instance"):
        enc = base.get(inst, "rootBlockDevice.encrypted")
        if base.known(enc) and not base.is_true(enc):
            out.append(Violation("root-volume-encrypted", inst["name"], "rootBlockDevice.encrypted is not true; set it"))
    return out
