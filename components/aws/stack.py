"""TrainingStack: one training run on AWS, composed of bucket, identity, repository,
trainer code and spot group, all in the stack's region through one explicit provider.
With `scheduler: sagemaker`, bucket, repository, image and the job's role only (components/aws/job.py):
SageMaker runs the machines.
A placement in another AWS region has its group there; a placement on GCP is built one floor
up (components/multicloud/, through `TrainingStackArgs.placements`).

Exports what an operator needs: the bucket, the run's URI, the image, the group, the
region and the command that watches the run.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components import userdata
from components.aws.bucket import TrainingBucket, TrainingBucketArgs
from components.aws.code import TrainerCode, TrainerCodeArgs
from components.aws.controller import PlacementController, PlacementControllerArgs
from components.aws.group import SpotGroup, spot_group_args
from components.aws.identity import InstanceIdentity, InstanceIdentityArgs
from components.aws.image import ImageMirror, TrainerImage, TrainerImageArgs
from components.aws.job import JobIdentity, JobIdentityArgs, job_spec
from components.aws.naming import default_bucket_name, group_name, repository_name
from components.aws.repository import ImageRepository, ImageRepositoryArgs
from components.aws.signing_key import SigningKey, SigningKeyArgs
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
from components.tags import aws_tags
from schedulers import sagemaker

__all__ = ["TrainingStack", "TrainingStackArgs"]


class TrainingStack(StackOutputs):
    """Everything one AWS training run needs."""

    def __init__(self, name: str, args: TrainingStackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:TrainingStack", name, None, opts)
        s = args.settings
        self._stem, self._args = name, args
        self._tags = aws_tags(project=args.project, stack=s.stack, run_id=s.run_id)
        self._group = group_name(project=args.project, stack=s.stack, run_id=s.run_id)
        self._places = args.placements or Placements.alone(s, self._group)

        self._home_provider = aws.Provider(f"{name}-aws", region=s.region, opts=pulumi.ResourceOptions(parent=self))
        # Children inherit the provider from their parent component.
        self._at_home = pulumi.ResourceOptions(parent=self, providers={"aws": self._home_provider})
        # Placement i >= 1 on AWS: its region's provider; what is made there goes through it. A placement on
        # the other cloud is made one floor up (components/multicloud/).
        self._regional = {i: aws.Provider(f"{name}-aws-p{i}", region=p.region, opts=pulumi.ResourceOptions(parent=self))
                          for i, p in enumerate(s.placement_list) if i > 0 and p.cloud == "aws"}
        self._in_region = {0: self._at_home, **{i: pulumi.ResourceOptions(parent=self, providers={"aws": r})
                                              for i, r in self._regional.items()}}

        bucket = self._bucket()
        repo, mirrors = self._repositories()
        if s.scheduler == "sagemaker":
            self._job(bucket, repo)
            return
        identity = self._identity(bucket, repo, mirrors)
        code = TrainerCode(
            f"{name}-code",
            TrainerCodeArgs(bucket_name=bucket.name, baked_into_image=s.image.build, tags=self._tags,
                            user_code_dir=user_code_dir(s)),
            opts=self._at_home,
        )
        run = run_uri("aws", bucket.name, s.run_id)
        images = self._images(repo, mirrors)
        home = Home(parent=self, name=name, args=args, provider=self._home_provider, bucket=bucket, run=run, code=code,
                    images=images, image_public_key=self._image_public_key)
        # Every placement runs the same pinned image and the same run folder in the home bucket.
        self.placement_groups, access = self._groups(home, identity)
        controller_config = self._controller(home, access)
        self._set_outputs(
            s, bucket_name=bucket.name, run_uri=run, image_ref=home.images[0],
            group_name=self.placement_groups[0].group_name, code_uri=code.code_uri, placements=controller_config,
        )

    def _job(self, bucket: TrainingBucket, repo: ImageRepository) -> None:
        """`scheduler: sagemaker`: the job's role and what `ops start` submits; no group, no controller (SageMaker
        runs and releases the machines, and its StoppingCondition is the runtime cap)."""
        s, args = self._args.settings, self._args
        self.placement_groups, self.controller = [], None
        prefix = sagemaker.job_prefix(project=args.project, stack=s.stack, run_id=s.run_id)
        identity = JobIdentity(
            f"{self._stem}-job-identity",
            JobIdentityArgs(bucket_arn=bucket.arn, run_id=s.run_id, repository_arn=repo.arn, job_prefix=prefix,
                            region=s.region, data_uri=s.run.data_uri, validation_data_uri=s.run.validation_data_uri,
                            tags=self._tags),
            opts=self._at_home,
        )
        run = run_uri("aws", bucket.name, s.run_id)
        image = self._images(repo, {})[0]
        self.sagemaker_job = job_spec(s, run_uri=run, image=image, role_arn=identity.role_arn, job_prefix=prefix)
        self._set_outputs(s, bucket_name=bucket.name, run_uri=run, image_ref=image,
                          group_name=pulumi.Output.from_input(""), code_uri=pulumi.Output.from_input(""))

    def _bucket(self) -> TrainingBucket:
        """The run's bucket: the configured name, or the stack's default in the deployer's account."""
        s, args = self._args.settings, self._args
        invoke = pulumi.InvokeOptions(provider=self._home_provider, parent=self)
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
        return TrainingBucket(
            f"{self._stem}-bucket",
            TrainingBucketArgs(
                bucket_name=bucket_name,
                keep_on_destroy=s.storage.keep_on_destroy,
                adopt=args.adopt_bucket,
                noncurrent_days=s.storage.noncurrent_days,
                tags=self._tags,
            ),
            opts=self._at_home,
        )

    def _repositories(self) -> tuple[ImageRepository, dict[int, ImageRepository]]:
        """Home's image repository, and with a built image and several placements one of the same settings in
        each AWS placement's region, so every machine pulls from its own region (ECR repositories are regional)."""
        s = self._args.settings
        repo_args = ImageRepositoryArgs(
            repository_name=repository_name(project=self._args.project, stack=s.stack),
            keep_images=s.image.keep_images,
            tags=self._tags,
        )
        repo = ImageRepository(f"{self._stem}-images", repo_args, opts=self._at_home)
        mirrors = {i: ImageRepository(f"{self._stem}-images-p{i}", repo_args, opts=self._in_region[i])
                   for i in self._regional} if mirrored_image(s) else {}
        return repo, mirrors

    def _identity(self, bucket: TrainingBucket, repo: ImageRepository,
                  mirrors: dict[int, ImageRepository]) -> InstanceIdentity:
        """One role for the machines of every AWS placement (IAM is global), each group in its region."""
        s = self._args.settings
        places, groups = s.placement_list, self._places.groups
        return InstanceIdentity(
            f"{self._stem}-identity",
            InstanceIdentityArgs(
                bucket_arn=bucket.arn,
                run_id=s.run_id,
                repository_arn=repo.arn,
                other_repository_arns=[m.arn for m in mirrors.values()],
                group_name=self._group,
                region=s.region,
                other_groups=[(p.region, g) for p, g in zip(places[1:], groups[1:], strict=True) if p.cloud == "aws"],
                data_uri=s.run.data_uri,
                validation_data_uri=s.run.validation_data_uri,
                nodes=s.compute.nodes,
                tags=self._tags,
            ),
            opts=self._at_home,
        )

    def _images(self, repo: ImageRepository, mirrors: dict[int, ImageRepository]) -> list[pulumi.Output[str]]:
        """The image each placement's machines run, by digest, from its own region's repository; their user
        data waits for the push."""
        s = self._args.settings
        self._image_public_key: pulumi.Output[str] | None = None

        def build() -> list[pulumi.Output[str]]:
            # Home's KMS key signs the digest in every repository (the mirrors are in home's account).
            key = SigningKey(f"{self._stem}-signing", SigningKeyArgs(region=s.region, tags=self._tags),
                             opts=self._at_home)
            image = TrainerImage(
                f"{self._stem}-image",
                TrainerImageArgs(repository_url=repo.url, registry_id=repo.registry_id, base_image=s.image.reference,
                                 user_code_dir=user_code_dir(s), gate=s.image, signing_key=key,
                                 mirrors=[ImageMirror(repository_url=m.url, registry_id=m.registry_id,
                                                      provider=self._regional[i])
                                          for i, m in mirrors.items()]),
                opts=self._at_home,
            )
            self._image_public_key = image.public_key
            return image.refs
        return image_refs(s, build)

    def _groups(self, home: Home, identity: InstanceIdentity,
                ) -> tuple[list[pulumi.ComponentResource], dict[int, pulumi.Output]]:
        """Every placement's group, home first (the other cloud's through the layer above), and how the
        controller reaches those on the other cloud, by index."""
        groups: list[pulumi.ComponentResource] = []
        access: dict[int, pulumi.Output] = {}
        for i, (g, ps) in enumerate(zip(self._places.groups, self._places.settings, strict=True)):
            if ps.cloud != "aws":
                group, reach = self._places.other_cloud.placement(home, i)
                groups.append(group)
                if reach is not None:
                    access[i] = reach
                continue
            user_data = userdata.user_data_output("aws", ps, group=g, run_uri=home.run, code_uri=home.code.code_uri,
                                                  boot_uri=home.code.boot_uri, image_ref=home.images[i],
                                                  image_public_key=home.image_public_key)
            groups.append(SpotGroup(
                f"{self._stem}-group" if i == 0 else f"{self._stem}-group-p{i}",
                # Only the active placement has machines: home, until the controller moves the run; with `choose:
                # cheapest`, none until the controller's first tick launches it (group_size). A machine
                # that boots before its policy is attached would fail its first S3 call.
                spot_group_args(ps, group_name=g, size=group_size(self._args.settings, i),
                                instance_profile_arn=identity.profile_arn, user_data=user_data, tags=self._tags,
                                wait_for=[identity.policy]),
                opts=self._in_region[i],
            ))
        return groups, access

    def _controller(self, home: Home, access: dict[int, pulumi.Output]) -> pulumi.Output[str] | None:
        """Several placements: the controller that moves the run, here at home beside the bucket. Returns its
        configuration (None with one placement)."""
        s, places = self._args.settings, self._args.settings.placement_list
        self.controller: PlacementController | None = None
        if len(places) == 1:
            return None
        run = self._places.controller_run(s, self._group, home.run, access)
        self.controller = PlacementController(
            f"{self._stem}-controller",
            PlacementControllerArgs(
                run=run,
                # Its AWS grants reach the AWS groups; a GCP placement's group, through `access`.
                groups=[(p.region, g) for p, g in zip(places, self._places.groups, strict=True) if p.cloud == "aws"],
                bucket_arn=home.bucket.arn,
                tags=self._tags,
                federation=bool(access),
                named_role=bool(access),
                reserve_concurrency=s.placement.reserve_concurrency,
            ),
            opts=self._at_home,
        )
        return run.config
