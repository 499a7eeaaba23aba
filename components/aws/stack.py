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
from components.aws.group import SpotGroup, SpotGroupArgs
from components.aws.identity import InstanceIdentity, InstanceIdentityArgs
from components.aws.image import ImageMirror, TrainerImage, TrainerImageArgs
from components.aws.naming import default_bucket_name, group_name, repository_name
from components.aws.repository import ImageRepository, ImageRepositoryArgs
from components.code import user_code_dir
from components.common import StackOutputs, TrainingStackArgs, image_refs, mirrored_image, run_uri
from components.tags import aws_tags

__all__ = ["TrainingStack", "TrainingStackArgs"]


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
        # Placement i >= 1: its region's provider; what is made there goes through it.
        regional = {i: aws.Provider(f"{name}-aws-p{i}", region=p.region, opts=pulumi.ResourceOptions(parent=self))
                    for i, p in enumerate(places) if i > 0}
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
                other_groups=[(p.region, g) for p, g in zip(places[1:], groups[1:], strict=True)],
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
        self.placement_groups: list[SpotGroup] = []
        for i, g in enumerate(groups):
            ps = placement.settings_at(s, i)
            opts = in_region[i]
            user_data = userdata.user_data_output(
                "aws", ps, group=g, run_uri=run, code_uri=code.code_uri, image_ref=images[i]
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
            controller_config = run.apply(lambda uri: placement.controller_config_json(s, uri, groups))
            self.controller = PlacementController(
                f"{name}-controller",
                PlacementControllerArgs(
                    name=asg_name,
                    config=controller_config,
                    run_id=run_id,
                    nodes=s.compute.nodes,
                    groups=[(p.region, g) for p, g in zip(places, groups, strict=True)],
                    bucket_arn=bucket.arn,
                    tags=tags,
                ),
                opts=child,
            )
        self._set_outputs(
            s, bucket_name=bucket.name, run_uri=run, image_ref=images[0], group_name=group.group_name,
            code_uri=code.code_uri, placements=controller_config,
        )
