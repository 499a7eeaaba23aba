"""TrainingStack: one training run on AWS, composed of bucket, identity, repository,
trainer code and spot group, all in the stack's region through one explicit provider.

Exports what an operator needs: the bucket, the run's URI, the image, the group, the
region and the command that watches the run.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components import placement, userdata
from components.aws.bucket import TrainingBucket, TrainingBucketArgs
from components.aws.code import TrainerCode, TrainerCodeArgs
from components.aws.controller import PlacementController, PlacementControllerArgs
from components.aws.controller import role_name as controller_role_name
from components.aws.group import SpotGroup, SpotGroupArgs
from components.aws.identity import InstanceIdentity, InstanceIdentityArgs
from components.aws.image import ImageMirror, TrainerImage, TrainerImageArgs
from components.aws.naming import default_bucket_name, group_name, repository_name
from components.aws.repository import ImageRepository, ImageRepositoryArgs
from components.code import user_code_dir
from components.common import StackOutputs, TrainingStackArgs, image_refs, mirrored_image, run_uri
from components.gcp.naming import group_name as gcp_group_name
from components.tags import aws_tags

__all__ = ["TrainingStack", "TrainingStackArgs"]

# A GCP placement's project: the APIs its resources live in (after the Resource Manager API, through which
# the others are turned on), and STS and IAM Credentials, which the controller's federation goes through.
GCP_RESOURCE_MANAGER_API = "cloudresourcemanager.googleapis.com"
GCP_PLACEMENT_APIS = ("cloudscheduler.googleapis.com", "compute.googleapis.com", "iam.googleapis.com",
                      "iamcredentials.googleapis.com", "sts.googleapis.com")


class TrainingStack(StackOutputs):
    """Everything one AWS training run needs."""

    def __init__(self, name: str, args: TrainingStackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:TrainingStack", name, None, opts)
        s = args.settings
        run_id = s.run_id
        tags = aws_tags(project=args.project, stack=s.stack, run_id=run_id)

        provider = aws.Provider(f"{name}-aws", region=s.region, opts=pulumi.ResourceOptions(parent=self))
        # Children inherit the provider from their parent component.
        child = pulumi.ResourceOptions(parent=self, providers={"aws": provider})
        # What a GCP placement makes on AWS (its machines' role, the lookups) goes through home's provider too.
        self._home_aws = provider
        invoke = pulumi.InvokeOptions(provider=provider, parent=self)

        if s.storage.bucket_name:
            bucket_name: pulumi.Input[str] = s.storage.bucket_name
        elif args.adopt_bucket:
            # Importing needs the name as the program runs: ask for the account now.
            account = aws.get_caller_identity(opts=invoke).account_id
            bucket_name = default_bucket_name(project=args.project, stack=s.stack, account_id=account, region=s.region)
        else:
            account_id = aws.get_caller_identity_output(opts=invoke).account_id
            bucket_name = account_id.apply(
                lambda acct: default_bucket_name(project=args.project, stack=s.stack, account_id=acct, region=s.region)
            )
        bucket = TrainingBucket(
            f"{name}-bucket",
            TrainingBucketArgs(
                bucket_name=bucket_name,
                keep_on_destroy=s.storage.keep_on_destroy,
                adopt=args.adopt_bucket,
                noncurrent_days=s.storage.noncurrent_days,
                tags=tags,
            ),
            opts=child,
        )
        asg_name = group_name(project=args.project, stack=s.stack, run_id=run_id)
        # One group per placement (home first), each in its region; one role serves them all (IAM is global).
        places = s.placement_list
        groups = placement.group_names(s, asg_name)
        if any(p.cloud == "gcp" for p in places):
            # A GCP placement's group is named as GCE names groups (63 characters at most, RFC 1035).
            gce_home = gcp_group_name(project=args.project, stack=s.stack, run_id=run_id)
            groups = [placement.group_name(gce_home, i) if p.cloud == "gcp" else g
                      for i, (p, g) in enumerate(zip(places, groups, strict=True))]
        # Placement i >= 1 on AWS: its region's provider; what is made there goes through it. A placement on
        # GCP is made by `_gcp_placement`, in its own project.
        regional = {i: aws.Provider(f"{name}-aws-p{i}", region=p.region, opts=pulumi.ResourceOptions(parent=self))
                    for i, p in enumerate(places) if i > 0 and p.cloud == "aws"}
        in_region = {0: child, **{i: pulumi.ResourceOptions(parent=self, providers={"aws": r})
                                  for i, r in regional.items()}}
        repo_args = ImageRepositoryArgs(
            repository_name=repository_name(project=args.project, stack=s.stack),
            keep_images=s.image.keep_images,
            tags=tags,
        )
        repo = ImageRepository(f"{name}-images", repo_args, opts=child)
        # A built image with several placements: a repository of the same settings in each placement's
        # region, so every machine pulls from its own region (ECR repositories are regional).
        mirrors = {i: ImageRepository(f"{name}-images-p{i}", repo_args, opts=in_region[i])
                   for i in regional} if mirrored_image(s) else {}
        identity = InstanceIdentity(
            f"{name}-identity",
            InstanceIdentityArgs(
                bucket_arn=bucket.arn,
                run_id=run_id,
                repository_arn=repo.arn,
                other_repository_arns=[m.arn for m in mirrors.values()],
                group_name=asg_name,
                region=s.region,
                other_groups=[(p.region, g) for p, g in zip(places[1:], groups[1:], strict=True) if p.cloud == "aws"],
                data_uri=s.run.data_uri,
                validation_data_uri=s.run.validation_data_uri,
                nodes=s.compute.nodes,
                tags=tags,
            ),
            opts=child,
        )
        code = TrainerCode(
            f"{name}-code",
            TrainerCodeArgs(bucket_name=bucket.name, baked_into_image=s.image.build, tags=tags,
                            user_code_dir=user_code_dir(s)),
            opts=child,
        )

        run = run_uri("aws", bucket.name, run_id)
        # The machines run the pushed image by digest, each placement's from its own region's repository;
        # their user data waits for the push.
        images = image_refs(s, lambda: TrainerImage(
            f"{name}-image",
            TrainerImageArgs(repository_url=repo.url, registry_id=repo.registry_id, base_image=s.image.reference,
                             user_code_dir=user_code_dir(s),
                             mirrors=[ImageMirror(repository_url=m.url, registry_id=m.registry_id, provider=regional[i])
                                      for i, m in mirrors.items()]),
            opts=child,
        ).refs)

        # Every placement runs the same pinned image and the same run folder in the home bucket.
        self.placement_groups: list[pulumi.ComponentResource] = []
        # A GCP placement's project: its APIs, turned on once per project (`_gcp_apis`).
        self._gcp_apis_made: dict[str, list[pulumi.Resource]] = {}
        # How the controller reaches each placement on GCP (controller_config's `access`), by index.
        access: dict[int, pulumi.Output[dict[str, str]]] = {}
        for i, g in enumerate(groups):
            ps = placement.settings_at(s, i)
            if ps.cloud == "gcp":
                gcp_group, access[i] = self._gcp_placement(
                    name, args, index=i, settings=ps, group_name=g, home_group=asg_name, run=run, code=code,
                    image_ref=images[i], bucket=bucket, tags=tags, firewalls=i == min(
                        j for j, p in enumerate(places) if p.cloud == "gcp" and p.project == ps.project))
                self.placement_groups.append(gcp_group)
                continue
            opts = in_region[i]
            user_data = userdata.user_data_output(
                "aws", ps, group=g, run_uri=run, code_uri=code.code_uri, boot_uri=code.boot_uri, image_ref=images[i]
            )
            c = ps.compute
            group = SpotGroup(
                f"{name}-group" if i == 0 else f"{name}-group-p{i}",
                SpotGroupArgs(
                    group_name=g,
                    instance_types=list(c.instance_types),
                    nodes=c.nodes,
                    # Only the active placement has machines: home, until the controller moves the run.
                    size=None if i == 0 else 0,
                    spot=c.spot,
                    max_price_per_hour=c.max_price_per_hour,
                    max_runtime_hours=c.max_runtime_hours,
                    root_disk_gb=c.root_disk_gb,
                    image_id=c.image_id,
                    subnets=list(c.subnets),
                    zones=list(c.zones),
                    allowed_cidrs=list(s.access.allowed_cidrs),
                    ssh_public_key=s.access.ssh_public_key,
                    instance_profile_arn=identity.profile_arn,
                    user_data=user_data,
                    tags=tags,
                    # A machine that boots before its policy is attached would fail its
                    # first S3 call.
                    wait_for=[identity.policy],
                ),
                opts=opts,
            )
            self.placement_groups.append(group)
        group = self.placement_groups[0]
        # Several placements: the controller that moves the run runs here, at home, beside the bucket.
        self.controller: PlacementController | None = None
        controller_config = None
        if len(places) > 1:
            order = sorted(access)
            controller_config = pulumi.Output.all(run, *(access[i] for i in order)).apply(
                lambda v: placement.controller_config_json(s, v[0], groups, dict(zip(order, v[1:], strict=True))))
            self.controller = PlacementController(
                f"{name}-controller",
                PlacementControllerArgs(
                    name=asg_name,
                    config=controller_config,
                    run_id=run_id,
                    nodes=s.compute.nodes,
                    # Its AWS grants reach the AWS groups; a GCP placement's group, through `access`.
                    groups=[(p.region, g) for p, g in zip(places, groups, strict=True) if p.cloud == "aws"],
                    bucket_arn=bucket.arn,
                    tags=tags,
                    federation=bool(access),
                    named_role=bool(access),
                ),
                opts=child,
            )
        self._set_outputs(
            s, bucket_name=bucket.name, run_uri=run, image_ref=images[0], group_name=group.group_name,
            code_uri=code.code_uri, placements=controller_config,
        )

    def _gcp_placement(self, name: str, args: TrainingStackArgs, *, index: int, settings, group_name: str,
                       home_group: str, run: pulumi.Output[str], code: TrainerCode, image_ref: pulumi.Input[str],
                       bucket: TrainingBucket, tags: dict[str, str], firewalls: bool,
                       ) -> tuple[pulumi.ComponentResource, pulumi.Output[dict[str, str]]]:
        """Placement `index` on GCP: its group in its project, its machines' service account and the AWS role
        that account's ID tokens assume for the home bucket, and the home controller's reach into the group.
        Returns the group and the controller's `access` to it."""
        import pulumi_gcp as gcp

        from components.aws.federation import FederatedRole, FederatedRoleArgs, audience
        from components.gcp import naming as gcp_naming
        from components.gcp.federation import ControllerAccess, ControllerAccessArgs
        from components.gcp.group import SpotGroup as GceGroup
        from components.gcp.group import SpotGroupArgs as GceGroupArgs
        from components.gcp.identity import PlacementIdentity, PlacementIdentityArgs
        from components.tags import gcp_labels

        s, p = args.settings, settings
        names = {"project": args.project, "stack": s.stack}
        apis = self._gcp_apis(name, p.project)
        provider = gcp.Provider(f"{name}-gcp-p{index}", project=p.project, region=p.region,
                                opts=pulumi.ResourceOptions(parent=self, depends_on=apis))
        in_project = pulumi.ResourceOptions(parent=self, providers={"gcp": provider})
        machine_sa, controller_sa = gcp_naming.placement_account_ids(**names, index=index)
        prefix = gcp_naming.placement_role_prefix(**names, index=index)
        identity = PlacementIdentity(
            f"{name}-identity-p{index}",
            PlacementIdentityArgs(account_id=machine_sa, gcp_project=p.project, region=p.region,
                                  group_name=group_name, custom_role_prefix=prefix),
            opts=in_project,
        )
        token_audience = audience(group_name)
        role = FederatedRole(
            f"{name}-federation-p{index}",
            FederatedRoleArgs(bucket_arn=bucket.arn, run_id=s.run_id, service_account_unique_id=identity.unique_id,
                              audience=token_audience, data_uri=s.run.data_uri,
                              validation_data_uri=s.run.validation_data_uri, tags=tags),
            opts=pulumi.ResourceOptions(parent=self, providers={"aws": self._home_aws}),
        )
        user_data = userdata.user_data_output(
            "gcp", p, group=group_name, run_uri=run, code_uri=code.code_uri, boot_uri=code.boot_uri, image_ref=image_ref,
            store=userdata.aws_store_env(region=s.region, role_arn=role.role_arn, audience=token_audience),
        )
        c = p.compute
        if c.spot and c.max_price_per_hour is not None:
            pulumi.log.warn(placement.max_price_warning(index, p.region, c.max_price_per_hour), resource=self)
        group = GceGroup(
            f"{name}-group-p{index}",
            GceGroupArgs(
                group_name=group_name, gcp_project=p.project, region=p.region, instance_types=list(c.instance_types),
                network_tag=gcp_naming.network_tag(**names), service_account_email=identity.email,
                user_data=user_data, nodes=c.nodes, size=0, firewalls=firewalls, gpus_per_node=c.gpus_per_node,
                accelerator=c.accelerator, spot=c.spot, max_runtime_hours=c.max_runtime_hours,
                root_disk_gb=c.root_disk_gb, image_id=None, zones=list(c.zones),
                allowed_cidrs=list(s.access.allowed_cidrs), ssh_public_key=s.access.ssh_public_key,
                labels=gcp_labels(project=args.project, stack=s.stack, run_id=s.run_id),
                # A machine that boots before its grants and its AWS role exist would fail its first call.
                wait_for=[*identity.grants, role.policy],
            ),
            opts=in_project,
        )
        invoke = pulumi.InvokeOptions(parent=self, provider=self._home_aws)
        reach = ControllerAccess(
            f"{name}-controller-access-p{index}",
            ControllerAccessArgs(
                gcp_project=p.project, region=p.region, group_name=group_name, account_id=controller_sa,
                pool_stem=gcp_naming.network_tag(**names), custom_role_prefix=prefix,
                aws_account_id=aws.get_caller_identity_output(opts=invoke).account_id,
                aws_partition=aws.get_partition_output(opts=invoke).partition,
                controller_role_name=controller_role_name(home_group),
            ),
            opts=in_project,
        )
        return group, pulumi.Output.all(reach.audience, reach.email).apply(
            lambda v: {"gcp_audience": v[0], "service_account": v[1]})

    def _gcp_apis(self, name: str, project: str) -> list[pulumi.Resource]:
        """The APIs a GCP placement's project needs on (once per project): its group and runtime cap, its
        service accounts and custom roles, and the token exchange the controller's federation goes through."""
        import pulumi_gcp as gcp

        made = self._gcp_apis_made
        if project in made:
            return made[project]
        provider = gcp.Provider(f"{name}-gcp-apis-{project}", project=project,
                                opts=pulumi.ResourceOptions(parent=self))
        opts = pulumi.ResourceOptions(parent=self, provider=provider)

        def service(api: str, after: list[pulumi.Resource]) -> gcp.projects.Service:
            return gcp.projects.Service(
                f"{name}-api-{project}-{api.split('.')[0]}", project=project, service=api,
                # Other workloads of the project may use these APIs: destroy leaves them on.
                disable_on_destroy=False, disable_dependent_services=False,
                opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=after)),
            )

        first = service(GCP_RESOURCE_MANAGER_API, [])
        made[project] = [first] + [service(api, [first]) for api in GCP_PLACEMENT_APIS]
        return made[project]
