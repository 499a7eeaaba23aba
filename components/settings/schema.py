"""The stack config's schema: one pydantic model per block, with each key's type, default and checks.

A stack file (`stacks/Pulumi.<stack>.yaml`) holds scalars (`trainstack:cloud`,
`trainstack:region`, `trainstack:project`) and structured blocks (`trainstack:run`,
`trainstack:compute`, `trainstack:image`, `trainstack:storage`, `trainstack:access`), with
camelCase keys as Pulumi config usually has. The checks here need one block only; those
that need the cloud or several blocks are in `aws.py`, `gcp.py` and `common.py`.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from datetime import date, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from components import config_shared
from components.settings.errors import NO_SECRETS, keyed
from components.settings.kubernetes import KubernetesSettings
from components.settings.serve import ServeSettings
from controller.cost import DEFAULT_MOVE_FLOOR_USD, DEFAULT_MOVE_FRACTION
from trainer.config import TrainConfig

BLOCKS = ("run", "compute", "image", "storage", "access", "placement", "kubernetes", "serve")
# Keys that hold a list of blocks (each entry checked like a block).
LISTS = ("placements",)
SCALARS = ("cloud", "region", "project", "scheduler")
# Who runs the training machines: the stack's own spot groups, or a managed service's training job, or a Job on
# the user's Kubernetes cluster.
SCHEDULERS = ("groups", "sagemaker", "vertex", "kubernetes")
BUILTIN_MODELS = ("mlp", "transformer-lm")
DEFAULT_IMAGE_REPOSITORY = "tensorflow/tensorflow"
DEFAULT_IMAGE_TAG = "2.21.0-gpu"


def _each_once(types: list[str]) -> list[str]:
    if len(set(types)) != len(types):
        raise ValueError("expected each type once")
    return types


# Machine types in order of preference (compute's and each placement's): none twice.
InstanceTypes = Annotated[list[str], AfterValidator(_each_once)]


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


# The trainer's options have one default each, its own (trainer/config.py): a stack that leaves a
# key out gets what `python -m trainer` gets without the flag, and the env file says it explicitly.
_TRAINER = TrainConfig(run_uri="")


class RunSettings(_Block):
    """What to train and how often to checkpoint it."""

    id: str = Field(config_shared.DEFAULT_RUN_ID, description="Run id: the folder runs/<id> in the bucket. Default: the stack name.")
    model: str = Field(_TRAINER.model, description='Built-in "mlp" or "transformer-lm", or "package.module:function".')
    code: str | None = Field(None, description="Folder of your own modules (relative to the project) shipped with "
                             "the trainer; needed by a package.module:function model.")
    command: list[str] | None = Field(None, description="Script mode: your own command (e.g. [python, train.py, "
                                      "--epochs, '5']) run in the run.code folder instead of the trainer's loop; "
                                      "see docs/your-fit-script.md.")
    keras: int = Field(3, description="Script mode: the Keras your script's tf.keras is. 3 (the "
                                 "default): TensorFlow's own. 2: tf_keras, with TF_USE_LEGACY_KERAS=1 set for the "
                                 "command; needed with compute.nodes > 1 (Keras 3's fit fails under "
                                 "MultiWorkerMirroredStrategy, keras-team/keras#20585).")
    synthetic: bool = Field(_TRAINER.synthetic, description="Train on deterministic synthetic data (no dataUri needed).")
    data_uri: str | None = Field(None, description="TFRecord files: s3://… (AWS) or gs://… (GCP).")
    data_grant: bool = Field(True, description="GCP: grant the machines read access on the dataUri bucket; false "
                             "when it is public or its owner grants it (`ops preflight` says which).")
    validation_data_uri: str | None = Field(None, description="Validation TFRecord files (s3://… or gs://…), read "
                                            "with the model's parse_tfrecord; default: the model's own validation set.")
    eval_every_steps: int | None = Field(None, gt=0, description="Evaluate on the whole validation set every N steps; "
                                         "default: at the end only.")
    keep_best: str | None = Field(None, description="Keep the checkpoint with the best value of a validation metric "
                                  "(val_accuracy, val_loss, or val_NAME:min / :max) and export it as model/.")
    steps: int = Field(_TRAINER.steps, gt=0, description="Training steps in the whole run.")
    batch_size: int = Field(_TRAINER.batch_size, gt=0, le=65_536, description="Examples per GPU per step.")
    checkpoint_every_steps: int | None = Field(_TRAINER.checkpoint_every_steps, gt=0,
                                               description="Checkpoint every N steps; default null: no step cadence "
                                               "(checkpointEverySeconds bounds the work a failure loses).")
    checkpoint_every_seconds: int | None = Field(int(_TRAINER.checkpoint_every_seconds), gt=0,
                                                 description="Checkpoint at least every S seconds; null: no time cadence.")
    keep_checkpoints: int = Field(_TRAINER.keep_checkpoints, ge=1, le=100, description="Committed checkpoints kept in the bucket.")
    seed: int = Field(_TRAINER.seed, ge=0, description="Seed for data order and initial weights.")
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

    @field_validator("keep_best")
    @classmethod
    def _keep_best(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"val_[A-Za-z0-9_]+(:(min|max))?", v):
            raise ValueError("expected a validation metric val_<name>, optionally with :min or :max, e.g. "
                             "val_accuracy or val_loss")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for arg in v:
            if arg.split("=", 1)[0] in ("--run-uri", "--data-uri", "--steps", "--model", "--validation-data-uri",
                                        "--eval-every-steps", "--keep-best"):
                raise ValueError(f"{arg!r} is set by the stack itself; use the run block's own key")
            if any(c in arg for c in "\n\r\x00"):
                # The machine's env file, and docker's --env-file after it, hold one line per value.
                raise ValueError(f"{arg!r} holds a line break or NUL, which the machine's env file cannot carry")
        return v

    @field_validator("keras")
    @classmethod
    def _keras(cls, v: int) -> int:
        if v not in (2, 3):
            raise ValueError("expected 2 (tf_keras, TF_USE_LEGACY_KERAS=1) or 3 (TensorFlow's own Keras)")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is empty; give the command as a list, e.g. [python, train.py]")
        for word in v:
            if not word or "'" in word or "\n" in word:
                raise ValueError(f"{word!r}: every word must be non-empty, without quotes (') or newlines")
        return v

    @model_validator(mode="after")
    def _source(self) -> RunSettings:
        if self.command is not None:
            if self.code is None:
                raise keyed("command", "needs run.code: the folder of your script, shipped to the machines, "
                                       "where the command runs")
            if self.model != BUILTIN_MODELS[0]:
                raise keyed("command", f"cannot be combined with run.model {self.model!r}: the command trains its "
                                       "own model; remove one of them")
            if self.synthetic or self.data_uri:
                raise keyed("command", "cannot be combined with run.synthetic or run.dataUri: the command reads "
                                       "its own data; remove them")
            for key, value in (("validationDataUri", self.validation_data_uri),
                               ("evalEverySteps", self.eval_every_steps), ("keepBest", self.keep_best)):
                if value is not None:
                    raise keyed(key, "cannot be combined with run.command: the command evaluates its own model "
                                     "(Keras validation_data); remove it")
            # The trainer loop's options: the script decides them (trainer/config.py refuses the flags alike).
            for key, field, why in (("steps", "steps", "its own steps (model.fit's epochs)"),
                                    ("batchSize", "batch_size", "its own batch size"),
                                    ("checkpointEverySteps", "checkpoint_every_steps",
                                     "nothing of it: fit.callbacks() commits at each epoch's end and every "
                                     "checkpointEverySeconds")):
                if getattr(self, field) not in (None, getattr(_TRAINER, field)):
                    raise keyed(key, f"does not apply to run.command: the script decides {why}; remove it")
        elif self.keras != 3:
            # The trainer's own loop (built-in or ModelSpec) is distributed under Keras 3 already.
            raise keyed("keras", "applies to run.command only: the trainer's own loop runs "
                                 "Keras 3 on one machine or several; remove it")
        elif self.synthetic and self.data_uri:
            raise keyed("dataUri", "set either synthetic: true or dataUri, not both")
        elif not self.synthetic and not self.data_uri and self.model in BUILTIN_MODELS:
            # A user model may bring its own data (ModelSpec.make_dataset): checked with its source (usercode).
            raise keyed("dataUri", "is required: set dataUri (s3://… or gs://…) or synthetic: true")
        if self.model in BUILTIN_MODELS and not self.validation_data_uri and not (self.synthetic and self.model == "mlp"):
            # A built-in model's validation set: the synthetic mlp's held-out images, else validationDataUri.
            for key, value in (("keepBest", self.keep_best), ("evalEverySteps", self.eval_every_steps)):
                if value is not None:
                    raise keyed(key, f"needs a validation set: set validationDataUri (TFRecords {self.model} reads)"
                                     + (" or synthetic: true" if self.model == "mlp" else ""))
        if self.checkpoint_every_steps is None and self.checkpoint_every_seconds is None:
            raise keyed("checkpointEverySteps", "set checkpointEverySteps or checkpointEverySeconds, or both")
        return self


# For one machine: any of three GPU models, whichever has spot capacity first.
DEFAULT_INSTANCE_TYPES = ("g5.xlarge", "g6.xlarge", "g4dn.xlarge")


class ComputeSettings(_Block):
    """The machines: types in order of preference, GPUs, count, spot, limits."""

    instance_types: InstanceTypes = Field(
        default_factory=lambda: list(DEFAULT_INSTANCE_TYPES),
        min_length=1, max_length=20,
        description="Machine types in order of preference (AWS instance types / GCE machine types); "
                    "default: g5.xlarge, g6.xlarge, g4dn.xlarge, or g5.xlarge alone for several machines.",
    )
    gpus_per_node: int = Field(1, ge=1, le=16, description="GPUs on each machine; every type must have this many.")
    accelerator: str | None = Field(None, description="GCP N1 machines only: the GPU type, e.g. nvidia-tesla-t4.")
    nodes: int = Field(1, ge=1, le=64, description="Machines in the group; more than one trains with MultiWorkerMirroredStrategy.")
    spot: bool = Field(config_shared.DEFAULT_SPOT, description="Spot (AWS) / Spot VMs (GCP); false gives on-demand.")
    max_price_per_hour: float | None = Field(None, gt=0, description="Highest spot price per machine-hour (USD); default: on-demand price.")
    max_runtime_hours: float = Field(24, gt=0, le=720, description="The cloud scales the group to zero this long after the first launch.")
    root_disk_gb: int = Field(200, ge=30, le=16_384, description="Encrypted root volume size (GiB).")
    image_id: str | None = Field(None, description="AMI id / GCE image; default: the cloud's GPU-ready deep learning image.")
    subnets: list[str] = Field(default_factory=list, description="AWS subnets to spread over; default: the default VPC's subnets.")
    zones: list[str] = Field(default_factory=list, description="Zones to spread over; default: every zone of the region (AWS: those the subnets cover); several machines use one.")

    @model_validator(mode="before")
    @classmethod
    def _one_model_by_default(cls, data: Any) -> Any:
        # The default types are three GPU models (A10G, L4, T4): fine for one machine, which
        # takes whichever has capacity, but a cluster trains in lockstep on one model
        # (common.check_one_gpu_model). Several machines without a list get the first alone.
        if isinstance(data, dict) and not {"instanceTypes", "instance_types"} & set(data):
            nodes = data.get("nodes", 1)
            if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 1:
                return {**data, "instanceTypes": list(DEFAULT_INSTANCE_TYPES[:1])}
        return data


# Scan severities, lowest first: ECR's (basic and enhanced) and Artifact Analysis's (MINIMAL: GCP's lowest).
SEVERITIES = ("INFORMATIONAL", "LOW", "MEDIUM", "HIGH", "CRITICAL")
# How far ahead an exception may expire: one is looked at again at least once a year.
ALLOW_FINDING_MAX_DAYS = 366


def _no_date() -> date:
    raise ValueError("not a date")


class AllowedFinding(_Block):
    """A finding let through the gate: which, why, and until when (an expired one blocks again)."""

    id: str = Field(description="The vulnerability's id, e.g. CVE-2024-3094.")
    reason: str = Field(description="Why it may run: who judged it and on what ground.")
    expires: date = Field(description="The last day it is let through (YYYY-MM-DD); at most a year ahead.")

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not re.fullmatch(r"(CVE-\d{4}-\d{4,}|GHSA(-[23456789cfghjmpqrvwx]{4}){3})", v):
            raise ValueError("expected a CVE id (CVE-2024-3094) or a GitHub advisory id (GHSA-xxxx-xxxx-xxxx)")
        return v

    @field_validator("expires", mode="before")
    @classmethod
    def _expires_format(cls, v: Any) -> Any:
        if isinstance(v, date):
            return v
        try:
            return date.fromisoformat(str(v)) if re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(v)) else _no_date()
        except ValueError:
            raise ValueError("expected a date as YYYY-MM-DD") from None

    @field_validator("expires")
    @classmethod
    def _expires_soon_enough(cls, v: date) -> date:
        latest = date.today() + timedelta(days=ALLOW_FINDING_MAX_DAYS)
        if v > latest:
            raise ValueError(f"more than a year ahead; an exception is looked at again at least yearly (at most {latest})")
        return v

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str) -> str:
        if len(v.strip()) < 10:
            raise ValueError("expected a reason of a few words: who judged the finding and why it may run")
        return v.strip()


class ImageSettings(_Block):
    """The pinned TensorFlow container the trainer runs in."""

    repository: str = Field(DEFAULT_IMAGE_REPOSITORY, description="Image repository (no tag).")
    tag: str = Field(DEFAULT_IMAGE_TAG, description="A pinned tag; 'latest' is refused.")
    digest: str | None = Field(None, description="sha256:<64 hex>: the digest every machine runs; default: the tag's, resolved at `pulumi up`.")
    build: bool = Field(False, description="Build trainer/Dockerfile and push it to the stack's repository (and to one in each placement's region).")
    keep_images: int = Field(10, ge=1, le=1000, description="Images the stack's repository keeps.")
    max_severity: Literal[SEVERITIES] = Field(  # type: ignore[valid-type]
        "CRITICAL", description="With image.build: a scan finding of this severity or above keeps the image off the machines.")
    allow_findings: list[AllowedFinding] = Field(
        default_factory=list, description="With image.build: findings let through the gate, each with a reason and an expiry date.")
    scan_wait_minutes: int = Field(30, ge=1, le=240, description="With image.build: how long `pulumi up` waits for the pushed image's scan.")

    @field_validator("allow_findings")
    @classmethod
    def _allow_findings(cls, v: list[AllowedFinding]) -> list[AllowedFinding]:
        ids = [a.id for a in v]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"expected each id once; {', '.join(twice)} is listed more than once")
        return v

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
        """By digest when known, else by the pinned tag (what `pulumi up` resolves: components/registry.py)."""
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag}"


class StorageSettings(_Block):
    """The bucket that holds checkpoints, logs and the model."""

    bucket_name: str | None = Field(None, description="Bucket name; default: generated from project and stack.")
    keep_on_destroy: bool = Field(config_shared.DEFAULT_KEEP_ON_DESTROY, description="Keep the bucket and its data on `pulumi destroy`.")
    noncurrent_days: int = Field(30, ge=1, le=3650, description="Days replaced or deleted objects stay restorable (pruned checkpoints: 1 day, see docs/machines-and-cost.md).")
    adopt: bool = Field(False, description="Import the bucket an earlier `pulumi destroy` kept instead of creating it.")


class AccessSettings(_Block):
    """Who may reach the machines. Default: nobody (no inbound rule at all)."""

    ssh_public_key: str | None = Field(None, description="OpenSSH public key for the `ops` CLI (ssh-ed25519 …).")
    allowed_cidrs: list[str] = Field(default_factory=lambda: list(config_shared.DEFAULT_ALLOWED_CIDRS), description="CIDRs allowed to port 22; default none.")
    allow_world: bool = Field(False, description="Must be true to allow 0.0.0.0/0 or ::/0.")
    jupyter: bool = Field(False, description="Run a Jupyter server on each machine, bound to 127.0.0.1, reached "
                          "only through `ops tunnel --jupyter`; needs sshPublicKey and allowedCidrs.")

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
                raise keyed(f"allowedCidrs[{i}]", f"{cidr} opens SSH to the whole internet; name your own CIDR "
                             "(e.g. your address/32), or set access.allowWorld: true")
        if self.allowed_cidrs and not self.ssh_public_key:
            raise keyed("sshPublicKey", "is required when allowedCidrs opens port 22 (ssh-ed25519 AAAA…)")
        if self.jupyter and not (self.ssh_public_key and self.allowed_cidrs):
            # Jupyter listens on the machine's loopback only: SSH is the one way to it.
            missing = " and ".join(k for k, v in (("sshPublicKey", self.ssh_public_key),
                                                   ("allowedCidrs", self.allowed_cidrs)) if not v)
            raise keyed("jupyter", f"true needs access.{missing.replace(' and ', ' and access.')} set: Jupyter is "
                        "reached only through `ops tunnel --jupyter` over SSH; set them, or jupyter: false")
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


class PlacementSettings(_Block):
    """One place the run may train: a cloud, a region and the machine types there (the first is home)."""

    cloud: Literal["aws", "gcp"] = Field(description="aws or gcp.")
    region: str = Field(description="The placement's region; the first placement's is the stack's (home: the bucket).")
    project: str | None = Field(None, description="GCP project id (gcp placements only).")
    instance_types: InstanceTypes = Field(min_length=1, max_length=20,
                                          description="Machine types in order of preference in this placement; each has "
                                                      "compute.gpusPerNode GPUs, so every placement trains the same replicas.")
    zones: list[str] = Field(default_factory=list, description="Zones of the placement's region to spread over; "
                                                               "default: every zone of the region.")

    @model_validator(mode="after")
    def _project(self) -> PlacementSettings:
        if self.cloud == "gcp" and not self.project:
            raise keyed("project", "is required for a gcp placement: the GCP project id of its machines")
        if self.cloud == "aws" and self.project is not None:
            raise keyed("project", "is a GCP project id; remove it from an aws placement")
        return self


# Minutes the active placement may go without a training machine, while its group reports failed
# launches, before the run moves to the next placement.
DEFAULT_WAIT_MINUTES = 15


class PlacementPolicySettings(_Block):
    """When the run moves between placements (stack key `trainstack:placement`)."""

    wait_minutes: int = Field(DEFAULT_WAIT_MINUTES, ge=1, le=7 * 24 * 60,
                              description="Minutes without a training machine, while the active placement's group "
                                          "fails to launch, before the run moves to the next placement.")
    reserve_concurrency: bool = Field(False, description="AWS home: reserve one of the account's concurrent "
                                      "executions for the controller's Lambda function (at most one tick at a time). "
                                      "Off by default: Lambda refuses a reservation that leaves the account under its "
                                      "unreserved minimum (100, or all of a new account's 10), and a tick delivered "
                                      "twice is safe without it (placement.json's conditional writes); `ops preflight` "
                                      "checks the account's room when it is on.")
    choose: Literal["cheapest", "inOrder"] = Field(
        "cheapest", description="How the run picks a placement at a restart: the least expected cost to finish "
                                "(cheapest), or the listed order (inOrder) (docs/placements.md).")
    rebalance: bool = Field(False, description="Allow a move for price while a machine trains, right after a commit, "
                                               "when the saving also covers the restart (default: a training machine "
                                               "is never stopped for price).")
    move_floor_usd: float = Field(DEFAULT_MOVE_FLOOR_USD, ge=0, le=1e6,
                                  description="A move for price must save more than this many USD of the expected "
                                              "cost to finish.")
    move_fraction: float = Field(DEFAULT_MOVE_FRACTION, ge=0, le=1,
                                 description="A move for price must save more than this share of the active "
                                             "placement's expected cost to finish (0.1: 10 %).")


class Settings(_Block):
    """The whole stack config."""

    stack: str = Field(description="The Pulumi stack name.")
    cloud: Literal["aws", "gcp"] = Field("aws", description="aws or gcp.")
    region: str = Field(description="Region of every resource.")
    project: str = Field("", description="GCP project id (GCP only).")
    scheduler: Literal["groups", "sagemaker", "vertex", "kubernetes"] = Field(
        "groups", description="Who runs the machines: groups (the stack's own spot groups), sagemaker (a SageMaker "
                              "managed-spot training job, AWS), vertex (a Vertex AI custom job, GCP) or kubernetes "
                              "(a Job on your cluster, the kubernetes block).")
    run: RunSettings
    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    image: ImageSettings = Field(default_factory=ImageSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    placements: list[PlacementSettings] = Field(
        default_factory=list, min_length=1, max_length=8,
        description="Where the run may train, home first; default: one placement, the stack's cloud and region.")
    placement: PlacementPolicySettings = Field(default_factory=PlacementPolicySettings)
    kubernetes: KubernetesSettings | None = Field(None, description="scheduler kubernetes: the cluster, its "
                                                  "namespace and spot nodes, the pod's size (components/settings/"
                                                  "kubernetes.py).")
    serve: ServeSettings = Field(default_factory=ServeSettings, description="tensorflow/serving for the COMPLETE "
                                 "run's model, deployed by `ops serve` (scheduler kubernetes).")

    @property
    def placement_list(self) -> list[PlacementSettings]:
        """Every placement, home first: `placements`, or the stack's own cloud, region and machines alone."""
        if self.placements:
            return list(self.placements)
        return [PlacementSettings(cloud=self.cloud, region=self.region,
                                  project=(self.project or None) if self.cloud == "gcp" else None,
                                  instance_types=list(self.compute.instance_types), zones=list(self.compute.zones))]

    @property
    def run_id(self) -> str:
        """The run's id: run.id, or the stack's name when it is not set."""
        return config_shared.run_id_or_stack(self.run.id, self.stack) or self.stack
