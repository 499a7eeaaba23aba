"""What the AWS and GCP stacks share, defined once: the stack's Args, its outputs and
their exported names, the run's URI, the image the machines run, the worker ports and
the name slugs.

`components.aws` and `components.gcp` export the same names (TrainingStack,
TrainingBucket, InstanceIdentity, ImageRepository, TrainerCode, SpotGroup and their
Args); `tests/components/test_cloud_mirror.py` keeps them equal. What differs for real
(IAM roles vs service accounts, tags vs labels, spot flags) stays inside each cloud's
package. The run folder's names come from `runfolder/layout.py`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pulumi

from components.project import PLACEMENTS_OUTPUT
from components.settings import Settings
from runfolder import layout

# The stack outputs, by their exported (camelCase) names, in export order.
EXPORT_KEYS = ("bucketName", "runUri", "imageRef", "groupName", "region", "watchCommand", "codeUri")
# A stack of several placements also exports the placement controller's configuration (JSON).
# `scheduler: sagemaker`: what `ops start` submits (JSON, schedulers.sagemaker.JobSpec's fields).
SAGEMAKER_JOB_OUTPUT = "sagemakerJob"
# `scheduler: vertex`: what `ops start` submits (JSON, schedulers.vertex.JobSpec's fields).
VERTEX_JOB_OUTPUT = "vertexJob"
PROJECT_EXPORT = "project"  # GCP only: the project the stack lives in, for the operator's gcloud

# The URI scheme of each cloud's object store.
SCHEMES = {"aws": "s3", "gcp": "gs"}


def slug(text: str, limit: int) -> str:
    """Lowercase letters, digits and single '-' only, at most `limit` characters."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:limit].rstrip("-") or "x"


def short_digest(*parts: str, n: int) -> str:
    """The first `n` hex digits of the sha256 of `parts` joined by '/': a stable name suffix."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:n]


def run_uri(cloud: str, bucket: pulumi.Input[str], run_id: str) -> pulumi.Output[str]:
    """`s3://BUCKET/runs/ID` or `gs://BUCKET/runs/ID`: the run's folder (no trailing '/')."""
    return pulumi.Output.concat(f"{SCHEMES[cloud]}://", bucket, "/", layout.run_prefix(run_id).rstrip("/"))


def watch_command(stack: str) -> str:
    """The command an operator runs to follow the stack's run."""
    return f"python -m ops status --stack {stack}"


def image_refs(settings: Settings, build: Callable[[], list[pulumi.Output[str]]]) -> list[pulumi.Output[str]]:
    """The image each placement's machines run, home first: the pushed image by digest in the
    placement's own region's repository (`build()`, called only when the stack builds its own),
    else the configured pinned reference everywhere."""
    if settings.image.build:
        refs = build()
        if len(refs) != len(settings.placement_list):
            raise ValueError(f"{len(refs)} pushed image references for {len(settings.placement_list)} placements")
        return refs
    return [pulumi.Output.from_input(settings.image.reference)] * len(settings.placement_list)


def mirrored_image(settings: Settings) -> bool:
    """Whether the built image is pushed to a repository in each placement's region as well as home's:
    `image.build` with several placements (a one-placement stack has its one repository, as always)."""
    return settings.image.build and len(settings.placement_list) > 1


def first_launch_by_controller(settings: Settings) -> bool:
    """Whether the placement controller's first tick launches the run (`choose: cheapest` with several
    placements): every group is created at 0 and the first tick sizes the one its decision table picks."""
    return len(settings.placement_list) > 1 and settings.placement.choose == "cheapest"


def group_size(settings: Settings, index: int) -> int | None:
    """The size placement `index`'s group is created with: None (`nodes`) for home, 0 for the others; 0 for
    home too when the controller's first tick launches the run (`first_launch_by_controller`). Pulumi ignores
    the size after creation, so a later `pulumi up` never resets one the controller (or a machine) set."""
    return None if index == 0 and not first_launch_by_controller(settings) else 0


# Days before a bucket aborts a multipart upload that never finished (S3 and GCS lifecycle
# rules): a checkpoint upload takes minutes, and one cut off by preemption bills its parts
# until aborted.
ABORT_UPLOAD_DAYS = 1


def adopted_bucket(bucket_name: pulumi.Input[str], adopt: bool) -> str | None:
    """The import id of a kept bucket to adopt (its name), or None to create the bucket.

    `pulumi destroy` keeps the bucket (keepOnDestroy) but forgets it; the next `pulumi up`
    would try to create it again and fail (409: the name is taken, by you). Adopting
    imports the existing bucket into the stack instead. Once adopted, the import id
    equals the bucket's id, so later `up`s treat it as any other resource.
    """
    if not adopt:
        return None
    if not isinstance(bucket_name, str):
        raise TypeError("adopting a bucket needs its name before the program runs; resolve it first")
    return bucket_name


def kept_bucket(parent: pulumi.Resource, bucket_name: pulumi.Input[str], *, keep_on_destroy: bool,
                adopt: bool) -> pulumi.ResourceOptions:
    """The options of a stack's bucket resource: retained by `pulumi destroy` when `keep_on_destroy` (Pulumi
    forgets it instead of deleting it: the checkpoints are the run's value), and imported instead of created
    when `adopt` (`adopted_bucket`)."""
    return pulumi.ResourceOptions(parent=parent, retain_on_delete=keep_on_destroy,
                                  import_=adopted_bucket(bucket_name, adopt))


@dataclass(kw_only=True)
class Home:
    """What a home stack has made that a placement on the other cloud builds on (`OtherCloud`)."""

    parent: pulumi.ComponentResource
    """The home stack: the parent of everything its placements make."""
    name: str
    """The home stack's resource name (the stem of its children's names)."""
    args: TrainingStackArgs
    """The home stack's Args."""
    provider: pulumi.ProviderResource
    """Home's provider (its cloud, region and project)."""
    bucket: Any
    """Home's TrainingBucket."""
    run: pulumi.Output[str]
    """The run folder's URI, in home's bucket."""
    code: Any
    """Home's TrainerCode (its `code_uri` and `boot_uri`)."""
    images: list[pulumi.Input[str]]
    """The image reference of each placement, home first."""
    image_public_key: pulumi.Output[str] | None = None
    """The public key (base64 DER) that signed the built image, which every machine verifies it with; None when
    the stack signs nothing (a public or pinned image)."""


class OtherCloud(Protocol):
    """The placements of a stack on the other cloud than home, built one floor up (components/multicloud/)."""

    def placement(self, home: Home, index: int) -> tuple[pulumi.ComponentResource, pulumi.Output | None]:
        """Placement `index`'s group, and how the controller reaches it (None: through `controller_access`)."""

    def controller_access(self, home: Home) -> dict[int, pulumi.Output]:
        """How home's controller reaches each placement on the other cloud, by index (its config's `access`)."""

    def after_controller(self, home: Home, controller: Any) -> None:
        """What the other cloud needs of home's controller once it exists."""


@dataclass(kw_only=True)
class ControllerRun:
    """What a placement controller is told of its run, the same on both clouds (`Placements.controller_run`)."""

    name: str
    """The function's (and its schedule's) name, fixed in advance: the stack's groups' name stem."""
    config: pulumi.Input[str]
    """The controller's configuration, JSON (TRAINSTACK_PLACEMENTS)."""
    run_id: str
    """The run's folder: the function reads runs/<run_id>/ and writes only its placement record there."""
    nodes: int
    """Machines of the run: the most the function sets a group to."""
    tick_minutes: int = 1
    """Minutes between ticks."""
    decision: str | None = None
    """The price decision's inputs (components/placement.py's ``decision_json``), shipped as a file in the
    function's code package (``DECISION_FILE``); None: none shipped, the controller keeps the listed order."""


@dataclass(kw_only=True)
class Placements:
    """A stack's placements as the layer one floor up (components/multicloud/) computed them, home first."""

    groups: list[str]
    """Every placement's group name."""
    settings: list[Settings]
    """The stack's settings moved to each placement (index 0: the stack's own)."""
    config: Callable[[str, Mapping[int, Mapping[str, str]]], str] | None = None
    """The controller's configuration (JSON) from the run's URI and the `access` to the other cloud's placements."""
    other_cloud: OtherCloud | None = None
    """Builds the placements on the other cloud than home; None when every placement is on home's."""
    decision: str | None = None
    """The controller's price decision inputs (components/placement.py's ``decision_json``), None without a
    controller."""

    def controller_config(self, run: pulumi.Output[str], access: Mapping[int, pulumi.Output]) -> pulumi.Output[str]:
        """The controller's configuration once the run's URI and every `access` (by placement index) are known."""
        if self.config is None:
            raise ValueError("a stack of one placement has no controller to configure")
        order = sorted(access)
        return pulumi.Output.all(run, *(access[i] for i in order)).apply(
            lambda v: self.config(v[0], dict(zip(order, v[1:], strict=True))))

    def controller_run(self, settings: Settings, name: str, run: pulumi.Output[str],
                       access: Mapping[int, pulumi.Output]) -> ControllerRun:
        """What home's controller `name` is told of the run whose folder is `run` (see `controller_config`)."""
        return ControllerRun(name=name, config=self.controller_config(run, access), run_id=settings.run_id,
                             nodes=settings.compute.nodes, decision=self.decision)

    @classmethod
    def alone(cls, settings: Settings, group: str) -> Placements:
        """Home as the only placement: a stack of one placement needs nothing from the layer above."""
        if len(settings.placement_list) > 1:
            raise ValueError(f"trainstack:placements lists {len(settings.placement_list)} placements: build the stack "
                             "with components.multicloud.training_stack, which names and builds every placement")
        return cls(groups=[group], settings=[settings])


@dataclass(kw_only=True)
class TrainingStackArgs:
    """Inputs of a TrainingStack (either cloud)."""

    settings: Settings
    """The stack's validated configuration."""
    project: str = "trainstack"
    """The Pulumi project name (part of generated names, tags and labels)."""
    adopt_bucket: bool = False
    """Import the stack's existing bucket (kept by an earlier `pulumi destroy`) instead of creating it."""
    placements: Placements | None = field(default=None)
    """Every placement's group, settings and the other cloud's builder (components/multicloud/); None: home only."""


class StackOutputs(pulumi.ComponentResource):
    """The outputs every cloud's TrainingStack declares and exports, in one place."""

    bucket_name: pulumi.Output[str]
    run_uri: pulumi.Output[str]
    image_ref: pulumi.Output[str]
    group_name: pulumi.Output[str]
    region: pulumi.Output[str]
    watch_command: pulumi.Output[str]
    code_uri: pulumi.Output[str]

    def _set_outputs(
        self,
        settings: Settings,
        *,
        bucket_name: pulumi.Output[str],
        run_uri: pulumi.Output[str],
        image_ref: pulumi.Output[str],
        group_name: pulumi.Output[str],
        code_uri: pulumi.Output[str],
        placements: pulumi.Output[str] | None = None,
        gcp_project: str | None = None,
    ) -> None:
        """Assign the outputs and register them (the last step of a stack's constructor).
        `placements` (several placements only): the controller's configuration, which `ops move
        --stack` and `ops status --stack` read the groups from. `gcp_project` (GCP): exported as
        `project`, so `ops` asks gcloud about the stack's project, not the one gcloud is set to."""
        self.placements = placements
        self.bucket_name = bucket_name
        self.run_uri = run_uri
        self.image_ref = image_ref
        self.group_name = group_name
        self.code_uri = code_uri
        self.region = pulumi.Output.from_input(settings.region)
        self.watch_command = pulumi.Output.from_input(watch_command(settings.stack))
        self.gcp_project = pulumi.Output.from_input(gcp_project) if gcp_project else None
        self.register_outputs(self.exports())

    def exports(self) -> dict[str, pulumi.Output]:
        """The stack outputs, by their exported (camelCase) names."""
        values = (self.bucket_name, self.run_uri, self.image_ref, self.group_name, self.region,
                  self.watch_command, self.code_uri)
        out = dict(zip(EXPORT_KEYS, values, strict=True))
        for attribute, key in (("sagemaker_job", SAGEMAKER_JOB_OUTPUT), ("vertex_job", VERTEX_JOB_OUTPUT)):
            job = getattr(self, attribute, None)
            if job is not None:
                out[key] = job
        if self.placements is not None:
            out[PLACEMENTS_OUTPUT] = self.placements
        if self.gcp_project is not None:
            out[PROJECT_EXPORT] = self.gcp_project
        return out
