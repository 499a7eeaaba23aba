"""An AWS home's placements on GCP: each one's group in its project, its machines' service account, the
AWS role that account's ID tokens assume for the home bucket, and the home controller's reach into the group.

Built from `components.gcp` and `components.aws`'s federation pieces; every resource is a child of the
home stack, under the names it has always had (a rename would replace it).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_gcp as gcp

from components import placement, userdata
from components.aws.controller import role_name as controller_role_name
from components.aws.federation import FederatedRole, FederatedRoleArgs, audience
from components.common import Home
from components.gcp import naming as gcp_naming
from components.gcp.federation import ControllerAccess, ControllerAccessArgs
from components.gcp.group import SpotGroup, spot_group_args
from components.gcp.identity import PlacementIdentity, PlacementIdentityArgs
from components.gcp.stack import project_apis
from components.settings import Settings
from components.tags import aws_tags, gcp_labels

# A GCP placement's project: the APIs its resources live in (after the Resource Manager API, through which
# the others are turned on), STS and IAM Credentials, which the controller's federation goes through, and the
# Cloud Billing API, whose catalog the controller reads the placement's Spot prices from as the account it
# impersonates there (the account's project is the one the call counts against).
GCP_PLACEMENT_APIS = (gcp_naming.RESOURCE_MANAGER_API, "cloudscheduler.googleapis.com", "compute.googleapis.com",
                      "iam.googleapis.com", "iamcredentials.googleapis.com", "sts.googleapis.com",
                      "cloudbilling.googleapis.com")


class GcpPlacements:
    """The placements on GCP of an AWS home (`components.common.OtherCloud`)."""

    def __init__(self, settings: Settings, groups: list[str], places: list[Settings]):
        self._settings, self._groups, self._places = settings, groups, places
        # Each project's APIs, turned on once per project.
        self._apis: dict[str, list[pulumi.Resource]] = {}
        self._access: dict[int, pulumi.Output[dict[str, str]]] = {}

    def placement(self, home: Home, index: int) -> tuple[pulumi.ComponentResource, pulumi.Output[dict[str, str]]]:
        """Placement `index`'s group in its project, and the home controller's `access` to it."""
        s, p, group_name = self._settings, self._places[index], self._groups[index]
        name, parent = home.name, home.parent
        names = {"project": home.args.project, "stack": s.stack}
        provider = gcp.Provider(f"{name}-gcp-p{index}", project=p.project, region=p.region,
                                opts=pulumi.ResourceOptions(parent=parent, depends_on=self._project_apis(home, p.project)))
        in_project = pulumi.ResourceOptions(parent=parent, providers={"gcp": provider})
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
            FederatedRoleArgs(bucket_arn=home.bucket.arn, run_id=s.run_id,
                              service_account_unique_id=identity.unique_id, audience=token_audience,
                              data_uri=s.run.data_uri, validation_data_uri=s.run.validation_data_uri,
                              tags=aws_tags(**names, run_id=s.run_id)),
            opts=pulumi.ResourceOptions(parent=parent, providers={"aws": home.provider}),
        )
        user_data = userdata.user_data_output(
            "gcp", p, group=group_name, run_uri=home.run, code_uri=home.code.code_uri, boot_uri=home.code.boot_uri,
            image_ref=home.images[index], image_public_key=home.image_public_key,
            store=userdata.aws_store_env(region=s.region, role_arn=role.role_arn, audience=token_audience),
        )
        c = p.compute
        if c.spot and c.max_price_per_hour is not None:
            pulumi.log.warn(placement.max_price_warning(index, p.region, c.max_price_per_hour), resource=parent)
        group = SpotGroup(
            f"{name}-group-p{index}",
            # A project's firewall rules hold for the tag in every region of it: made with its first group. A
            # machine that boots before its grants and its AWS role exist would fail its first call.
            spot_group_args(p, group_name=group_name, size=0, firewalls=index == self._first_in(p.project),
                            network_tag=gcp_naming.network_tag(**names), service_account_email=identity.email,
                            user_data=user_data, labels=gcp_labels(**names, run_id=s.run_id),
                            wait_for=[*identity.grants, role.policy]),
            opts=in_project,
        )
        invoke = pulumi.InvokeOptions(parent=parent, provider=home.provider)
        reach = ControllerAccess(
            f"{name}-controller-access-p{index}",
            ControllerAccessArgs(
                gcp_project=p.project, region=p.region, group_name=group_name, account_id=controller_sa,
                pool_stem=gcp_naming.network_tag(**names), custom_role_prefix=prefix,
                aws_account_id=aws.get_caller_identity_output(opts=invoke).account_id,
                aws_partition=aws.get_partition_output(opts=invoke).partition,
                controller_role_name=controller_role_name(self._groups[0]),
            ),
            opts=in_project,
        )
        self._access[index] = pulumi.Output.all(reach.audience, reach.email).apply(
            lambda v: {"gcp_audience": v[0], "service_account": v[1]})
        return group, self._access[index]

    def controller_access(self, home: Home) -> dict[int, pulumi.Output[dict[str, str]]]:
        """The controller's `access` to each GCP placement, made with its group."""
        return dict(self._access)

    def after_controller(self, home: Home, controller: object) -> None:
        """Nothing: the controller's reach into each GCP project is made with that placement."""

    def _first_in(self, project: str) -> int:
        return min(j for j, p in enumerate(self._settings.placement_list) if p.cloud == "gcp" and p.project == project)

    def _project_apis(self, home: Home, project: str) -> list[pulumi.Resource]:
        """The APIs a GCP placement's project needs on (once per project): its group and runtime cap, its
        service accounts and custom roles, and the token exchange the controller's federation goes through."""
        if project not in self._apis:
            provider = gcp.Provider(f"{home.name}-gcp-apis-{project}", project=project,
                                    opts=pulumi.ResourceOptions(parent=home.parent))
            self._apis[project] = project_apis(home.parent, f"{home.name}-api-{project}", project, provider,
                                               GCP_PLACEMENT_APIS)
        return self._apis[project]
