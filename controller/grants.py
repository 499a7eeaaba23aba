"""The controller's least privilege, as the stack grants it to the function's identity.

:func:`aws_policy` is the identity policy of the AWS function (the stack adds the function's own
logging grant, e.g. AWSLambdaBasicExecutionRole): exactly the calls :mod:`controller.tick` and
:mod:`controller.clouds` make, proven under IAM enforcement by ``tests/iam/test_controller_identity.py``.

- the run folder: list it, read its objects (progress, events, lease, markers, checkpoints'
  COMMITTED), write only ``placement.json``, the controller's events object, the price cache
  (``prices.json``) and its decision tables (``decisions/*``);
- EC2: ``DescribeSpotPriceHistory`` and ``GetSpotPlacementScores``, the placements' prices and
  capacity scores (controller/prices.py; neither has resource-level permissions: ``*``), in the AWS
  placements' regions only (``ec2:Region``);
- Auto Scaling: ``DescribeAutoScalingGroups`` and ``DescribeScalingActivities`` (no
  resource-level permissions: ``*``) and ``UpdateAutoScalingGroup`` on the placements' groups
  only, with sizes no larger than the run's ``nodes`` (MinSize and MaxSize must be sent and
  at most ``nodes``; the desired capacity can never exceed MaxSize).

:func:`aws_group_policy` is the groups' part alone: the policy of the role a GCP-home function
assumes in AWS (``access.aws_role_arn``). :data:`GCP_GROUP_PERMISSIONS` is the same for the service
account an AWS-home function impersonates in GCP (``access.service_account``): the groups' reads
and resize, no bucket.

:data:`GCP_PERMISSIONS` lists what a GCP function's custom role needs: the managed groups'
reads (``get``; ``list`` covers listManagedInstances and listErrors) and ``update`` (resize); on
the bucket, conditioned on the run's prefix, object reads, listing, creation, and delete
(GCS needs ``storage.objects.delete`` to replace an existing object). Its prices come from the Cloud
Billing Catalog, which any authenticated caller may list: no permission, only the API enabled.
"""

from __future__ import annotations

from runfolder import layout

READ_GROUP_ACTIONS = ("autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeScalingActivities")
SIZE_GROUP_ACTIONS = ("autoscaling:UpdateAutoScalingGroup",)
PRICE_ACTIONS = ("ec2:DescribeSpotPriceHistory", "ec2:GetSpotPlacementScores")
GCP_PERMISSIONS = (
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.list",
    "compute.instanceGroupManagers.update",
    "storage.objects.get",
    "storage.objects.list",
    "storage.objects.create",
    "storage.objects.delete",
)
GCP_GROUP_PERMISSIONS = GCP_PERMISSIONS[:3]
# The only objects the controller writes, relative to the run folder.
# The record and its events; the run's deadline when no machine has written it yet, and TIMED_OUT when
# the deadline passed with no machine to end the run, CANCELLED when a stop no trainer heeds was asked
# (controller/tick.py). The price cache and the decision tables (controller/prices.py, controller/table.py): a key, and a folder of them.
WRITES = (layout.PLACEMENT_KEY, layout.PLACEMENT_EVENTS_KEY, layout.DEADLINE_KEY, layout.TIMED_OUT, layout.CANCELLED,
          layout.PRICES_KEY)
WRITE_PREFIXES = (layout.DECISIONS_PREFIX,)


def aws_policy(*, bucket: str, run_id: str, groups: list[tuple[str, str]], nodes: int, account_id: str,
               partition: str = "aws") -> dict:
    """The AWS function's identity policy; ``groups``: (region, name) of every AWS placement's group."""
    run_prefix = layout.run_prefix(run_id).rstrip("/")
    bucket_arn = f"arn:{partition}:s3:::{bucket}"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ListRunFolder", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn,
         "Condition": {"StringLike": {"s3:prefix": [f"{run_prefix}/", f"{run_prefix}/*"]}}},
        {"Sid": "ReadRunFolder", "Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{bucket_arn}/{run_prefix}/*"},
        {"Sid": "WritePlacement", "Effect": "Allow", "Action": "s3:PutObject",
         "Resource": [f"{bucket_arn}/{run_prefix}/{key}" for key in WRITES]
         + [f"{bucket_arn}/{run_prefix}/{prefix}*" for prefix in WRITE_PREFIXES]},
        *aws_group_policy(groups=groups, nodes=nodes, account_id=account_id, partition=partition)["Statement"],
    ]}


def aws_group_policy(*, groups: list[tuple[str, str]], nodes: int, account_id: str, partition: str = "aws") -> dict:
    """The groups' part of :func:`aws_policy`, with the spot prices: all a GCP-home controller's role in AWS needs
    (the role it assumes with its Google identity, ``access.aws_role_arn``): the run folder is in home's bucket,
    which the function reaches as itself. ``groups``: (region, name) of the AWS placements' groups."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadGroups", "Effect": "Allow", "Action": list(READ_GROUP_ACTIONS), "Resource": "*"},
        {"Sid": "SizeGroups", "Effect": "Allow", "Action": list(SIZE_GROUP_ACTIONS),
         "Resource": [f"arn:{partition}:autoscaling:{region}:{account_id}:autoScalingGroup:*:autoScalingGroupName/{name}"
                      for region, name in groups],
         "Condition": {"NumericLessThanEquals": {"autoscaling:MinSize": str(nodes), "autoscaling:MaxSize": str(nodes)}}},
        *price_statements(sorted({region for region, _name in groups})),
    ]}


def price_statements(regions: list[str]) -> list[dict]:
    """The spot prices and placement scores, in ``regions`` only (the calls take no resource, and ``ec2:Region``
    is the one condition key they have); none without a region."""
    if not regions:
        return []
    return [{"Sid": "ReadSpotPrices", "Effect": "Allow", "Action": list(PRICE_ACTIONS), "Resource": "*",
             "Condition": {"StringEquals": {"ec2:Region": regions}}}]
