"""The SageMaker room: a run as one managed-spot training job.

What the stack names (EC2 instance types such as ``g5.xlarge``) becomes what SageMaker
takes (``ml.g5.xlarge``); the types SageMaker trains on are botocore's own enumeration of
``TrainingInstanceType``, so a type SageMaker lacks is refused before anything is created.
"""

from __future__ import annotations

import functools

# SageMaker's names for an EC2 type: the same, with this prefix.
ML_PREFIX = "ml."


@functools.cache
def service_model():
    """botocore's SageMaker service model (loaded once: ~0.3 s)."""
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def training_instance_types() -> tuple[str, ...]:
    """Every instance type a SageMaker training job takes, as botocore's model lists them."""
    return tuple(service_model().shape_for("TrainingInstanceType").enum)


def instance_type(ec2_type: str) -> str:
    """SageMaker's name for the stack's EC2 type: ``g5.xlarge`` -> ``ml.g5.xlarge``."""
    return ec2_type if ec2_type.startswith(ML_PREFIX) else ML_PREFIX + ec2_type


# A training job's name: SageMaker's pattern and limit (unique in the account and region, for ever:
# a name is never reused, even after the job is deleted from the console's list).
JOB_NAME_MAX = 63
# The run's jobs are <prefix>--<n>, n = 1, 2, ... (one at a time); the prefix leaves room for the number. A
# prefix holds no "--" (its parts are slugs), so one run's names never match another's `<prefix>--*`.
JOB_SEPARATOR = "--"
JOB_PREFIX_MAX = JOB_NAME_MAX - len(JOB_SEPARATOR) - 3


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def job_prefix(*, project: str, stack: str, run_id: str) -> str:
    """The name every training job of this run starts with, before `--<n>`: `<project>-<stack>[-<run id>]`, lowercase
    (SageMaker writes the job's ARN in lowercase), shortened with a digest past SageMaker's limit. The job
    role's trust names it, so only this run's jobs can act as the role."""
    import hashlib

    parts = [project, stack] + ([run_id] if run_id != stack else [])
    name = "-".join(_slug(p) or "x" for p in parts)
    if len(name) > JOB_PREFIX_MAX:
        digest = hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]
        name = name[:JOB_PREFIX_MAX - 9].rstrip("-") + "-" + digest
    return name


def job_arn_pattern(*, partition: str, region: str, account_id: str, prefix: str) -> str:
    """The ARNs of this run's jobs (`aws:SourceArn` of the role's trust)."""
    return f"arn:{partition}:sagemaker:{region}:{account_id}:training-job/{prefix}{JOB_SEPARATOR}*"
