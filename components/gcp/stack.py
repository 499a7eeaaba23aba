"""TrainingStack: one training run on GCP, composed of bucket, identity, repository,
trainer code and spot group, all in the stack's project and region through one explicit
provider. A placement in another project has its group, its machines' service account and
firewall rules there, through a provider of that project (whose APIs the stack turns on).
A placement on AWS is built one floor up (components/multicloud/, through
`TrainingStackArgs.placements`); this stack turns on the token exchange it goes through.
With `scheduler: vertex`, bucket, repository, image, the aiplatform API and the job's identity only
(components/gcp/job.py): Vertex AI runs the machines.

Exports the same outputs as the AWS stack: the bucket, the run's URI, the image, the
group, the region and the command that watches the run.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from components import userdata
from components.code import user_code_dir
from components.common import (
    Home,
    Placements,
    StackOutputs,
    TrainingStackArgs,
    group_size,
    image_refs,
    mirrored_image,
    run_uri,
)
from components.gcp.bucket import TrainingBucket, TrainingBucketArgs
from components.gcp.code import TrainerCode, TrainerCodeArgs
from components.gcp.controller import APIS as CONTROLLER_APIS
from components.gcp.controller import PlacementController, PlacementControllerArgs, ProjectGroups
from components.gcp.group import SpotGroup, spot_group_args
from components.gcp.identity import (
    BucketAccess,
    InstanceIdentity,
    InstanceIdentityArgs,
    PlacementIdentity,
    PlacementIdentityArgs,
)
from components.gcp.image import ImageMirror, TrainerImage, TrainerImageArgs
from components.gcp.job import API as VERTEX_API
from components.gcp.job import JobIdentity, JobIdentityArgs, job_spec
from components.gcp.naming import (
    APIS,
    RESOURCE_MANAGER_API,
    controller_account_ids,
    controller_build_account_id,
    custom_role_prefix,
    default_bucket_name,
    group_name,
    key_ring_prefix,
    network_tag,
    placement_account_ids,
    placement_role_prefix,
    repository_name,
    service_account_id,
)
from components.gcp.repository import ImageRepository, ImageRepositoryArgs
from components.gcp.signing_key import SigningKey, SigningKeyArgs
from components.settings import Settings
from components.tags import gcp_labels
from schedulers import sagemaker

__all__ = ["TrainingStack", "TrainingStackArgs"]

# What an AWS placement's machines go through in home's project: the token exchange (STS) and the
# impersonation of their service account (IAM Credentials).
FEDERATION_APIS = ("iamcredentials.googleapis.com", "sts.googleapis.com")
# With image.build: Artifact Registry scans pushed images only with the Container Scanning API on (billed per
# image), and the findings gate reads the scan's occurrences through the Container Analysis API
# (components/scan_gate.py): without them no scan ever starts, and the gate blocks every build after its wait.
SCAN_APIS = ("containerscanning.googleapis.com", "containeranalysis.googleapis.com")
SCHEDULER_API = "cloudscheduler.googleapis.com"
# With image.build: the key that signs the image lives in Cloud KMS (components/gcp/signing_key.py).
SIGNING_APIS = ("cloudkms.googleapis.com",)


def project_apis(parent: pulumi.Resource, stem: str, project: str, provider: gcp.Provider, apis: tuple[str, ...],
                 after: list[pulumi.Resource] | None = None) -> list[pulumi.Resource]:
    """Turn `apis` on in `project` through `provider`, each named `<stem>-<api's first word>`: the first (the
    Resource Manager API, through which the others are turned on) before the rest, or with `after` all of
    them after those."""

    def service(api: str, deps: list[pulumi.Resource]) -> gcp.projects.Service:
        return gcp.projects.Service(
            f"{stem}-{api.split('.')[0]}",
            project=project,
            service=api,
            # Other workloads of the project may use these APIs: destroy leaves them on.
            disable_on_destroy=False,
            disable_dependent_services=False,
            opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=deps),
        )

    if after is not None:
        return [service(api, after) for api in apis]
    first = service(apis[0], [])
    return [first] + [service(api, [first]) for api in apis[1:]]


class TrainingStack(StackOutputs):
    """Everything one GCP training run needs."""

    def __init__(self, name: str, args: TrainingStackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:TrainingStack", name, None, opts)
        s = args.settings
        self._stem, self._args = name, args
        self._names = {"project": args.project, "stack": s.stack}
        self._labels = gcp_labels(**self._names, run_id=s.run_id)
        self._group = group_name(**self._names, run_id=s.run_id)
        self._places = args.placements or Placements.alone(s, self._group)

        self._make_providers()
        bucket = TrainingBucket(
            f"{name}-bucket",
            TrainingBucketArgs(
                bucket_name=s.storage.bucket_name
                or default_bucket_name(**self._names, gcp_project=s.project, region=s.region),
                location=s.region,
                keep_on_destroy=s.storage.keep_on_destroy,
                adopt=args.adopt_bucket,
                noncurrent_days=s.storage.noncurrent_days,
                labels=self._labels,
            ),
            opts=self._at_home,
        )
        repo = self._repository(0)
        if s.scheduler == "vertex":
            self._job(bucket, repo)
            return
        # A built image with several placements: a repository of the same settings in each placement's
        # region (of home's project), so every machine pulls from its own region.
        mirrors = {i: self._repository(i) for i in self._regional} if mirrored_image(s) else {}
        identities = self._identities(bucket, repo, mirrors)
        code = TrainerCode(
            f"{name}-code", TrainerCodeArgs(bucket_name=bucket.name, baked_into_image=s.image.build,
                                            user_code_dir=user_code_dir(s)), opts=self._at_home
        )
        run = run_uri("gcp", bucket.name, s.run_id)
        images = self._images(repo, mirrors)
        home = Home(parent=self, name=name, args=args, provider=self._home_provider, bucket=bucket, run=run, code=code,
                    images=images, image_public_key=self._image_public_key)
        # Every placement runs the same pinned image and the same run folder in the home bucket.
        self.placement_groups = self._groups(home, identities)
        controller_config = self._controller(home)
        self._set_outputs(
            s, bucket_name=bucket.name, run_uri=run, image_ref=home.images[0],
            group_name=self.placement_groups[0].group_name, code_uri=code.code_uri, placements=controller_config,
            gcp_project=s.project,
        )

    def _job(self, bucket: TrainingBucket, repo: ImageRepository) -> None:
        """`scheduler: vertex`: the job's identity and what `ops start` submits; no group, no controller (Vertex AI
        runs and releases the machines, and the job's scheduling.timeout is the runtime cap)."""
        s, args = self._args.settings, self._args
        self.placement_groups, self.controller = [], None
        # The room names a run's Vertex AI jobs as SageMaker's: `<prefix>--<n>`, labelled with the prefix.
        prefix = sagemaker.job_prefix(project=args.project, stack=s.stack, run_id=s.run_id)
        identity = JobIdentity(
            f"{self._stem}-job-identity",
            JobIdentityArgs(account_id=service_account_id(**self._names), gcp_project=s.project, region=s.region,
                            repository_id=repo.repository.repository_id, bucket=bucket_access(s, bucket.name),
                            depends_on=self._vertex_api),
            opts=self._at_home,
        )
        run = run_uri("gcp", bucket.name, s.run_id)
        image = self._images(repo, {})[0]
        self.vertex_job = job_spec(s, run_uri=run, image=image, service_account=identity.email, job_prefix=prefix)
        self._set_outputs(s, bucket_name=bucket.name, run_uri=run, image_ref=image,
                          group_name=pulumi.Output.from_input(""), code_uri=pulumi.Output.from_input(""),
                          gcp_project=s.project)

    def _make_providers(self) -> None:
        """Home's provider, after its project's APIs, and one for each GCP placement's region (and project, whose
        APIs are turned on once per project). A placement on AWS is made one floor up (components/multicloud/)."""
        s, name = self._args.settings, self._stem
        places = s.placement_list
        # The APIs are turned on through a provider of their own; the stack's provider
        # depends on them, so every resource and lookup made through it waits for them.
        api_provider = gcp.Provider(
            f"{name}-gcp-apis", project=s.project, region=s.region, opts=pulumi.ResourceOptions(parent=self)
        )
        self._api_provider = api_provider
        federation = FEDERATION_APIS if any(p.cloud == "aws" for p in places) else ()
        scanning = SCAN_APIS + SIGNING_APIS if s.image.build else ()
        vertex = (VERTEX_API,) if s.scheduler == "vertex" else ()
        # A Vertex AI stack has no runtime-cap schedule (the job's timeout is the cap): no Cloud Scheduler.
        own = tuple(a for a in APIS if not (vertex and a == SCHEDULER_API))
        names = (RESOURCE_MANAGER_API, *(a for a in own + federation + scanning + vertex if a != RESOURCE_MANAGER_API))
        apis = project_apis(self, f"{name}-api", s.project, api_provider, names)
        self._resource_manager = apis[0]
        # The job's identity grants to Vertex AI's agents, which exist once its API is on.
        self._vertex_api = [r for api, r in zip(names, apis, strict=True) if api == VERTEX_API]
        self._home_provider = gcp.Provider(
            f"{name}-gcp", project=s.project, region=s.region,
            opts=pulumi.ResourceOptions(parent=self, depends_on=apis),
        )
        # Children inherit the provider from their parent component.
        self._at_home = pulumi.ResourceOptions(parent=self, providers={"gcp": self._home_provider})
        # Another project's APIs, turned on once per project through a provider of that project.
        self._other_apis: dict[str, list[pulumi.Resource]] = {}
        for p in places[1:]:
            if p.cloud == "gcp" and p.project != s.project and p.project not in self._other_apis:
                self._other_apis[p.project] = project_apis(self, f"{name}-api-{p.project}", p.project, gcp.Provider(
                    f"{name}-gcp-apis-{p.project}", project=p.project, opts=pulumi.ResourceOptions(parent=self)),
                    (RESOURCE_MANAGER_API, *(a for a in APIS if a != RESOURCE_MANAGER_API)))
        self._regional = {i: gcp.Provider(
            f"{name}-gcp-p{i}", project=p.project, region=p.region,
            opts=pulumi.ResourceOptions(parent=self, depends_on=self._other_apis.get(p.project, apis)))
            for i, p in enumerate(places) if i > 0 and p.cloud == "gcp"}
        self._in_region = {0: self._at_home, **{i: pulumi.ResourceOptions(parent=self, providers={"gcp": r})
                                              for i, r in self._regional.items()}}

    def _repository(self, i: int) -> ImageRepository:
        """The image repository in placement `i`'s region, of home's project."""
        s = self._args.settings
        return ImageRepository(
            f"{self._stem}-images" if i == 0 else f"{self._stem}-images-p{i}",
            ImageRepositoryArgs(
                repository_name=repository_name(**self._names), location=s.placement_list[i].region,
                gcp_project=s.project, keep_images=s.image.keep_images, labels=self._labels,
            ),
            opts=self._in_region[i],
        )

    def _identities(self, bucket: TrainingBucket, repo: ImageRepository, mirrors: dict[int, ImageRepository],
                    ) -> dict[int, InstanceIdentity | PlacementIdentity]:
        """The machines' service account of each GCP placement: one for those of home's project, and one in each
        placement's own project elsewhere, granted on home's bucket what home's machines have (no federation:
        both are Google identities)."""
        s, names, groups = self._args.settings, self._names, self._places.groups
        places = s.placement_list
        identity = InstanceIdentity(
            f"{self._stem}-identity",
            InstanceIdentityArgs(
                account_id=service_account_id(**names),
                gcp_project=s.project,
                bucket_name=bucket.name,
                run_id=s.run_id,
                repository_id=repo.repository.repository_id,
                other_repositories=[(places[i].region, m.repository.repository_id) for i, m in mirrors.items()],
                region=s.region,
                group_name=self._group,
                other_groups=[(p.region, g) for p, g in zip(places[1:], groups[1:], strict=True)
                              if p.cloud == "gcp" and p.project == s.project],
                custom_role_prefix=custom_role_prefix(**names),
                data_uri=s.run.data_uri,
                validation_data_uri=s.run.validation_data_uri,
                data_grant=s.run.data_grant,
                nodes=s.compute.nodes,
            ),
            opts=self._at_home,
        )
        away = {i: PlacementIdentity(
            f"{self._stem}-identity-p{i}",
            PlacementIdentityArgs(
                account_id=placement_account_ids(**names, index=i)[0], gcp_project=p.project, region=p.region,
                group_name=groups[i], custom_role_prefix=placement_role_prefix(**names, index=i),
                bucket=bucket_access(s, bucket.name),
            ),
            opts=self._in_region[i],
        ) for i, p in enumerate(places) if i > 0 and p.cloud == "gcp" and p.project != s.project}
        return {i: away.get(i, identity) for i, p in enumerate(places) if p.cloud == "gcp"}

    def _images(self, repo: ImageRepository, mirrors: dict[int, ImageRepository]) -> list[pulumi.Output[str]]:
        """The image each placement's machines run, by digest, from its own region's repository; their user
        data waits for the push."""
        s = self._args.settings
        self._image_public_key: pulumi.Output[str] | None = None

        def build() -> list[pulumi.Output[str]]:
            # Home's Cloud KMS key signs the digest in every repository (the mirrors are in home's project).
            key = SigningKey(f"{self._stem}-signing", SigningKeyArgs(
                gcp_project=s.project, region=s.region, name_prefix=key_ring_prefix(**self._names), labels=self._labels),
                opts=self._at_home)
            image = TrainerImage(
                f"{self._stem}-image", TrainerImageArgs(
                    repository_url=repo.url, base_image=s.image.reference, user_code_dir=user_code_dir(s), gate=s.image,
                    signing_key=key,
                    mirrors=[ImageMirror(repository_url=m.url, provider=self._regional[i]) for i, m in mirrors.items()]),
                opts=self._at_home,
            )
            self._image_public_key = image.public_key
            return image.refs
        return image_refs(s, build)

    def _groups(self, home: Home, identities: dict[int, InstanceIdentity | PlacementIdentity],
                ) -> list[pulumi.ComponentResource]:
        """Every placement's group, home first (the other cloud's through the layer above)."""
        places = self._args.settings.placement_list
        groups: list[pulumi.ComponentResource] = []
        for i, (g, ps) in enumerate(zip(self._places.groups, self._places.settings, strict=True)):
            if ps.cloud != "gcp":
                groups.append(self._places.other_cloud.placement(home, i)[0])
                continue
            machines = identities[i]
            user_data = userdata.user_data_output("gcp", ps, group=g, run_uri=home.run, code_uri=home.code.code_uri,
                                                  boot_uri=home.code.boot_uri, image_ref=home.images[i],
                                                  image_public_key=home.image_public_key)
            groups.append(SpotGroup(
                f"{self._stem}-group" if i == 0 else f"{self._stem}-group-p{i}",
                # Only the active placement has machines: home, until the controller moves the run; with `choose:
                # cheapest`, none until the controller's first tick launches it (group_size). A project's
                # firewall rules hold for the tag in every region of it: made once, with its first group. A
                # machine that boots before its grants exist would fail its first call.
                spot_group_args(ps, group_name=g, size=group_size(self._args.settings, i),
                                firewalls=i == min(j for j, q in enumerate(places) if q.project == ps.project),
                                network_tag=network_tag(**self._names), service_account_email=machines.email,
                                user_data=user_data, labels=self._labels, wait_for=list(machines.grants)),
                opts=self._in_region[i],
            ))
        return groups

    def _controller(self, home: Home) -> pulumi.Output[str] | None:
        """Several placements: the controller that moves the run, here at home beside the bucket. Returns its
        configuration (None with one placement)."""
        s, names, groups = self._args.settings, self._names, self._places.groups
        places = s.placement_list
        self.controller: PlacementController | None = None
        if len(places) == 1:
            return None
        other = self._places.other_cloud
        access = other.controller_access(home) if other else {}
        run = self._places.controller_run(s, self._group, home.run, access)
        controller_apis = project_apis(self, f"{self._stem}-api", s.project, self._api_provider, CONTROLLER_APIS,
                                       after=[self._resource_manager])
        controller_sa, invoker_sa = controller_account_ids(**names)
        self.controller = PlacementController(
            f"{self._stem}-controller",
            PlacementControllerArgs(
                run=run,
                groups=[(p.region, g) for p, g in zip(places, groups, strict=True)
                        if p.cloud == "gcp" and p.project == s.project],
                other_projects=[ProjectGroups(
                    gcp_project=project,
                    groups=[(p.region, g) for p, g in zip(places, groups, strict=True) if p.project == project],
                    provider=self._regional[min(i for i, p in enumerate(places) if p.project == project)],
                ) for project in self._other_apis],
                gcp_project=s.project,
                region=s.region,
                bucket_name=home.bucket.name,
                account_id=controller_sa,
                invoker_account_id=invoker_sa,
                build_account_id=controller_build_account_id(**names),
                custom_role_prefix=custom_role_prefix(**names),
                labels=self._labels,
                federation=any(p.cloud == "aws" for p in places),
            ),
            opts=pulumi.ResourceOptions(parent=self, providers={"gcp": self._home_provider}, depends_on=controller_apis),
        )
        if other:
            other.after_controller(home, self.controller)
        return run.config


def bucket_access(settings: Settings, bucket_name: pulumi.Input[str]) -> BucketAccess:
    """What another project's (or cloud's) machines are granted on home's bucket: what home's machines have."""
    r = settings.run
    return BucketAccess(bucket_name=bucket_name, run_id=settings.run_id, data_uri=r.data_uri,
                        validation_data_uri=r.validation_data_uri, data_grant=r.data_grant)
