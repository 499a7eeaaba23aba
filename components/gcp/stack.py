"""TrainingStack: one training run on GCP, composed of bucket, identity, repository,
trainer code and spot group, all in the stack's project and region through one explicit
provider. A placement in another project has its group, its machines' service account and
firewall rules there, through a provider of that project (whose APIs the stack turns on).
A placement on AWS has its Auto Scaling group, its machines' role and the controller's role in
the deployer's AWS account, and its machines reach home's bucket by workload identity
federation (`_aws_placement`).

Exports the same outputs as the AWS stack: the bucket, the run's URI, the image, the
group, the region and the command that watches the run.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from components import placement, userdata
from components.code import user_code_dir
from components.common import StackOutputs, TrainingStackArgs, image_refs, mirrored_image, run_uri
from components.gcp.bucket import TrainingBucket, TrainingBucketArgs
from components.gcp.code import TrainerCode, TrainerCodeArgs
from components.gcp.controller import APIS as CONTROLLER_APIS
from components.gcp.controller import PlacementController, PlacementControllerArgs, ProjectGroups
from components.gcp.group import SpotGroup, SpotGroupArgs
from components.gcp.identity import (
    BucketAccess,
    InstanceIdentity,
    InstanceIdentityArgs,
    PlacementIdentity,
    PlacementIdentityArgs,
)
from components.gcp.image import ImageMirror, TrainerImage, TrainerImageArgs
from components.gcp.naming import (
    APIS,
    RESOURCE_MANAGER_API,
    controller_account_ids,
    controller_build_account_id,
    custom_role_prefix,
    default_bucket_name,
    group_name,
    network_tag,
    placement_account_ids,
    placement_role_prefix,
    repository_name,
    service_account_id,
)
from components.gcp.repository import ImageRepository, ImageRepositoryArgs
from components.tags import gcp_labels

__all__ = ["TrainingStack", "TrainingStackArgs"]

# What an AWS placement's machines go through in home's project: the token exchange (STS) and the
# impersonation of their service account (IAM Credentials).
FEDERATION_APIS = ("iamcredentials.googleapis.com", "sts.googleapis.com")


class TrainingStack(StackOutputs):
    """Everything one GCP training run needs."""

    def __init__(self, name: str, args: TrainingStackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:TrainingStack", name, None, opts)
        s = args.settings
        run_id = s.run_id
        labels = gcp_labels(project=args.project, stack=s.stack, run_id=run_id)
        names = {"project": args.project, "stack": s.stack}

        # The APIs are turned on through a provider of their own; the stack's provider
        # depends on them, so every resource and lookup made through it waits for them.
        api_provider = gcp.Provider(
            f"{name}-gcp-apis", project=s.project, region=s.region, opts=pulumi.ResourceOptions(parent=self)
        )

        def api_service(api: str, after: list[pulumi.Resource], project: str = s.project,
                        through: gcp.Provider = api_provider) -> gcp.projects.Service:
            return gcp.projects.Service(
                f"{name}-api-{api.split('.')[0]}" if project == s.project else
                f"{name}-api-{project}-{api.split('.')[0]}",
                project=project,
                service=api,
                # Other workloads of the project may use these APIs: destroy leaves them on.
                disable_on_destroy=False,
                disable_dependent_services=False,
                opts=pulumi.ResourceOptions(parent=self, provider=through, depends_on=after),
            )

        def project_apis(project: str, through: gcp.Provider, extra: tuple[str, ...] = ()) -> list[pulumi.Resource]:
            first = api_service(RESOURCE_MANAGER_API, [], project, through)
            return [first] + [api_service(api, [first], project, through)
                              for api in APIS + extra if api != RESOURCE_MANAGER_API]

        places = s.placement_list
        on_aws = [i for i, p in enumerate(places) if p.cloud == "aws"]
        apis = project_apis(s.project, api_provider, FEDERATION_APIS if on_aws else ())
        resource_manager = apis[0]
        provider = gcp.Provider(
            f"{name}-gcp", project=s.project, region=s.region,
            opts=pulumi.ResourceOptions(parent=self, depends_on=apis),
        )
        # Children inherit the provider from their parent component.
        child = pulumi.ResourceOptions(parent=self, providers={"gcp": provider})

        bucket = TrainingBucket(
            f"{name}-bucket",
            TrainingBucketArgs(
                bucket_name=s.storage.bucket_name
                or default_bucket_name(project=args.project, stack=s.stack, gcp_project=s.project, region=s.region),
                location=s.region,
                keep_on_destroy=s.storage.keep_on_destroy,
                adopt=args.adopt_bucket,
                noncurrent_days=s.storage.noncurrent_days,
                labels=labels,
            ),
            opts=child,
        )
        mig_name = group_name(**names, run_id=run_id)
        # One group per placement (home first), each in its region; one service account serves those of
        # home's project, and each placement in another project has its own there (`PlacementIdentity`).
        groups = placement.group_names(s, mig_name)
        if on_aws:
            # An AWS placement's group is named as AWS names groups (the reverse of an AWS home's GCP placement).
            from components.aws.naming import group_name as aws_group_name

            asg_home = aws_group_name(**names, run_id=run_id)
            groups = [placement.group_name(asg_home, i) if i in on_aws else g for i, g in enumerate(groups)]
        # Another project's APIs, turned on once per project through a provider of that project.
        other_apis: dict[str, list[pulumi.Resource]] = {}
        for p in places[1:]:
            if p.cloud == "gcp" and p.project != s.project and p.project not in other_apis:
                other_apis[p.project] = project_apis(p.project, gcp.Provider(
                    f"{name}-gcp-apis-{p.project}", project=p.project, opts=pulumi.ResourceOptions(parent=self)))
        # Placement i >= 1 on GCP: its region's (and project's) provider; what is made there goes through it.
        # A placement on AWS is made by `_aws_placement`, through a provider of its region.
        regional = {i: gcp.Provider(f"{name}-gcp-p{i}", project=p.project, region=p.region,
                                    opts=pulumi.ResourceOptions(parent=self, depends_on=other_apis.get(p.project, apis)))
                    for i, p in enumerate(places) if i > 0 and p.cloud == "gcp"}
        in_region = {0: child, **{i: pulumi.ResourceOptions(parent=self, providers={"gcp": r})
                                  for i, r in regional.items()}}

        def image_repository(i: int) -> ImageRepository:
            return ImageRepository(
                f"{name}-images" if i == 0 else f"{name}-images-p{i}",
                ImageRepositoryArgs(
                    repository_name=repository_name(**names), location=places[i].region, gcp_project=s.project,
                    keep_images=s.image.keep_images, labels=labels,
                ),
                opts=in_region[i],
            )

        repo = image_repository(0)
        # A built image with several placements: a repository of the same settings in each placement's
        # region (of home's project), so every machine pulls from its own region.
        mirrors = {i: image_repository(i) for i in regional} if mirrored_image(s) else {}
        identity = InstanceIdentity(
            f"{name}-identity",
            InstanceIdentityArgs(
                account_id=service_account_id(**names),
                gcp_project=s.project,
                bucket_name=bucket.name,
                run_id=run_id,
                repository_id=repo.repository.repository_id,
                other_repositories=[(places[i].region, m.repository.repository_id) for i, m in mirrors.items()],
                region=s.region,
                group_name=mig_name,
                other_groups=[(p.region, g) for p, g in zip(places[1:], groups[1:], strict=True)
                              if p.cloud == "gcp" and p.project == s.project],
                custom_role_prefix=custom_role_prefix(**names),
                data_uri=s.run.data_uri,
                validation_data_uri=s.run.validation_data_uri,
                data_grant=s.run.data_grant,
                nodes=s.compute.nodes,
            ),
            opts=child,
        )
        code = TrainerCode(
            f"{name}-code", TrainerCodeArgs(bucket_name=bucket.name, baked_into_image=s.image.build,
                                        user_code_dir=user_code_dir(s)), opts=child
        )

        run = run_uri("gcp", bucket.name, run_id)
        # The machines run the pushed image by digest, each placement's from its own region's repository;
        # their user data waits for the push.
        images = image_refs(s, lambda: TrainerImage(
            f"{name}-image", TrainerImageArgs(
                repository_url=repo.url, base_image=s.image.reference, user_code_dir=user_code_dir(s),
                mirrors=[ImageMirror(repository_url=m.url, provider=regional[i]) for i, m in mirrors.items()]),
            opts=child,
        ).refs)

        # A placement in another project: its machines' account there, granted on home's bucket what home's
        # machines have (no federation: both are Google identities).
        away = {i: PlacementIdentity(
            f"{name}-identity-p{i}",
            PlacementIdentityArgs(
                account_id=placement_account_ids(**names, index=i)[0], gcp_project=p.project, region=p.region,
                group_name=groups[i], custom_role_prefix=placement_role_prefix(**names, index=i),
                bucket=BucketAccess(bucket_name=bucket.name, run_id=run_id, data_uri=s.run.data_uri,
                                    validation_data_uri=s.run.validation_data_uri, data_grant=s.run.data_grant),
            ),
            opts=in_region[i],
        ) for i, p in enumerate(places) if i > 0 and p.cloud == "gcp" and p.project != s.project}

        # Every placement runs the same pinned image and the same run folder in the home bucket.
        self.placement_groups: list[pulumi.ComponentResource] = []
        # An AWS placement's provider, by index: its group, its machines' role, and the controller's role.
        self._aws_providers: dict[int, pulumi.ProviderResource] = {}
        for i, g in enumerate(groups):
            ps = placement.settings_at(s, i)
            if ps.cloud == "aws":
                self.placement_groups.append(self._aws_placement(
                    name, args, index=i, settings=ps, group_name=g, run=run, code=code, image_ref=images[i],
                    bucket=bucket, home=child))
                continue
            opts = in_region[i]
            machines = away.get(i, identity)
            user_data = userdata.user_data_output(
                "gcp", ps, group=g, run_uri=run, code_uri=code.code_uri, boot_uri=code.boot_uri, image_ref=images[i]
            )
            c = ps.compute
            group = SpotGroup(
                f"{name}-group" if i == 0 else f"{name}-group-p{i}",
                SpotGroupArgs(
                    group_name=g,
                    gcp_project=ps.project,
                    region=ps.region,
                    instance_types=list(c.instance_types),
                    network_tag=network_tag(**names),
                    service_account_email=machines.email,
                    user_data=user_data,
                    nodes=c.nodes,
                    # Only the active placement has machines: home, until the controller moves the run.
                    size=None if i == 0 else 0,
                    # A project's rules hold for the tag in every region of it: made once, with its first group.
                    firewalls=i == min(j for j, q in enumerate(places) if q.project == ps.project),
                    gpus_per_node=c.gpus_per_node,
                    accelerator=c.accelerator,
                    spot=c.spot,
                    max_runtime_hours=c.max_runtime_hours,
                    root_disk_gb=c.root_disk_gb,
                    image_id=c.image_id,
                    zones=list(c.zones),
                    allowed_cidrs=list(s.access.allowed_cidrs),
                    ssh_public_key=s.access.ssh_public_key,
                    labels=labels,
                    # A machine that boots before its grants exist would fail its first call.
                    wait_for=list(machines.grants),
                ),
                opts=opts,
            )
            self.placement_groups.append(group)
        group = self.placement_groups[0]
        # Several placements: the controller that moves the run runs here, at home, beside the bucket.
        self.controller: PlacementController | None = None
        controller_config = None
        if len(places) > 1:
            # How the controller reaches the AWS placements: one role, named in advance (its trust needs the
            # function's account, made with the function, and the function's configuration names the role).
            reach: pulumi.Output[dict[str, str]] | None = None
            if on_aws:
                reach = self._aws_controller_reach(asg_home, mig_name)
            order = on_aws
            controller_config = pulumi.Output.all(run, reach).apply(
                lambda v: placement.controller_config_json(s, v[0], groups, {i: v[1] for i in order}))
            controller_apis = [api_service(api, [resource_manager]) for api in CONTROLLER_APIS]
            controller_sa, invoker_sa = controller_account_ids(**names)
            self.controller = PlacementController(
                f"{name}-controller",
                PlacementControllerArgs(
                    name=mig_name,
                    config=controller_config,
                    run_id=run_id,
                    nodes=s.compute.nodes,
                    groups=[(p.region, g) for p, g in zip(places, groups, strict=True)
                            if p.cloud == "gcp" and p.project == s.project],
                    other_projects=[ProjectGroups(
                        gcp_project=project,
                        groups=[(p.region, g) for p, g in zip(places, groups, strict=True) if p.project == project],
                        provider=regional[min(i for i, p in enumerate(places) if p.project == project)],
                    ) for project in other_apis],
                    gcp_project=s.project,
                    region=s.region,
                    bucket_name=bucket.name,
                    account_id=controller_sa,
                    invoker_account_id=invoker_sa,
                    build_account_id=controller_build_account_id(**names),
                    custom_role_prefix=custom_role_prefix(**names),
                    labels=labels,
                    federation=any(p.cloud == "aws" for p in places),
                ),
                opts=pulumi.ResourceOptions(parent=self, providers={"gcp": provider}, depends_on=controller_apis),
            )
            if on_aws:
                self._aws_controller_role(name, args, asg_home, mig_name, groups, self.controller.unique_id)
        self._set_outputs(
            s, bucket_name=bucket.name, run_uri=run, image_ref=images[0], group_name=group.group_name,
            code_uri=code.code_uri, placements=controller_config, gcp_project=s.project,
        )

    def _aws_provider(self, name: str, index: int, region: str) -> pulumi.ProviderResource:
        """Placement `index`'s AWS provider: its region, the deployer's AWS credentials."""
        import pulumi_aws as aws

        if index not in self._aws_providers:
            self._aws_providers[index] = aws.Provider(f"{name}-aws-p{index}", region=region,
                                                      opts=pulumi.ResourceOptions(parent=self))
        return self._aws_providers[index]

    def _aws_placement(self, name: str, args: TrainingStackArgs, *, index: int, settings, group_name: str,
                       run: pulumi.Output[str], code: TrainerCode, image_ref: pulumi.Input[str],
                       bucket: TrainingBucket, home: pulumi.ResourceOptions) -> pulumi.ComponentResource:
        """Placement `index` on AWS: its group in its region, its machines' role (their own group's size, nothing
        in S3), and in home's project the pool that trusts that role and the service account it impersonates for
        home's bucket (`MachineAccess`). `home`: the options of what is made in home's project."""
        import pulumi_aws as aws

        from components.aws.group import SpotGroup as AwsGroup
        from components.aws.group import SpotGroupArgs as AwsGroupArgs
        from components.aws.identity import InstanceIdentity as RoleIdentity
        from components.aws.identity import InstanceIdentityArgs as RoleIdentityArgs
        from components.gcp.federation import MachineAccess, MachineAccessArgs
        from components.tags import aws_tags

        s, p = args.settings, settings
        names = {"project": args.project, "stack": s.stack}
        c = p.compute
        provider = self._aws_provider(name, index, p.region)
        in_region = pulumi.ResourceOptions(parent=self, providers={"aws": provider})
        invoke = pulumi.InvokeOptions(parent=self, provider=provider)
        tags = aws_tags(**names, run_id=s.run_id)
        # The public image only (a built one is refused across clouds): no ECR grant; the run folder is in GCS.
        identity = RoleIdentity(
            f"{name}-identity-p{index}",
            RoleIdentityArgs(bucket_arn=None, run_id=s.run_id, repository_arn=None, group_name=group_name,
                             region=p.region, nodes=c.nodes, tags=tags),
            opts=in_region,
        )
        access = MachineAccess(
            f"{name}-machine-access-p{index}",
            MachineAccessArgs(
                gcp_project=s.project, account_id=placement_account_ids(**names, index=index)[0],
                pool_stem=network_tag(**names),
                bucket=BucketAccess(bucket_name=bucket.name, run_id=s.run_id, data_uri=s.run.data_uri,
                                    validation_data_uri=s.run.validation_data_uri, data_grant=s.run.data_grant),
                aws_account_id=aws.get_caller_identity_output(opts=invoke).account_id,
                aws_partition=aws.get_partition_output(opts=invoke).partition,
                machine_role_name=identity.role.name,
            ),
            opts=home,
        )
        user_data = userdata.user_data_output(
            "aws", p, group=group_name, run_uri=run, code_uri=code.code_uri, boot_uri=code.boot_uri, image_ref=image_ref,
            store=userdata.gcs_store_env(audience=access.audience, service_account=access.email),
        )
        return AwsGroup(
            f"{name}-group-p{index}",
            AwsGroupArgs(
                group_name=group_name, instance_types=list(c.instance_types), nodes=c.nodes, size=0, spot=c.spot,
                # Refused on a GCP home: the spot price, capped at on-demand, as EC2 sets it without one.
                max_price_per_hour=None, max_runtime_hours=c.max_runtime_hours, root_disk_gb=c.root_disk_gb,
                image_id=None, subnets=[], zones=list(c.zones), allowed_cidrs=list(s.access.allowed_cidrs),
                ssh_public_key=s.access.ssh_public_key, instance_profile_arn=identity.profile_arn,
                user_data=user_data, tags=tags,
                # A machine that boots before its role's policy, its pool and its grants on home's bucket
                # exist would fail its first call.
                wait_for=[identity.policy, access.provider, *access.grants],
            ),
            opts=in_region,
        )

    def _aws_controller_reach(self, asg_home: str, home_group: str) -> pulumi.Output[dict[str, str]]:
        """The controller's `access` to the AWS placements: the role `_aws_controller_role` makes (by its
        name, in the first AWS placement's account) and the audience its trust names."""
        import pulumi_aws as aws

        from components.aws.federation import controller_audience, controller_role_name

        provider = next(iter(self._aws_providers.values()))
        invoke = pulumi.InvokeOptions(parent=self, provider=provider)
        arn = pulumi.Output.concat("arn:", aws.get_partition_output(opts=invoke).partition, ":iam::",
                                   aws.get_caller_identity_output(opts=invoke).account_id, ":role/",
                                   controller_role_name(asg_home))
        return arn.apply(lambda a: {"aws_role_arn": a, "audience": controller_audience(home_group)})

    def _aws_controller_role(self, name: str, args: TrainingStackArgs, asg_home: str, home_group: str,
                             groups: list[str], unique_id: pulumi.Output[str]) -> None:
        """The role home's controller function (its account's `unique_id`) assumes with its Google identity to read
        and size the AWS groups. Its trust names the function's account, made with the function, so the function
        may tick before the role exists: such a tick cannot reach the AWS groups, and the next one starts again."""
        from components.aws.federation import (
            ControllerRole,
            ControllerRoleArgs,
            controller_audience,
            controller_role_name,
        )
        from components.tags import aws_tags

        s = args.settings
        ControllerRole(
            f"{name}-controller-aws",
            ControllerRoleArgs(
                role_name=controller_role_name(asg_home), service_account_unique_id=unique_id,
                audience=controller_audience(home_group),
                groups=[(p.region, g) for p, g in zip(s.placement_list, groups, strict=True) if p.cloud == "aws"],
                nodes=s.compute.nodes, tags=aws_tags(project=args.project, stack=s.stack, run_id=s.run_id),
            ),
            opts=pulumi.ResourceOptions(parent=self, providers={"aws": next(iter(self._aws_providers.values()))}),
        )
