"""A GCP home's placements on AWS: each one's Auto Scaling group in its region, its machines' role (their own
group's size, nothing in S3), and in home's project the pool that trusts that role and the service account it
impersonates for home's bucket; and the role home's controller function assumes to read and size the groups.

Built from `components.aws` and `components.gcp`'s federation pieces; every resource is a child of the
home stack, under the names it has always had (a rename would replace it).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components import userdata
from components.aws.federation import ControllerRole, ControllerRoleArgs, controller_audience, controller_role_name
from components.aws.group import SpotGroup, spot_group_args
from components.aws.identity import InstanceIdentity, InstanceIdentityArgs
from components.common import Home
from components.gcp.federation import MachineAccess, MachineAccessArgs
from components.gcp.naming import network_tag, placement_account_ids
from components.gcp.stack import bucket_access
from components.settings import Settings
from components.tags import aws_tags


class AwsPlacements:
    """The placements on AWS of a GCP home (`components.common.OtherCloud`)."""

    def __init__(self, settings: Settings, groups: list[str], places: list[Settings], aws_home_group: str):
        self._settings, self._groups, self._places = settings, groups, places
        # The AWS group name placement 0 would have: the controller's role is named after it.
        self._aws_home_group = aws_home_group
        # Each AWS placement's provider, by index: its group, its machines' role, and the controller's role.
        self._providers: dict[int, pulumi.ProviderResource] = {}

    def placement(self, home: Home, index: int) -> tuple[pulumi.ComponentResource, None]:
        """Placement `index`'s group in its region, its machines' role, and their access to home's bucket."""
        s, p, group_name = self._settings, self._places[index], self._groups[index]
        name, parent = home.name, home.parent
        names = {"project": home.args.project, "stack": s.stack}
        provider = self._provider(home, index, p.region)
        in_region = pulumi.ResourceOptions(parent=parent, providers={"aws": provider})
        invoke = pulumi.InvokeOptions(parent=parent, provider=provider)
        tags = aws_tags(**names, run_id=s.run_id)
        # The public image only (a built one is refused across clouds): no ECR grant; the run folder is in GCS.
        identity = InstanceIdentity(
            f"{name}-identity-p{index}",
            InstanceIdentityArgs(bucket_arn=None, run_id=s.run_id, repository_arn=None, group_name=group_name,
                                 region=p.region, nodes=p.compute.nodes, tags=tags),
            opts=in_region,
        )
        access = MachineAccess(
            f"{name}-machine-access-p{index}",
            MachineAccessArgs(
                gcp_project=s.project, account_id=placement_account_ids(**names, index=index)[0],
                pool_stem=network_tag(**names), bucket=bucket_access(s, home.bucket.name),
                aws_account_id=aws.get_caller_identity_output(opts=invoke).account_id,
                aws_partition=aws.get_partition_output(opts=invoke).partition,
                machine_role_name=identity.role.name,
            ),
            opts=pulumi.ResourceOptions(parent=parent, providers={"gcp": home.provider}),
        )
        user_data = userdata.user_data_output(
            "aws", p, group=group_name, run_uri=home.run, code_uri=home.code.code_uri, boot_uri=home.code.boot_uri,
            image_ref=home.images[index], image_public_key=home.image_public_key,
            store=userdata.gcs_store_env(audience=access.audience, service_account=access.email),
        )
        return SpotGroup(
            f"{name}-group-p{index}",
            # A machine that boots before its role's policy, its pool and its grants on home's bucket exist would
            # fail its first call. (A GCP home refuses compute.maxPricePerHour: EC2's spot price, capped at
            # on-demand.)
            spot_group_args(p, group_name=group_name, size=0, instance_profile_arn=identity.profile_arn,
                            user_data=user_data, tags=tags,
                            wait_for=[identity.policy, access.provider, *access.grants]),
            opts=in_region,
        ), None

    def controller_access(self, home: Home) -> dict[int, pulumi.Output[dict[str, str]]]:
        """The controller's `access` to every AWS placement: the role `after_controller` makes (by its name, in
        the first AWS placement's account) and the audience its trust names."""
        invoke = pulumi.InvokeOptions(parent=home.parent, provider=self._first_provider())
        arn = pulumi.Output.concat("arn:", aws.get_partition_output(opts=invoke).partition, ":iam::",
                                   aws.get_caller_identity_output(opts=invoke).account_id, ":role/",
                                   controller_role_name(self._aws_home_group))
        reach = arn.apply(lambda a: {"aws_role_arn": a, "audience": controller_audience(self._groups[0])})
        return {i: reach for i in self._providers}

    def after_controller(self, home: Home, controller: object) -> None:
        """The role home's controller function (its account's `unique_id`) assumes with its Google identity to
        read and size the AWS groups. Its trust names the function's account, made with the function, so the
        function may tick before the role exists: such a tick cannot reach the AWS groups, and the next one
        starts again."""
        s = self._settings
        ControllerRole(
            f"{home.name}-controller-aws",
            ControllerRoleArgs(
                role_name=controller_role_name(self._aws_home_group), service_account_unique_id=controller.unique_id,
                audience=controller_audience(self._groups[0]),
                groups=[(p.region, g) for p, g in zip(s.placement_list, self._groups, strict=True) if p.cloud == "aws"],
                nodes=s.compute.nodes, tags=aws_tags(project=home.args.project, stack=s.stack, run_id=s.run_id),
            ),
            opts=pulumi.ResourceOptions(parent=home.parent, providers={"aws": self._first_provider()}),
        )

    def _provider(self, home: Home, index: int, region: str) -> pulumi.ProviderResource:
        """Placement `index`'s AWS provider: its region, the deployer's AWS credentials."""
        if index not in self._providers:
            self._providers[index] = aws.Provider(f"{home.name}-aws-p{index}", region=region,
                                                  opts=pulumi.ResourceOptions(parent=home.parent))
        return self._providers[index]

    def _first_provider(self) -> pulumi.ProviderResource:
        return next(iter(self._providers.values()))
