"""PlacementController: the serverless controller that moves a run between placements, on GCP.

A Cloud Scheduler job calls a Cloud Functions (2nd gen) function every `tick_minutes` with an
OIDC token; the function runs one tick of the controller (`controller/handler.py:handler`,
configured by the `TRAINSTACK_PLACEMENTS` variable: controller/config.py) and scales to zero
between calls. The function runs as its own service account, with exactly what a tick needs: read
this run's folder, write only the placement record and the controller's events there, and read and
resize this stack's groups only (a placement's group in another project through a role and a grant
made in that project). The scheduler calls it as an invoker account that may do nothing else. The function is built as an account of its own
(`build_grants`) into a Docker repository of the stack's own (`build_repository`), once those grants have had time
to propagate (components/propagation.py). A tick may be delivered twice (Cloud Scheduler after a transport error,
Cloud Run briefly over `max_instance_count`): placement.json's conditional writes keep that safe. The deployer needs
`iam.serviceAccounts.actAs` on the three accounts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random

from components import function_package, project
from components.common import ControllerRun
from components.gcp.identity import groups_condition, prefix_condition
from components.gcp.naming import custom_role_id
from components.propagation import IamPropagation
from controller.config import ENV_VAR
from runfolder import layout

# The function's package: components/function_package.py's FUNCTION_PACKAGES, and the two files Cloud
# Functions' Python build wants at the root (main.py names the entry point).
ENTRY_POINT = "handler"
MAIN_PY = ('"""Cloud Functions\' entry point: one tick of the placement controller."""\n\n'
           "from controller.handler import handler\n\n__all__ = [\"handler\"]\n")
RUNTIME = "python312"
# The one library a tick needs beyond the runtime: the trainer's own GCS client, at its pin.
REQUIREMENTS = (project.TRAINER_DIR / "requirements.txt").read_text().splitlines()
GCS_REQUIREMENT = next(line for line in REQUIREMENTS if line.startswith("google-cloud-storage=="))
TIMEOUT_S = 60
MEMORY = "256Mi"
# What a tick does on the managed groups: read them (their errors and instances) and resize them.
GROUP_PERMISSIONS = ["compute.instanceGroupManagers.get", "compute.instanceGroupManagers.list",
                     "compute.instanceGroupManagers.update"]
# The only objects the controller writes, relative to the run folder: the record and its events; the run's deadline when no machine has written it yet, and TIMED_OUT when
# the deadline passed with no machine to end the run, CANCELLED when a stop no trainer heeds was asked
# (controller/tick.py); the price cache, and a folder of decision
# tables (controller/prices.py, controller/table.py).
WRITES = (layout.PLACEMENT_KEY, layout.PLACEMENT_EVENTS_KEY, layout.DEADLINE_KEY, layout.TIMED_OUT, layout.CANCELLED,
          layout.PRICES_KEY)
WRITE_PREFIXES = (layout.DECISIONS_PREFIX,)
# What building the function needs, as its own account (Google's "custom service account for Cloud Build" page
# for Cloud Run functions: Logs Writer, Artifact Registry Writer, and storage for the source), each on the
# narrowest resource that takes a grant. Build logs are written project-wide. The image goes to a repository of
# the stack's own (`docker_repository`: BUILD_REPOSITORY_SUFFIX, in the function's region, as Cloud Functions
# requires), granted on that repository alone: without it Cloud Functions pushes to `gcf-artifacts` (a
# repository it creates and the stack does not own), and Cloud Run's source deployments to
# `cloud-run-source-deploy`, neither of which this build uses. The source is read from its one object in home's
# bucket (`storage_source`) and from the copy Cloud Functions stages of it before the build
# (BUILD_SOURCES_BUCKET_PREFIX-NUMBER-REGION, a Google-managed bucket of the project, named in a condition as
# Google's page does). The `gcf-v2-uploads-*` bucket holds uploads from GenerateUploadUrl (gcloud's own
# deploys) and `run-sources-*` Cloud Run's source deployments: neither is read here. Nothing may be deleted or
# written in the run's bucket: Storage Object Admin, which the page also names for Container Registry's
# images, is not needed where the image goes to Artifact Registry.
BUILD_REPOSITORY_SUFFIX = "-controller"
# Images the build repository keeps: each deploy pushes one; the running revision's and the one before it.
BUILD_KEEP_IMAGES = 2
BUILD_SOURCES_BUCKET_PREFIX = "gcf-v2-sources-"
BUILD_LOG_ROLE = "roles/logging.logWriter"
BUILD_IMAGE_ROLE = "roles/artifactregistry.writer"
BUILD_SOURCE_ROLE = "roles/storage.objectViewer"
SOURCE_OBJECT = f"{layout.CODE_PREFIX}controller.zip"
# APIs the function needs on top of the stack's own (turned on only for a stack of several placements); the Cloud
# Billing API answers the Spot prices of the GCP placements (controller/prices.py: the Catalog, no IAM role).
APIS = ("cloudfunctions.googleapis.com", "cloudbuild.googleapis.com", "run.googleapis.com",
        "cloudbilling.googleapis.com")


@dataclass(kw_only=True)
class ProjectGroups:
    """A stack's groups in another project than home's, and the provider that makes resources there."""

    gcp_project: str
    """The project."""
    groups: list[tuple[str, str]]
    """(region, name) of each of the stack's groups in it."""
    provider: pulumi.ProviderResource
    """A provider of that project."""


@dataclass(kw_only=True)
class PlacementControllerArgs:
    """Inputs of a PlacementController."""

    run: ControllerRun
    """The function's (and job's) name, configuration, run folder, machines and tick (the same on both clouds).
    Its `nodes` is the controller's own rule here: GCE IAM conditions cannot read a resize's size."""
    groups: list[tuple[str, str]]
    """(region, name) of every placement's group in home's project, home first."""
    other_projects: list[ProjectGroups] = field(default_factory=list)
    """The placements' groups in other projects than home's, by project: the function reads and resizes
    them too."""
    gcp_project: str
    """The home project."""
    region: str
    """The home region: the function and the job run here."""
    bucket_name: pulumi.Input[str]
    """The home bucket."""
    account_id: str
    """The function's service account id (6-30 characters)."""
    invoker_account_id: str
    """The scheduler's invoker service account id."""
    build_account_id: str
    """The id of the service account the function is built as (6-30 characters)."""
    custom_role_prefix: str
    """Prefix of the custom role's id (the stack's)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels for the function."""
    federation: bool = False
    """Whether a placement is on the other cloud (AWS), reached by federation: the function then needs boto3."""


def written_condition(bucket: pulumi.Input[str], run_id: str) -> pulumi.Output[str]:
    """CEL: exactly the objects the controller writes in the run folder, and those in its folders of them."""
    run_prefix = layout.run_prefix(run_id)
    parts: list[pulumi.Input[str]] = []
    for i, key in enumerate(WRITES):
        parts += [" || " if i else "", 'resource.name == "projects/_/buckets/', bucket, f'/objects/{run_prefix}{key}"']
    for prefix in WRITE_PREFIXES:
        parts += [' || resource.name.startsWith("projects/_/buckets/', bucket, f'/objects/{run_prefix}{prefix}")']
    return pulumi.Output.concat(*parts)


def requirements(*, federation: bool) -> list[str]:
    """The function's requirements.txt lines: the GCS client and the libraries a tick imports, at the
    trainer's pins; with `federation` (a placement on AWS), boto3 too."""
    names = function_package.GCP_FUNCTION_LIBRARIES + (function_package.AWS_LIBRARIES if federation else ())
    return [GCS_REQUIREMENT, *function_package.library_pins(names)]


def function_source(*, federation: bool = False, decision: str | None = None) -> pulumi.AssetArchive:
    """The function's source: main.py, requirements.txt (`requirements`), the .py files of the controller
    and the trainer, and the price decision's inputs (`decision`, at `function_package.DECISION_FILE`)."""
    files = function_package.function_files(project.ROOT)
    if function_package.HANDLER_FILE not in files:
        pulumi.log.warn(f"{function_package.HANDLER_FILE} is not in {project.ROOT}: the placement controller's function "
                        "would have no handler")
    assets: dict[str, pulumi.Asset | pulumi.Archive] = {
        "main.py": pulumi.StringAsset(MAIN_PY), "requirements.txt": pulumi.StringAsset("\n".join(requirements(federation=federation)) + "\n")}
    assets.update({name: pulumi.FileAsset(str(path)) for name, path in files.items()})
    if decision is not None:
        assets[function_package.DECISION_FILE] = pulumi.StringAsset(decision)
    return pulumi.AssetArchive(assets)


def build_repository_id(name: str) -> str:
    """The build repository's id: the function's own name (Artifact Registry takes 63 characters, a letter first)."""
    return f"{name[:52]}{BUILD_REPOSITORY_SUFFIX}"


def build_repository(name: str, *, repository_id: str, region: str, labels: dict[str, str],
                     child: pulumi.ResourceOptions) -> gcp.artifactregistry.Repository:
    """The Docker repository the function's image is pushed to: the stack's own, deleted with it, keeping
    BUILD_KEEP_IMAGES. Tags stay mutable: each build of Cloud Functions moves the function's `latest` tag."""
    return gcp.artifactregistry.Repository(
        f"{name}-build-repo",
        repository_id=repository_id,
        location=region,
        format="DOCKER",
        description="trainstack: the placement controller's function images",
        # INHERITED or DISABLED are the only values (as for the trainer's repository).
        vulnerability_scanning_config=gcp.artifactregistry.RepositoryVulnerabilityScanningConfigArgs(
            enablement_config="INHERITED"),
        cleanup_policy_dry_run=False,
        cleanup_policies=[
            gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                id="keep-newest", action="KEEP",
                most_recent_versions=gcp.artifactregistry.RepositoryCleanupPolicyMostRecentVersionsArgs(
                    keep_count=BUILD_KEEP_IMAGES)),
            gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                id="delete-older", action="DELETE",
                condition=gcp.artifactregistry.RepositoryCleanupPolicyConditionArgs(tag_state="ANY")),
        ],
        labels=labels,
        opts=child,
    )


def docker_repository(repository: gcp.artifactregistry.Repository, *, gcp_project: str,
                      region: str) -> pulumi.Output[str]:
    """`projects/P/locations/R/repositories/ID`: the form Cloud Functions' `docker_repository` takes (its own
    project and region: it refuses a repository elsewhere)."""
    return pulumi.Output.concat("projects/", gcp_project, "/locations/", region, "/repositories/",
                                repository.repository_id)


def build_grants(name: str, builder: gcp.serviceaccount.Account, *, repository: gcp.artifactregistry.Repository,
                 bucket_name: pulumi.Input[str], gcp_project: str, region: str,
                 child: pulumi.ResourceOptions) -> list[pulumi.CustomResource]:
    """What the function's build account may do, and nothing else (BUILD_*: logs, its image, its source)."""
    member = pulumi.Output.concat("serviceAccount:", builder.email)
    return [
        gcp.projects.IAMMember(f"{name}-build-logs", project=gcp_project, role=BUILD_LOG_ROLE, member=member,
                               opts=child),
        gcp.artifactregistry.RepositoryIamMember(
            f"{name}-build-image", project=gcp_project, location=region, repository=repository.repository_id,
            role=BUILD_IMAGE_ROLE, member=member, opts=child),
        gcp.storage.BucketIAMMember(
            f"{name}-build-source", bucket=bucket_name, role=BUILD_SOURCE_ROLE, member=member,
            condition=gcp.storage.BucketIAMMemberConditionArgs(
                title="the function's source", expression=pulumi.Output.concat(
                    'resource.name == "projects/_/buckets/', bucket_name, f'/objects/{SOURCE_OBJECT}"')),
            opts=child),
        gcp.projects.IAMMember(
            f"{name}-build-staged-source", project=gcp_project, role=BUILD_SOURCE_ROLE, member=member,
            condition=gcp.projects.IAMMemberConditionArgs(
                title="Cloud Functions' staged sources",
                expression=f'resource.name.startsWith("projects/_/buckets/{BUILD_SOURCES_BUCKET_PREFIX}")'),
            opts=child),
    ]


class PlacementController(pulumi.ComponentResource):
    """A schedule that runs the placement controller's tick as a Cloud Function."""

    function: gcp.cloudfunctionsv2.Function
    job: gcp.cloudscheduler.Job
    build_wait: IamPropagation
    """The wait between the build account's grants and the function (IAM_PROPAGATION_S)."""
    function_name: pulumi.Output[str]
    unique_id: pulumi.Output[str]
    """The function's service account's unique id: what an AWS placement's role trusts (its ID tokens' `sub`)."""

    def __init__(self, name: str, args: PlacementControllerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:PlacementController", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        fn_name = f"{args.run.name[:52]}-controller"
        account = gcp.serviceaccount.Account(
            f"{name}-sa", account_id=args.account_id, display_name="trainstack placement controller",
            description="one run's folder and placement record, this stack's groups", opts=child,
        )
        member = pulumi.Output.concat("serviceAccount:", account.email)
        grants = self._grants(name, args, member)
        source = gcp.storage.BucketObject(
            f"{name}-source", bucket=args.bucket_name, name=SOURCE_OBJECT,
            source=function_source(federation=args.federation, decision=args.run.decision), opts=child,
        )
        # Without its own account the build runs as the Compute Engine default account, which new
        # organisations leave without roles (and older projects leave with Editor).
        builder = gcp.serviceaccount.Account(
            f"{name}-build", account_id=args.build_account_id, display_name="trainstack controller build",
            description="builds the placement controller's function: its source, its image, its build logs",
            opts=child,
        )
        repository = build_repository(name, repository_id=build_repository_id(args.run.name), region=args.region,
                                      labels=args.labels, child=child)
        built_by = build_grants(name, builder, repository=repository, bucket_name=args.bucket_name,
                                gcp_project=args.gcp_project, region=args.region, child=child)
        # A build with the account's grants minutes old may be refused: the function waits for them to
        # propagate (components/propagation.py).
        self.build_wait = IamPropagation(f"{name}-build-wait", grants=built_by, opts=child)
        self.function = gcp.cloudfunctionsv2.Function(
            f"{name}-function",
            name=fn_name,
            location=args.region,
            description="trainstack: moves the run to another placement when its own cannot launch",
            build_config=gcp.cloudfunctionsv2.FunctionBuildConfigArgs(
                runtime=RUNTIME,
                entry_point=ENTRY_POINT,
                service_account=builder.name,
                docker_repository=docker_repository(repository, gcp_project=args.gcp_project, region=args.region),
                source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceArgs(
                    storage_source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceStorageSourceArgs(
                        bucket=args.bucket_name, object=source.name, generation=source.generation),
                ),
            ),
            service_config=gcp.cloudfunctionsv2.FunctionServiceConfigArgs(
                service_account_email=account.email,
                environment_variables={ENV_VAR: args.run.config},
                timeout_seconds=TIMEOUT_S,
                available_memory=MEMORY,
                min_instance_count=0,
                max_instance_count=1,
                # Reached by the scheduler over HTTPS with an OIDC token: only the invoker may call it.
                ingress_settings="ALLOW_ALL",
                all_traffic_on_latest_revision=True,
            ),
            labels=args.labels,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*grants, self.build_wait]),
        )
        self._schedule(name, args, fn_name)
        self.function_name = self.function.name
        self.unique_id = account.unique_id
        self.register_outputs({"function_name": self.function_name, "unique_id": self.unique_id})

    def _grants(self, name: str, args: PlacementControllerArgs, member: pulumi.Output[str]) -> list[pulumi.Resource]:
        """The function's account's grants: this run's folder, the placement record, the stack's groups in each
        of their projects."""
        child = pulumi.ResourceOptions(parent=self)
        grants: list[pulumi.Resource] = [
            gcp.storage.BucketIAMMember(
                f"{name}-run-read", bucket=args.bucket_name, role="roles/storage.objectViewer", member=member,
                condition=gcp.storage.BucketIAMMemberConditionArgs(
                    title="this run's folder", expression=prefix_condition(args.bucket_name,
                                                                           layout.run_prefix(args.run.run_id))),
                opts=child,
            ),
            # Replacing an object in GCS needs delete as well as create: objectUser, on the two objects only.
            gcp.storage.BucketIAMMember(
                f"{name}-placement-write", bucket=args.bucket_name, role="roles/storage.objectUser", member=member,
                condition=gcp.storage.BucketIAMMemberConditionArgs(
                    title="the placement record", expression=written_condition(args.bucket_name, args.run.run_id)),
                opts=child,
            ),
        ]
        suffix = random.RandomId(f"{name}-role-suffix", byte_length=4, opts=child)

        def groups_grant(tail: str, gcp_project: str, groups: list[tuple[str, str]],
                         opts: pulumi.ResourceOptions) -> gcp.projects.IAMMember:
            # A custom role belongs to one project and a project's grant names that project's groups only:
            # one role and one grant in each project that has a group of the stack.
            role = gcp.projects.IAMCustomRole(
                f"{name}-groups-role{tail}",
                project=gcp_project,
                role_id=suffix.hex.apply(lambda h: custom_role_id(args.custom_role_prefix, h, "ctl")),
                title="trainstack: read and resize the placements' groups",
                permissions=GROUP_PERMISSIONS,
                opts=opts,
            )
            return gcp.projects.IAMMember(
                f"{name}-groups{tail}", project=gcp_project, role=role.name, member=member,
                condition=gcp.projects.IAMMemberConditionArgs(
                    title="this stack's groups", expression=groups_condition(gcp_project, groups)),
                opts=opts,
            )

        grants.append(groups_grant("", args.gcp_project, args.groups, child))
        grants += [groups_grant(f"-{other.gcp_project}", other.gcp_project, other.groups,
                                pulumi.ResourceOptions(parent=self, provider=other.provider))
                   for other in args.other_projects]
        return grants

    def _schedule(self, name: str, args: PlacementControllerArgs, fn_name: str) -> None:
        """The Cloud Scheduler job that calls the function every `tick_minutes`, as an account of its own."""
        child = pulumi.ResourceOptions(parent=self)
        invoker = gcp.serviceaccount.Account(
            f"{name}-invoker", account_id=args.invoker_account_id, display_name="trainstack controller schedule",
            description="calls the placement controller's function, nothing else", opts=child,
        )
        invoke_grant = gcp.cloudrunv2.ServiceIamMember(
            f"{name}-invoke", project=args.gcp_project, location=args.region,
            name=self.function.service_config.apply(lambda c: c.service if c else None),
            role="roles/run.invoker", member=pulumi.Output.concat("serviceAccount:", invoker.email), opts=child,
        )
        uri = self.function.service_config.apply(lambda c: c.uri if c else None)
        self.job = gcp.cloudscheduler.Job(
            f"{name}-schedule",
            name=fn_name,
            region=args.region,
            description="trainstack: one placement controller tick",
            schedule=f"*/{args.run.tick_minutes} * * * *",
            time_zone="Etc/UTC",
            # A failed tick is not retried: the next one starts again from the run folder.
            retry_config=gcp.cloudscheduler.JobRetryConfigArgs(retry_count=0),
            attempt_deadline=f"{TIMEOUT_S + 30}s",
            http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                http_method="POST", uri=uri,
                oidc_token=gcp.cloudscheduler.JobHttpTargetOidcTokenArgs(
                    service_account_email=invoker.email, audience=uri),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[invoke_grant]),
        )
