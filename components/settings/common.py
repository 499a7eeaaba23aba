"""Checks that span blocks but read the same on both clouds, and the helpers both clouds' checks share.

`aws.validate` and `gcp.validate` call the helpers with their own names and patterns;
`validate` here runs after them, for the rules that do not depend on the cloud.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from components import catalog
from components.settings import usercode
from components.settings.errors import ConfigError
from components.settings.schema import BUILTIN_MODELS, Settings


def check_machine_types(s: Settings, each: Callable[[str], None] | None = None) -> None:
    """Each type is a known GPU machine of this stack's cloud and has compute.gpusPerNode GPUs;
    `each(type)` adds the cloud's own check of one type, in the same pass."""
    cloud, other = s.cloud, ("gcp" if s.cloud == "aws" else "aws")
    c = s.compute
    for i, t in enumerate(c.instance_types):
        key = f"compute.instanceTypes[{i}]"
        counts = catalog.gpus_of(cloud, t)
        if counts is None:
            if catalog.gpus_of(other, t) is not None or (
                catalog.looks_like_aws_type(t) if other == "aws" else catalog.looks_like_gcp_type(t)
            ):
                raise ConfigError(key, f"{t!r} is {'an AWS instance type' if other == 'aws' else 'a GCE machine type'}; "
                                       f"this stack's cloud is {cloud}")
            known = list(catalog.AWS_GPU_INSTANCES if cloud == "aws" else catalog.GCP_GPU_MACHINES)
            near = difflib.get_close_matches(t, known, n=1)
            raise ConfigError(key, f"{t!r} is not a known {cloud.upper()} GPU machine type"
                                   + (f"; did you mean {near[0]!r}?" if near else ""))
        # A Vertex AI job's machines boot Vertex AI's own image and driver, not the stack's default one (and
        # compute.imageId is refused there): only what TensorFlow itself cannot use is refused.
        reason = catalog.unsupported_reason(cloud, t, custom_image=bool(c.image_id) or s.scheduler == "vertex")
        if reason:
            raise ConfigError(key, f"{t!r}: {reason}")
        if c.gpus_per_node not in counts:
            raise ConfigError("compute.gpusPerNode", f"{c.gpus_per_node}: {t} has "
                              f"{' or '.join(map(str, counts))} GPU(s); pick types that all have {c.gpus_per_node}")
        if each is not None:
            each(t)


def check_one_gpu_model(s: Settings) -> None:
    """Several machines take instance types of one GPU model only.

    The machines of a cluster train in lockstep: every step waits for the slowest GPU, and a
    batch that fits the largest GPU's memory fails on a smaller one after the first step. A
    group free to pick any listed type (AWS mixed instances, GCE instance flexibility) could
    put an A10G next to an L4; sizes of one model (g5.12xlarge and g5.24xlarge) may mix.
    """
    c = s.compute
    if c.nodes <= 1:
        return
    first = catalog.gpu_model(s.cloud, c.instance_types[0], c.accelerator)
    for i, t in enumerate(c.instance_types[1:], start=1):
        model = catalog.gpu_model(s.cloud, t, c.accelerator)
        if model != first:
            raise ConfigError(f"compute.instanceTypes[{i}]", f"{t!r} has {model or 'unknown'} GPUs but "
                              f"{c.instance_types[0]!r} has {first or 'unknown'}: the {c.nodes} machines "
                              "(compute.nodes) train in lockstep, so a cluster takes one GPU model; list types of "
                              "one model, or set compute.nodes: 1")


def check_zones(s: Settings) -> None:
    """Every zone named belongs to the stack's region."""
    for i, z in enumerate(s.compute.zones):
        if not catalog.zone_in_region(s.cloud, z, s.region):
            raise ConfigError(f"compute.zones[{i}]", f"{z!r} is not a zone of region {s.region}")


def check_data_uri(s: Settings, scheme: str) -> None:
    """run.dataUri and run.validationDataUri are in this cloud's object store (`scheme` is s3:// or gs://)."""
    for key, uri in (("run.dataUri", s.run.data_uri), ("run.validationDataUri", s.run.validation_data_uri)):
        if uri and not re.fullmatch(re.escape(scheme) + r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/.*)?", uri):
            raise ConfigError(key, f"{uri!r}: expected {scheme}BUCKET/PATH on {s.cloud}")


def check_bucket_name(s: Settings) -> None:
    """storage.bucketName, when given, is a name this cloud accepts."""
    if s.storage.bucket_name is not None:
        problem = bucket_name_problem(s.cloud, s.storage.bucket_name)
        if problem:
            raise ConfigError("storage.bucketName", f"{s.storage.bucket_name!r}: {problem}")


def bucket_name_problem(cloud: str, name: str) -> str | None:
    """Why the cloud would refuse this bucket name, or None when it is fine."""
    allowed = r"[a-z0-9.-]" if cloud == "aws" else r"[a-z0-9._-]"
    if not 3 <= len(name) <= 63:
        return "expected 3-63 characters"
    if not re.fullmatch(allowed + "+", name):
        return "expected lowercase letters, digits, '.' and '-'" + (" or '_'" if cloud == "gcp" else "")
    if not (name[0].isalnum() and name[-1].isalnum()):
        return "expected to start and end with a letter or digit"
    if ".." in name or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return "expected no '..' and not an IP address"
    if cloud == "aws" and (name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3"))):
        return "uses a prefix or suffix AWS reserves"
    if cloud == "gcp" and (name.startswith("goog") or "google" in name):
        return "GCS refuses names starting with 'goog' or containing 'google'"
    return None


class _ParseError(Exception):
    pass


def trainer_flags() -> list[str]:
    """Every flag `python -m trainer` takes, from its own parser (trainer/config.py imports no TensorFlow)."""
    from trainer.config import build_parser

    # argparse has no public walk over its options; the trainer reads them the same way.
    return sorted(o for a in build_parser()._actions for o in a.option_strings if o.startswith("--"))


def _entry_named(message: str, extra: list[str]) -> int:
    """The index of the extraArgs entry that argparse's `message` is about: the first entry whose flag
    the message names, whole or as the prefix argparse accepts (`--prec` for `--precision`)."""
    names = [a.split("=", 1)[0] for a in extra]
    mentioned = re.findall(r"(?<![\w-])(--[\w-]+)", message)
    for same in (str.__eq__, str.startswith):  # a whole name before a prefix: --steps-per-call, not --steps
        for flag in mentioned:
            for i, name in enumerate(names):
                if name.startswith("--") and same(flag, name):
                    return i
    return 0


def check_extra_args(s: Settings) -> None:
    """run.extraArgs are flags the trainer really has, with values it accepts: parsed by its own parser
    as the machine will parse them, so a typo fails here instead of crash-looping on a paid machine."""
    extra = s.run.extra_args
    if not extra:
        return
    from trainer.config import build_parser

    parser = build_parser()

    def fail(message: str) -> None:
        raise _ParseError(message)

    parser.error = fail  # type: ignore[method-assign]  # argparse would print usage and exit
    # What the machine passes besides extraArgs; the stack sets these itself.
    base = ["--run-uri", "file:///run", "--synthetic"]
    try:
        _, unknown = parser.parse_known_args(base + list(extra))
    except _ParseError as e:
        message = str(e)
        i = _entry_named(message, extra)
        raise ConfigError(f"run.extraArgs[{i}]", f"{extra[i]!r}: the trainer refuses it ({message}); "
                          "see python -m trainer --help") from None
    if unknown:
        i = next(i for i, a in enumerate(extra) if a == unknown[0])
        name = unknown[0].split("=", 1)[0]
        if not name.startswith("-"):
            raise ConfigError(f"run.extraArgs[{i}]", f"{extra[i]!r}: not a flag or a flag's value; "
                              "write flags as --name=value")
        near = difflib.get_close_matches(name, trainer_flags(), n=1)
        hint = f"did you mean {near[0]!r}?" if near else "see python -m trainer --help for its flags"
        raise ConfigError(f"run.extraArgs[{i}]", f"{name!r} is not a flag of the trainer; {hint}")


def validate(s: Settings) -> None:
    """Rules across blocks that read the same on both clouds: checkpoint interval, spot price, trainer
    flags, user code."""
    c = s.compute
    cap = c.max_runtime_hours * 3600
    if s.run.checkpoint_every_seconds and s.run.checkpoint_every_seconds > cap:
        raise ConfigError("run.checkpointEverySeconds", f"{s.run.checkpoint_every_seconds}: longer than "
                          f"compute.maxRuntimeHours ({c.max_runtime_hours} h); no checkpoint would ever be written")
    if not c.spot and c.max_price_per_hour is not None:
        raise ConfigError("compute.maxPricePerHour", "only applies to spot; remove it or set compute.spot: true")
    if s.cloud == "gcp" and c.max_price_per_hour is not None:
        # Compute Engine's scheduling has no maximum price (provisioningModel SPOT, no bid): the setting
        # would bind nothing. (An AWS home's GCP placements: it holds on the AWS ones, the stack warns.) A GCP
        # home's AWS placements are refused it too: one key cannot bind some placements and not home.
        aws_places = [f"placements[{i}] ({p.region})" for i, p in enumerate(s.placement_list) if p.cloud == "aws"]
        also = (f"; {', '.join(aws_places)} on AWS then pay{'s' if len(aws_places) == 1 else ''} EC2's current spot "
                "price, capped at the on-demand price") if aws_places else ""
        raise ConfigError("compute.maxPricePerHour", f"{c.max_price_per_hour}: GCE Spot VMs have no maximum price (they "
                          f"pay the current Spot price and are preempted for capacity, not price); remove it{also}")
    if s.cloud == "gcp" and s.placement.reserve_concurrency:
        # The GCP controller runs one instance at most already (max_instance_count 1); Cloud Functions has no
        # reservation to make.
        raise ConfigError("placement.reserveConcurrency", "true: reserves concurrency for an AWS home's Lambda function "
                          "only; a GCP home's function runs one instance at most already: remove it")
    gate = [k for k in ("max_severity", "allow_findings", "scan_wait_minutes") if k in s.image.model_fields_set]
    if gate and not s.image.build:
        key = {"max_severity": "maxSeverity", "allow_findings": "allowFindings", "scan_wait_minutes": "scanWaitMinutes"}[gate[0]]
        raise ConfigError(f"image.{key}", "applies to the scan of an image the stack builds; set image.build: true, or "
                          "remove it (a public image is pinned by digest and not scanned by the stack: docs/images.md)")
    check_one_gpu_model(s)
    check_extra_args(s)
    usercode.validate(s.run.code, s.run.model, BUILTIN_MODELS, command=s.run.command,
                      own_data=not (s.run.synthetic or s.run.data_uri))
    if s.run.command is not None and c.nodes > 1 and s.run.keras != 2:
        default = "" if "keras" in s.run.model_fields_set else " (the default)"
        raise ConfigError("run.keras", f"{s.run.keras}{default}: run.command on compute.nodes {c.nodes} needs run.keras: 2 "
                          "(Keras 3's fit fails under MultiWorkerMirroredStrategy, keras-team/keras#20585); set "
                          "run.keras: 2 with a script on tf.keras (docs/your-fit-script.md), or train with a "
                          "ModelSpec (run.model, docs/your-model.md)")
