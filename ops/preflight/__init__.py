"""`python -m ops preflight --stack NAME`: what would make a real launch fail silently, checked before `pulumi up`.

A `pulumi up` succeeds even when no machine can ever start: the group is created and
keeps retrying, and the run stays NOT STARTED. Preflight asks the cloud, with the
operator's credentials, about what decides that:

AWS
- the vCPU quota of each instance family the stack uses (Service Quotas; spot or
  on-demand as the stack asks): vCPUs per type (EC2's own figures) x `compute.nodes`;
- each instance type offered in the zones the group may use: those of its subnets
  (`compute.subnets`, else the default VPC's), narrowed to `compute.zones`; several machines
  use one zone, the one the program's own `choose_zone` picks;
- a way out to the internet from each of the group's subnets in those zones: a 0.0.0.0/0
  route to a NAT gateway, or to an internet gateway from a subnet that gives public IPs;
- the AMI: `compute.imageId`, else the Deep Learning AMI the group looks up by name;
- the bucket name: free, or already yours (then `storage.adopt: true` is needed), or
  someone else's (then another `storage.bucketName`).
- with `placement.reserveConcurrency` and a controller (two placements or more): room in the
  account to reserve the controller function's execution (Lambda's GetAccountSettings: at least
  100 executions must stay unreserved after it; the function's own reservation, from an earlier
  `pulumi up`, counts as room).
- with `image.build` (and on a SageMaker stack, which always builds): that the identity running `pulumi up`
  may create, read, tag, re-policy and schedule the deletion of the image-signing KMS key (its IAM policies
  simulated with IAM SimulatePrincipalPolicy: an assumed role's session as its role, whose path GetRole gives),
  and is not denied Sign or GetPublicKey, which the key's own policy grants it. A refused simulation is one line
  saying the rights were not checked.

GCP
- the GPU quota of the region for the machines' GPU (for Spot VMs the PREEMPTIBLE_ one when
  the project has any, else the standard one, which Spot VMs then use) and the project's
  GPUS_ALL_REGIONS, for `gpusPerNode` x `nodes` GPUs;
- each machine type (and an N1 machine's GPU) offered in a zone the group may use
  (`compute.zones`, else every zone of the region: the group is given that list);
- the `default` network the machines use: there, with a subnet in the region and a 0.0.0.0/0 route;
- a `gs://` `run.dataUri`: the bucket exists and, unless `run.dataGrant` is false, you may set
  its IAM policy (the stack grants the machines read access there; if not, whether the bucket
  is public, and what to ask its owner);
- the APIs that must be on before the first `pulumi up` (the stack turns on the rest), and the
  Compute Engine API, which every check above reads (off: one line says to turn it on);
- with `image.build` (and on a Vertex AI stack, which always builds): the Cloud KMS permissions that making,
  granting on and destroying the image-signing key take, held on the project (Cloud Resource Manager's
  projects.testIamPermissions).

A Job stack (`scheduler: kubernetes`, docs/kubernetes.md) is checked on its cluster instead
(`ops.preflight.kubernetes`): reached as the stack says, Kubernetes 1.31 or later, GPU nodes with the
spot label, the namespace free or the run's, the identity binding (and on AWS the bucket).

A managed training job (`scheduler: sagemaker`, docs/sagemaker.md; `scheduler: vertex`, docs/vertex.md) draws
on the service's own quotas, not the groups' EC2 or Compute Engine ones, and runs on the service's machines,
image and network: it is checked for the service's training quota of its instance type or GPU (spot or on
demand; a new account has 0), the bucket (SageMaker) or the APIs and the data bucket (Vertex AI):
`ops.preflight.sagemaker`, `ops.preflight.vertex`.

A stack of several placements (docs/placements.md) is checked in each of them: the checks above in
the placement's cloud, region and project, but for the bucket and the data, which are home's.

The checks live per cloud, as `components/` does: `ops.preflight.aws`, `ops.preflight.gcp`
(with its REST client in `ops.preflight.gcp_api`), and `ops.preflight.common` (`Problem`);
this module walks the placements and is the command.

Output: one line per problem, each with its fix; exit 1 when there are problems, 0 when
clean, 2 when the stack's config is invalid (the settings loader's one-line error) or no
credentials for a cloud it must ask were found (one line: which cloud, what to do).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from components import settings as config
from components.project import STACKS_DIR
from ops.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from ops.preflight.aws import (
    AWS_QUOTAS,
    aws_bucket_name,
    aws_bucket_problems,
    aws_image_problems,
    aws_lambda_concurrency_problems,
    aws_network_problems,
    aws_offering_problems,
    aws_quota_problems,
    aws_subnets,
    aws_zones,
    check_aws,
)
from ops.preflight.common import NoCredentials, Problem, run_checks
from ops.preflight.gcp import (
    GCP_ACCELERATOR_METRICS,
    GCP_GPU_METRICS,
    SET_POLICY,
    check_gcp,
    compute_api_problem,
    gcp_api_problems,
    gcp_data_problems,
    gcp_gpu_metric,
    gcp_gpu_quota,
    gcp_network_problems,
    gcp_offering_problems,
    gcp_quota_problems,
    gcp_zones,
)
from ops.preflight.gcp_api import COMPUTE_API, ApiDisabled, GcpApi, RestGcpApi, api_disabled

# What `from ops.preflight import X` has always given; the checks live in the per-cloud modules.
__all__ = [
    "AWS_QUOTAS", "COMPUTE_API", "GCP_ACCELERATOR_METRICS", "GCP_GPU_METRICS", "SET_POLICY", "ApiDisabled", "GcpApi",
    "NoCredentials", "Problem", "RestGcpApi", "api_disabled", "aws_bucket_name", "aws_bucket_problems", "aws_image_problems",
    "aws_lambda_concurrency_problems", "aws_network_problems", "aws_offering_problems", "aws_quota_problems", "aws_subnets", "aws_zones", "check",
    "check_aws", "check_gcp", "cmd_preflight", "compute_api_problem", "config", "gcp_api_problems",
    "gcp_data_problems", "gcp_gpu_metric", "gcp_gpu_quota", "gcp_network_problems", "gcp_offering_problems",
    "gcp_quota_problems", "gcp_zones", "register", "run_checks",
]


def check(settings: config.Settings, *, aws_session: Any = None, gcp_api: GcpApi | None = None,
          stack: str | None = None, kube_client: Any = None) -> list[Problem]:
    """A Job stack's (`scheduler: kubernetes`): its cluster's checks (`ops.preflight.kubernetes`), the groups'
    quotas, machine types and network being the cluster's own business. A managed job's (`scheduler: sagemaker`
    or `vertex`): the service's own quota and the bucket or data (`ops.preflight.sagemaker`, `.vertex`). Any other stack's: every check for each placement (home: the stack's own cloud and region), in its cloud, region and
    project: a run moved to a placement whose quota, types, network or image fail would wait there
    as it would at home. A placement's problems start with `placements[i] (cloud region):`."""
    from components.placement import settings_at

    if settings.scheduler == "kubernetes":
        from ops.preflight.kubernetes import check_kubernetes

        return check_kubernetes(settings, stack=stack or settings.stack, client=kube_client, aws_session=aws_session)
    if settings.scheduler == "sagemaker":
        from ops.preflight.sagemaker import check_sagemaker

        return check_sagemaker(settings, aws_session)
    if settings.scheduler == "vertex":
        from ops.preflight.vertex import check_vertex

        return check_vertex(settings, gcp_api)
    problems: list[Problem] = []
    for i, p in enumerate(settings.placement_list):
        at = settings_at(settings, i)
        found = check_aws(at, aws_session, home=i == 0) if at.cloud == "aws" else check_gcp(at, gcp_api, home=i == 0)
        if i:
            found = [Problem(f"placements[{i}] ({p.cloud} {p.region}): {f.what}", f.fix) for f in found]
        problems += found
    return problems


def cmd_preflight(args: argparse.Namespace, *, aws_session: Any = None, gcp_api: GcpApi | None = None,
                  kube_client: Any = None) -> int:
    """`python -m ops preflight`: one line per problem; exit 1 with problems, 0 clean, 2 on bad config or no credentials."""
    stack_file = Path(args.stacks_dir) / f"Pulumi.{args.stack}.yaml"
    if not stack_file.is_file():
        print(f"ops preflight: no stack file {stack_file}", file=sys.stderr)
        return EXIT_ERROR
    try:
        settings = config.load_settings(config.raw_from_config(config.read_stack_file(stack_file)), stack=args.stack)
    except config.ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_ERROR
    try:
        problems = check(settings, aws_session=aws_session, gcp_api=gcp_api, stack=args.stack, kube_client=kube_client)
    except NoCredentials as e:
        print(f"ops preflight: {e}", file=sys.stderr)
        return EXIT_ERROR
    for p in problems:
        print(p.line())
    if problems:
        outcome = {"groups": "`pulumi up` would not start a machine as asked", "kubernetes": "the Job would not run "
                   "as asked"}.get(settings.scheduler, f"the {settings.scheduler} training job would be refused")
        print(f"preflight {args.stack}: {len(problems)} problem(s); {outcome}")
        return EXIT_FAILED
    print(f"preflight {args.stack}: ok ({settings.cloud}, {settings.region}"
          + (f", cluster of {settings.kubernetes.context or 'the kubeconfig secret'})" if settings.kubernetes else ")"))
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `preflight` command to `python -m ops`."""
    p = sub.add_parser("preflight", help="check quotas, zones, image, bucket (AWS) or GPU quota, APIs (GCP) first")
    p.add_argument("--stack", required=True, help="stack name: stacks/Pulumi.<NAME>.yaml")
    p.add_argument("--stacks-dir", default=str(STACKS_DIR), help="folder of the stack files (default: %(default)s)")
    p.set_defaults(func=cmd_preflight)
