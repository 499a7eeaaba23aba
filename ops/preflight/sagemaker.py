"""Preflight on a SageMaker stack (`trainstack:scheduler: sagemaker`): the job's own quota, and the bucket.

A SageMaker training job does not draw on the EC2 quotas, zones, subnets or AMIs the groups use: SageMaker
starts its machines in its own account and network, from its own image. What refuses a new account's first
job is SageMaker's quota per instance type, which is 0 until asked for (`CreateTrainingJob` answers
`ResourceLimitExceeded`, "... for spot training job usage"). A SageMaker stack gets these checks:

- the Service Quotas quota of service code `sagemaker` named `ml.<type> for spot training job usage`
  (`compute.spot`, managed spot training) or `ml.<type> for training job usage` (on demand), against
  `compute.nodes` instances. Its code differs per type, so it is found by name in the account's applied
  values (ListServiceQuotas), else in AWS's defaults (ListAWSDefaultServiceQuotas): an account that never
  changed a quota has no applied value;
- the bucket, as on the groups (`aws_bucket_problems`): free, or yours with `storage.adopt`;
- the deployer's rights on the image-signing KMS key, as on the groups (`aws_signing_key_problems`): a SageMaker
  stack always builds, and signs, its image.

The image repository is the stack's own and `pulumi up` creates it (nothing to check before), and a
SageMaker stack has no controller (no Lambda concurrency).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components import settings as config
from ops.preflight.common import Problem, run_checks

SERVICE_CODE = "sagemaker"


def quota_name(instance_type: str, *, spot: bool) -> str:
    """Service Quotas' name of SageMaker's training quota for `ml.<type>`: spot (managed spot training) or not."""
    return f"{instance_type} for {'spot ' if spot else ''}training job usage"


def _find(pages: Any, name: str) -> dict | None:
    return next((q for page in pages for q in page.get("Quotas", []) if q.get("QuotaName") == name), None)


def find_quota(quotas: Any, name: str) -> tuple[dict | None, bool]:
    """(the quota named `name`, whether its value is the account's applied one); (None, False) when neither
    the applied values nor AWS's defaults have it."""
    applied = _find(quotas.get_paginator("list_service_quotas").paginate(ServiceCode=SERVICE_CODE), name)
    if applied is not None:
        return applied, True
    default = _find(quotas.get_paginator("list_aws_default_service_quotas").paginate(ServiceCode=SERVICE_CODE), name)
    return default, False


def sagemaker_quota_problems(settings: config.Settings, quotas: Any) -> list[Problem]:
    """SageMaker's training quota for the job's instance type (spot or on demand) against `compute.nodes`."""
    from schedulers import sagemaker

    c = settings.compute
    itype = sagemaker.instance_type(c.instance_types[0])
    name = quota_name(itype, spot=c.spot)
    try:
        quota, _ = find_quota(quotas, name)
    except Exception as e:  # noqa: BLE001 - any failure to read is reported, not raised
        from ops.preflight.aws import _aws_error

        return [Problem(f"could not read SageMaker's quota '{name}' in {settings.region}: {_aws_error(e)}",
                        "allow servicequotas:ListServiceQuotas and servicequotas:ListAWSDefaultServiceQuotas to "
                        "these credentials, or check the quota in the Service Quotas console (Amazon SageMaker)")]
    if quota is None:
        return [Problem(f"SageMaker has no quota '{name}' in {settings.region} (Service Quotas, service code "
                        f"{SERVICE_CODE}): the region may not offer {itype} for training",
                        f"check `aws service-quotas list-aws-default-service-quotas --service-code {SERVICE_CODE} "
                        f"--region {settings.region}`, or choose another compute.instanceTypes or region")]
    value, code, need = float(quota["Value"]), quota["QuotaCode"], c.nodes
    if value >= need:
        return []
    return [Problem(
        f"SageMaker quota '{name}' ({code}) in {settings.region} is {value:g}; the job needs {need} "
        f"({c.nodes} x {itype}), so CreateTrainingJob would be refused (ResourceLimitExceeded)",
        f"aws service-quotas request-service-quota-increase --service-code {SERVICE_CODE} --quota-code {code} "
        f"--desired-value {need} --region {settings.region} (new accounts start at 0; or the Service Quotas console)")]


def check_sagemaker(settings: config.Settings, session: Any = None) -> list[Problem]:
    """Every check of a SageMaker stack; `session` is a boto3 Session (default: the environment's credentials)."""
    from ops.preflight.aws import _aws_error, aws_bucket_problems, aws_session, aws_signing_key_problems

    session = aws_session(settings, session)
    client = lambda name: session.client(name, region_name=settings.region)  # noqa: E731 - one line, local
    checks: list[tuple[str, Callable[[], list[Problem]]]] = [
        ("SageMaker quota", lambda: sagemaker_quota_problems(settings, client("service-quotas"))),
        ("bucket", lambda: aws_bucket_problems(settings, client("s3"), client("sts"))),
        ("image signing key", lambda: aws_signing_key_problems(settings, client("sts"), client("iam"))),
    ]
    return run_checks(checks, _aws_error)
