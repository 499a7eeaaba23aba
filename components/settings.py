"""The stack's configuration as typed, validated data.

A stack file (`stacks/Pulumi.<stack>.yaml`) holds scalars (`trainstack:cloud`,
`trainstack:region`, `trainstack:project`) and structured blocks (`trainstack:run`,
`trainstack:compute`, `trainstack:image`, `trainstack:storage`, `trainstack:access`), with
camelCase keys as Pulumi config usually has. Everything is checked here, before the first
resource is created; a bad value raises `ConfigError` whose message is one line naming the
key, the value and what was expected.
"""

from __future__ import annotations

import base64
import difflib
import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from components import catalog

NAMESPACE = "trainstack"
BLOCKS = ("run", "compute", "image", "storage", "access")
SCALARS = ("cloud", "region", "project")
BUILTIN_MODELS = ("mlp", "transformer-lm")
DEFAULT_IMAGE_REPOSITORY = "tensorflow/tensorflow"
DEFAULT_IMAGE_TAG = "2.21.0-gpu"
# What a refused secret's message ends with: trainstack's config holds no secret at all.
NO_SECRETS = ("trainstack needs no secret in its config (the machines get credentials from their role or "
              "service account); remove it, and keep any other tool's secret out of stack files with "
              "`pulumi config set --secret`")


class ConfigError(ValueError):
    """A stack config value that cannot work; `str()` is one line naming the key."""

    def __init__(self, key: str, message: str):
        self.key = key
        # A key of another namespace (aws:secretKey) is shown as it is.
        shown = key if ":" in key.split(".", 1)[0] else f"{NAMESPACE}:{key}"
        super().__init__(f"{shown}: {' '.join(message.split())}")


# A model validator's error names the key it is about: "\x00key\x00message" (see _one_line).
_KEYED = "\x00"


def _keyed(key: str, message: str) -> ValueError:
    return ValueError(f"{_KEYED}{key}{_KEYED}{message}")


class _Block(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1; a count or a limit given as true/false is a mistake.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(v, bool) and field is not None and field.annotation in (int, float, int | None, float | None):
            raise ValueError("expected a number, not true/false")
        return v


class RunSettings(_Block):
    """What to train and how often to checkpoint it."""

    id: str = Field("", description="Run id: the folder runs/<id> in the bucket. Default: the stack name.")
    model: str = Field("mlp", description='Built-in "mlp" or "transformer-lm", or "package.module:function".')
    synthetic: bool = Field(False, description="Train on deterministic synthetic data (no dataUri needed).")
    data_uri: str | None = Field(None, description="TFRecord files: s3://… (AWS) or gs://… (GCP).")
    steps: int = Field(10_000, gt=0, description="Training steps in the whole run.")
    batch_size: int = Field(64, gt=0, le=65_536, description="Examples per GPU per step.")
    checkpoint_every_steps: int | None = Field(1000, gt=0, description="Checkpoint every N steps.")
    checkpoint_every_seconds: int | None = Field(600, gt=0, description="Checkpoint at least every S seconds.")
    keep_checkpoints: int = Field(3, ge=1, le=100, description="Committed checkpoints kept in the bucket.")
    seed: int = Field(0, ge=0, description="Seed for data order and initial weights.")
    extra_args: list[str] = Field(default_factory=list, description="More trainer flags, passed as given.")

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if v and not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", v):
            raise ValueError("expected lowercase letters, digits and '-', 1-63 characters, starting with a letter or digit")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v in BUILTIN_MODELS or re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            return v
        raise ValueError(f'expected one of {", ".join(BUILTIN_MODELS)} or "package.module:function"')

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for arg in v:
            if arg.split("=", 1)[0] in ("--run-uri", "--data-uri", "--steps", "--model"):
                raise ValueError(f"{arg!r} is set by the stack itself; use the run block's own key")
        return v

    @model_validator(mode="after")
    def _source(self) -> RunSettings:
        if self.synthetic and self.data_uri:
            raise _keyed("dataUri", "set either synthetic: true or dataUri, not both")
        if not self.synthetic and not self.data_uri:
            raise _keyed("dataUri", "is required: set dataUri (s3://… or gs://…) or synthetic: true")
        if self.checkpoint_every_steps is None and self.checkpoint_every_seconds is None:
            raise _keyed("checkpointEverySteps", "set checkpointEverySteps or checkpointEverySeconds, or both")
        return self


class ComputeSettings(_Block):
    """The machines: types in order of preference, GPUs, count, spot, limits."""

    instance_types: list[str] = Field(
        default_factory=lambda: ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"],
        min_length=1, max_length=20,
        description="Machine types in order of preference (AWS instance types / GCE machine types).",
    )
    gpus_per_node: int = Field(1, ge=1, le=16, description="GPUs on each machine; every type must have this many.")
    accelerator: str | None = Field(None, description="GCP N1 machines only: the GPU type, e.g. nvidia-tesla-t4.")
    nodes: int = Field(1, ge=1, le=64, description="Machines in the group; more than one trains with MultiWorkerMirroredStrategy.")
    spot: bool = Field(True, description="Spot (AWS) / Spot VMs (GCP); false gives on-demand.")
    max_price_per_hour: float | None = Field(None, gt=0, description="Highest spot price per machine-hour (USD); default: on-demand price.")
    max_runtime_hours: float = Field(24, gt=0, le=720, description="The cloud scales the group to zero this long after the first launch.")
    root_disk_gb: int = Field(200, ge=30, le=16_384, description="Encrypted root volume size (GiB).")
    image_id: str | None = Field(None, description="AMI id / GCE image; default: the cloud's GPU-ready deep learning image.")
    subnets: list[str] = Field(default_factory=list, description="AWS subnets to spread over; default: the default VPC's subnets.")
    zones: list[str] = Field(default_factory=list, description="Zones to spread over; default: every zone of the region.")

    @field_validator("instance_types")
    @classmethod
    def _types(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("expected each type once")
        return v


class ImageSettings(_Block):
    """The pinned TensorFlow container the trainer runs in."""

    repository: str = Field(DEFAULT_IMAGE_REPOSITORY, description="Image repository (no tag).")
    tag: str = Field(DEFAULT_IMAGE_TAG, description="A pinned tag; 'latest' is refused.")
    digest: str | None = Field(None, description="sha256:<64 hex>; when set the machines pull by digest.")
    build: bool = Field(False, description="Build trainer/Dockerfile and push it to the stack's repository.")
    keep_images: int = Field(10, ge=1, le=1000, description="Images the stack's repository keeps.")

    @field_validator("repository")
    @classmethod
    def _repo(cls, v: str) -> str:
        if "@" in v or ":" in v.rsplit("/", 1)[-1]:
            raise ValueError("expected a repository without tag or digest; put them in image.tag / image.digest")
        if not re.fullmatch(r"[a-z0-9]+([._/-][a-z0-9]+)*(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*", v):
            raise ValueError("expected a repository like tensorflow/tensorflow or REGISTRY/PATH")
        return v

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: str) -> str:
        if v.lower().startswith("latest") or v.lower().endswith("latest"):
            raise ValueError(f"expected a pinned tag such as {DEFAULT_IMAGE_TAG}; 'latest' moves under a running job")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", v):
            raise ValueError("expected a docker tag: letters, digits, '_', '.', '-'")
        return v

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", v):
            raise ValueError("expected sha256: followed by 64 lowercase hex digits")
        return v

    @property
    def reference(self) -> str:
        """What `docker pull` takes: by digest when known, else by the pinned tag."""
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag}"


class StorageSettings(_Block):
    """The bucket that holds checkpoints, logs and the model."""

    bucket_name: str | None = Field(None, description="Bucket name; default: generated from project and stack.")
    keep_on_destroy: bool = Field(True, description="Keep the bucket and its data on `pulumi destroy`.")
    noncurrent_days: int = Field(30, ge=1, le=3650, description="Days old versions of objects are kept.")


class AccessSettings(_Block):
    """Who may reach the machines. Default: nobody (no inbound rule at all)."""

    ssh_public_key: str | None = Field(None, description="OpenSSH public key for the `ops` CLI (ssh-ed25519 …).")
    allowed_cidrs: list[str] = Field(default_factory=list, description="CIDRs allowed to port 22; default none.")
    allow_world: bool = Field(False, description="Must be true to allow 0.0.0.0/0 or ::/0.")

    @field_validator("ssh_public_key")
    @classmethod
    def _key(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if "PRIVATE KEY" in v:
            raise ValueError("is a private key: give the public key (ssh-keygen -y -f KEY); " + NO_SECRETS)
        _parse_public_key(v)
        return v

    @field_validator("allowed_cidrs")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        for cidr in v:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as e:
                raise ValueError(f"{cidr!r} is not a CIDR ({e}); expected e.g. 203.0.113.0/24") from None
            if "/" not in cidr:
                raise ValueError(f"{cidr!r} is not a CIDR; expected e.g. {cidr}/32")
        return v

    @model_validator(mode="after")
    def _world(self) -> AccessSettings:
        for i, cidr in enumerate(self.allowed_cidrs):
            if ipaddress.ip_network(cidr).prefixlen == 0 and not self.allow_world:
                raise _keyed(f"allowedCidrs[{i}]", f"{cidr} opens SSH to the whole internet; name your own CIDR "
                             "(e.g. your address/32), or set access.allowWorld: true")
        if self.allowed_cidrs and not self.ssh_public_key:
            raise _keyed("sshPublicKey", "is required when allowedCidrs opens port 22 (ssh-ed25519 AAAA…)")
        return self


def _parse_public_key(text: str) -> None:
    parts = text.split()
    if len(parts) < 2:
        raise ValueError("expected an OpenSSH public key: 'TYPE BASE64 [comment]'")
    kind, blob = parts[0], parts[1]
    try:
        raw = base64.b64decode(blob, validate=True)
    except ValueError:
        raise ValueError("the key's base64 part does not decode") from None
    if len(raw) < 4:
        raise ValueError("the key is too short")
    n = int.from_bytes(raw[:4], "big")
    if raw[4 : 4 + n].decode("ascii", "replace") != kind:
        raise ValueError(f"the key data is not a {kind} key")
    # cryptography (paramiko's own backend) checks the key data itself: lengths, curve
    # points, RSA sizes; paramiko's parser accepts a truncated ed25519 key.
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    try:
        load_ssh_public_key(f"{kind} {blob}".encode())
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ValueError(f"the key does not parse as {kind} ({e}); copy the whole line of your .pub file") from None


class Settings(_Block):
    """The whole stack config."""

    stack: str = Field(description="The Pulumi stack name.")
    cloud: Literal["aws", "gcp"] = Field("aws", description="aws or gcp.")
    region: str = Field(description="Region of every resource.")
    project: str = Field("", description="GCP project id (GCP only).")
    run: RunSettings
    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    image: ImageSettings = Field(default_factory=ImageSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)

    @property
    def run_id(self) -> str:
        return self.run.id or self.stack


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: Any = Settings
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        ann = field.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return model


def _known_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


def _one_line(err: ValidationError) -> ConfigError:
    e = err.errors(include_url=False)[0]
    loc = tuple(e["loc"])
    key = _key_path(loc) or "config"
    value = e.get("input")
    if e["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1]) or Settings
        known = _known_keys(parent)
        near = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"expected one of: {', '.join(known)}"
        return ConfigError(key, f"unknown key; {hint}")
    msg = e["msg"].removeprefix("Value error, ")
    if msg.startswith(_KEYED):
        sub, _, msg = msg[1:].partition(_KEYED)
        key = f"{key}.{sub}" if loc else sub
        value = value.get(sub.split("[", 1)[0]) if isinstance(value, Mapping) else None
        if value is None or "[" in sub:
            return ConfigError(key, msg)
    if e["type"] == "missing":
        return ConfigError(key, "is required")
    return ConfigError(key, f"{_shown(value)}: {_expected(e, msg)}")


def _shown(value: Any) -> str:
    shown = repr(value) if not isinstance(value, Mapping) else "{…}"
    return shown if len(shown) <= 80 else shown[:77] + "…"


def _expected(e: Mapping[str, Any], msg: str) -> str:
    """pydantic's message said as what to write instead."""
    t, ctx, value = e["type"], e.get("ctx") or {}, e.get("input")
    if t in ("int_type", "int_parsing", "int_from_float"):
        return "expected a whole number, e.g. 4"
    if t in ("float_type", "float_parsing"):
        return "expected a number, e.g. 1.5"
    if t == "finite_number":
        return "expected a finite number"
    if t in ("bool_type", "bool_parsing"):
        return "expected true or false"
    if t == "string_type":
        if isinstance(value, int | float):
            return "expected text; quote the value in YAML (e.g. '2.21')"
        return "expected text"
    if t == "list_type":
        return "expected a list, e.g. [a, b]"
    if t in ("model_type", "dict_type", "model_attributes_type"):
        return "expected a block of keys"
    if t == "literal_error":
        return f"expected {ctx.get('expected', 'one of the listed values')}".replace("'", "")
    bound = {k: (int(v) if isinstance(v, float) and v.is_integer() else v) for k, v in ctx.items()}
    if t == "greater_than":
        return f"expected a number greater than {bound.get('gt')}"
    if t == "greater_than_equal":
        return f"expected {bound.get('ge')} or more"
    if t == "less_than_equal":
        return f"expected {bound.get('le')} or less"
    if t == "less_than":
        return f"expected less than {bound.get('lt')}"
    if t == "too_short":
        return f"expected at least {ctx.get('min_length')} entr{'y' if ctx.get('min_length') == 1 else 'ies'}; " \
               "remove the key for the default"
    if t == "too_long":
        return f"expected at most {ctx.get('max_length')} entries"
    return msg


def _check_cloud(s: Settings) -> None:
    """Rules that need more than one block: cloud-specific names, GPU counts, intervals."""
    cloud, other = s.cloud, ("gcp" if s.cloud == "aws" else "aws")
    region_re = catalog.AWS_REGION if cloud == "aws" else catalog.GCP_REGION
    if not region_re.fullmatch(s.region):
        raise ConfigError("region", f"{s.region!r}: not {'an AWS' if cloud == 'aws' else 'a GCP'} region name (e.g. "
                          f"{'us-east-1' if cloud == 'aws' else 'us-central1'})")
    if cloud == "gcp" and not re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", s.project):
        raise ConfigError("project", f"{s.project!r}: expected the GCP project id (6-30 lowercase letters, digits, '-')")
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
        if c.gpus_per_node not in counts:
            raise ConfigError("compute.gpusPerNode", f"{c.gpus_per_node}: {t} has "
                              f"{' or '.join(map(str, counts))} GPU(s); pick types that all have {c.gpus_per_node}")
        if cloud == "gcp" and t.startswith("n1-") and not c.accelerator:
            raise ConfigError("compute.accelerator", f"is required for {t} (e.g. nvidia-tesla-t4)")
    for i, z in enumerate(c.zones):
        if not catalog.zone_in_region(cloud, z, s.region):
            raise ConfigError(f"compute.zones[{i}]", f"{z!r} is not a zone of region {s.region}")
    for i, sn in enumerate(c.subnets):
        if cloud == "gcp" or not re.fullmatch(r"subnet-[0-9a-f]{8,17}", sn):
            raise ConfigError(f"compute.subnets[{i}]", f"{sn!r}: expected an AWS subnet id (subnet-…)"
                              if cloud == "aws" else f"{sn!r}: GCP stacks choose zones, not subnets")
    if c.image_id:
        if cloud == "aws" and not re.fullmatch(r"ami-[0-9a-f]{8,17}", c.image_id):
            raise ConfigError("compute.imageId", f"{c.image_id!r}: expected an AMI id (ami-…)")
        if cloud == "gcp" and not re.fullmatch(r"(projects/[a-z0-9-]+/global/images/(family/)?)?[a-z][a-z0-9-]{0,62}", c.image_id):
            raise ConfigError("compute.imageId", f"{c.image_id!r}: expected a GCE image (projects/P/global/images/NAME)")
    cap = c.max_runtime_hours * 3600
    if s.run.checkpoint_every_seconds and s.run.checkpoint_every_seconds > cap:
        raise ConfigError("run.checkpointEverySeconds", f"{s.run.checkpoint_every_seconds}: longer than "
                          f"compute.maxRuntimeHours ({c.max_runtime_hours} h); no checkpoint would ever be written")
    if s.run.data_uri:
        scheme = "s3://" if cloud == "aws" else "gs://"
        if not re.fullmatch(re.escape(scheme) + r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/.*)?", s.run.data_uri):
            raise ConfigError("run.dataUri", f"{s.run.data_uri!r}: expected {scheme}BUCKET/PATH on {cloud}")
    if s.storage.bucket_name is not None:
        problem = bucket_name_problem(cloud, s.storage.bucket_name)
        if problem:
            raise ConfigError("storage.bucketName", f"{s.storage.bucket_name!r}: {problem}")
    if not s.compute.spot and s.compute.max_price_per_hour is not None:
        raise ConfigError("compute.maxPricePerHour", "only applies to spot; remove it or set compute.spot: true")
    if c.accelerator and not (cloud == "gcp" and all(t.startswith("n1-") for t in c.instance_types)):
        raise ConfigError("compute.accelerator", f"{c.accelerator!r}: only GCP N1 machine types take an accelerator; "
                          "remove it (the other types come with their GPUs)")
    if cloud == "aws" and s.project:
        raise ConfigError("project", f"{s.project!r}: is the GCP project id; remove it on an AWS stack")


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


def _walk(value: Any, key: str):
    """(key path, value) for every value under `value`, nested ones included."""
    yield key, value
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{key}[{i}]")


def _refuse_secrets(raw: Mapping[str, Any]) -> None:
    """No secret anywhere in trainstack's config: neither Pulumi-encrypted nor plain text."""
    from policy.rules import secret_kind  # the same patterns the policy rules look for

    for top, block in raw.items():
        for key, v in _walk(block, str(top)):
            if isinstance(v, Mapping) and set(v) == {"secure"}:
                raise ConfigError(key, "is a secret; " + NO_SECRETS)
            kind = secret_kind(v) if isinstance(v, str) else None
            if kind:
                hint = " (give the public key: ssh-keygen -y -f KEY)" if "private key" in kind else ""
                raise ConfigError(key, f"holds {kind}{hint}; " + NO_SECRETS)


def load_settings(raw: Mapping[str, Any], *, stack: str) -> Settings:
    """Validate a mapping of un-namespaced config keys (cloud, region, run, …)."""
    _refuse_secrets(raw)
    known = set(SCALARS) | set(BLOCKS)
    for k in raw:
        if k not in known:
            near = difflib.get_close_matches(k, sorted(known), n=1)
            raise ConfigError(k, "unknown key; " + (f"did you mean {NAMESPACE}:{near[0]}?" if near
                                                    else f"expected one of: {', '.join(sorted(known))}"))
    for k in BLOCKS:
        if k in raw and not isinstance(raw[k], Mapping):
            raise ConfigError(k, f"{raw[k]!r}: expected a block of keys")
    if "run" not in raw:
        raise ConfigError("run", "is required (at least: synthetic: true or dataUri)")
    try:
        s = Settings.model_validate({"stack": stack, **raw})
    except ValidationError as err:
        raise _one_line(err) from None
    _check_cloud(s)
    return s


# Provider keys that hold credentials: in a stack file they must at least be Pulumi secrets.
PLAIN_CREDENTIAL_KEYS = ("aws:accessKey", "aws:secretKey", "aws:token", "gcp:credentials", "gcp:accessToken")


def raw_from_stack_file(path: str | Path) -> dict[str, Any]:
    """The `trainstack:` keys of a stack file, without the namespace."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError("config", f"{p.name} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, Mapping):
        raise ConfigError("config", f"{p.name}: expected a mapping with a config: block")
    cfg = doc.get("config") or {}
    if not isinstance(cfg, Mapping):
        raise ConfigError("config", "expected a mapping of config keys")
    raw = {}
    for k, v in cfg.items():
        ns, _, key = str(k).partition(":")
        if ns == NAMESPACE:
            raw[key] = v
        elif str(k) in PLAIN_CREDENTIAL_KEYS and not (isinstance(v, Mapping) and set(v) == {"secure"}):
            raise ConfigError(str(k), "is a credential in plain text; use an AWS profile or gcloud's application "
                              "default credentials, or at least `pulumi config set --secret`")
    _refuse_secrets(raw)
    region = cfg.get(f"{raw.get('cloud', 'aws')}:region")
    if region is not None and "region" in raw and region != raw["region"]:
        raise ConfigError(f"{raw.get('cloud', 'aws')}:region", f"{region!r} differs from trainstack:region "
                          f"{raw['region']!r}; remove it (the stack sets its provider's region itself)")
    return raw


def load_stack_file(path: str | Path, stack: str | None = None) -> Settings:
    """Read and validate `stacks/Pulumi.<stack>.yaml`."""
    p = Path(path)
    name = stack or p.name.removeprefix("Pulumi.").removesuffix(".yaml")
    return load_settings(raw_from_stack_file(p), stack=name)


def from_pulumi_config() -> Settings:
    """Read the current stack's config through the Pulumi SDK (used by __main__)."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    cfg = pulumi.Config(NAMESPACE)
    raw: dict[str, Any] = {}
    present = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    for full in sorted(present):
        ns, _, key = full.partition(":")
        if ns != NAMESPACE:
            continue
        # `pulumi config set --secret` hands the program the plain value: ask the SDK.
        if runtime_config.is_config_secret(full):
            raise ConfigError(key, "is a secret; " + NO_SECRETS)
        if key not in SCALARS and key not in BLOCKS:
            raw[key] = runtime_config.get_config(full)  # refused below, with a did-you-mean
    for k in SCALARS:
        v = cfg.get(k)
        if v is not None and v != "":
            raw[k] = v
    for k in BLOCKS:
        v = cfg.get_object(k)
        if v is not None:
            raw[k] = v
    return load_settings(raw, stack=pulumi.get_stack())
