"""JobIdentity: the IAM role a SageMaker training job runs as (`trainstack:scheduler: sagemaker`).

What `pulumi up` makes for a SageMaker stack is what the job needs and nothing that idles: the
bucket, the image repository with the image by digest, and this role. No group, launch template
or controller: SageMaker starts and releases the machines, and the runtime cap is the job's own
`StoppingCondition` (schedulers/sagemaker.py).

The role is trusted by `sagemaker.amazonaws.com` only on behalf of this account's training jobs
of this run (`aws:SourceAccount`, and `aws:SourceArn` matching the run's job names), so another
account's job, or another stack's, cannot act as it (the confused-deputy guard AWS documents for
SageMaker). It may read and write this run's prefix of the bucket (the trainer writes its own
checkpoints there), read the data sets, pull from this stack's repository, and write the job's
logs and metrics where SageMaker puts every training job's. The trainer code comes baked into
the image (`image.build: true`), so unlike the machines' role it reads no `code/`.

The training job itself is not a resource here, though pulumi-aws has `aws.sagemaker.TrainingJob`:
a job is a run, not infrastructure. As a resource, a later `pulumi up` that changes any input
(a new image digest, a tag) would replace it, which starts a second job of the same run, and
`pulumi destroy` would delete the record of a finished one; a job that ended (spot capacity
never came, MaxWaitTimeExceeded) would be drift for every later `up` to "fix" by training again.
The job is submitted by `python -m ops start` (schedulers/sagemaker.py), which looks for the
run's jobs first: one in progress or a finished run is never submitted again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components import userdata
from components.aws.identity import bucket_statements, deployer_account, ecr_pull_statements, role_with_policy
from runfolder import environment
from schedulers import sagemaker

SERVICE = "sagemaker.amazonaws.com"
# Where SageMaker writes every training job's logs and metrics (not configurable per job).
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
METRICS_NAMESPACE = "/aws/sagemaker/TrainingJobs"


@dataclass(kw_only=True)
class JobIdentityArgs:
    """Inputs of a JobIdentity."""

    bucket_arn: pulumi.Input[str]
    """ARN of the stack's bucket: the role reads and writes only under runs/<run_id>/ (and the cache/)."""
    run_id: str
    """The run's folder."""
    repository_arn: pulumi.Input[str]
    """ARN of the stack's ECR repository: the job's image is pulled from it, as this role."""
    job_prefix: str
    """The name every training job of the run starts with (schedulers.sagemaker.job_prefix)."""
    region: str
    """The stack's region: the jobs' ARNs and the log group are regional."""
    data_uri: str | None = None
    """s3://BUCKET/PREFIX of the training data, read only; None for synthetic data."""
    validation_data_uri: str | None = None
    """s3://BUCKET/PREFIX of the validation data, read only; None without."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the role."""


def trust_document(*, partition: pulumi.Input[str], account_id: pulumi.Input[str], region: str,
                   job_prefix: str) -> pulumi.Output[str]:
    """SageMaker may assume the role for this account's jobs of this run, and nothing else may."""
    source_arn = pulumi.Output.all(partition, account_id).apply(
        lambda pa: sagemaker.job_arn_pattern(partition=pa[0], region=region, account_id=pa[1], prefix=job_prefix))
    return pulumi.Output.json_dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Service": SERVICE},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": account_id},
                          "ArnLike": {"aws:SourceArn": source_arn}},
        }],
    })


def policy_document(*, partition: pulumi.Input[str], account_id: pulumi.Input[str], region: str,
                    bucket_arn: pulumi.Input[str], run_id: str, repository_arn: pulumi.Input[str], job_prefix: str,
                    data_uri: str | None = None, validation_data_uri: str | None = None) -> pulumi.Output[str]:
    """The job's permissions: the run's prefix, the data, the stack's image, its own logs and metrics."""
    statements = [st for st in bucket_statements(partition=partition, bucket_arn=bucket_arn, run_id=run_id,
                                                 data_uri=data_uri, validation_data_uri=validation_data_uri)
                  if st["Sid"] != "ReadTrainerCode"]  # the code is in the image
    log_group = pulumi.Output.concat("arn:", partition, ":logs:", region, ":", account_id, ":log-group:", LOG_GROUP)
    statements += ecr_pull_statements(repository_arn)
    statements += [
        {
            # SageMaker's own log group for training jobs (it exists once any job has run; created otherwise).
            # IAM writes a log group's ARN with or without the trailing ":*"; both name this group only.
            "Sid": "JobLogGroup",
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:DescribeLogStreams"],
            "Resource": [log_group, pulumi.Output.concat(log_group, ":*")],
        },
        {
            # The job's streams are named `<job name>/algo-<n>-<time>`: this run's jobs' streams only.
            "Sid": "JobLogStreams",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": pulumi.Output.concat(log_group, ":log-stream:", job_prefix, sagemaker.JOB_SEPARATOR, "*"),
        },
        {
            # PutMetricData has no resource-level permissions; the namespace condition keeps it to the job's.
            "Sid": "JobMetrics",
            "Effect": "Allow",
            "Action": "cloudwatch:PutMetricData",
            "Resource": "*",
            "Condition": {"StringEquals": {"cloudwatch:namespace": METRICS_NAMESPACE}},
        },
    ]
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": statements})


class JobIdentity(pulumi.ComponentResource):
    """The role a SageMaker training job of this run runs as, and its scoped inline policy."""

    role: aws.iam.Role
    policy: aws.iam.RolePolicy
    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: JobIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:JobIdentity", name, None, opts)
        partition, account_id = deployer_account(self)
        self.role, self.policy = role_with_policy(
            self, name,
            trust=trust_document(partition=partition, account_id=account_id, region=args.region,
                                 job_prefix=args.job_prefix),
            description="trainstack SageMaker training jobs: one run's bucket prefix, image pull, job logs",
            tags=args.tags,
            policy=policy_document(partition=partition, account_id=account_id, region=args.region,
                                   bucket_arn=args.bucket_arn, run_id=args.run_id, repository_arn=args.repository_arn,
                                   job_prefix=args.job_prefix, data_uri=args.data_uri, validation_data_uri=args.validation_data_uri),
        )
        self.role_arn = self.role.arn
        self.register_outputs({"role_arn": self.role_arn})


# What a job's container is told besides the trainer's options: its commands and the Keras it runs.
_JOB_KEYS = (environment.EXTRA_ARGS, environment.COMMAND, "TF_USE_LEGACY_KERAS")


def hyperparameters(settings, run_uri: str) -> dict[str, str]:
    """The job's hyperparameters: the trainer's own `TRAINSTACK_*` options the machines' env file would hold
    (components/userdata.py's `boot_env`, the one place they are made), as strings. The image's entry sets
    them as its environment (trainer/sagemaker_entry.py); the machines' own keys (group, boot archive,
    notice watcher) mean nothing in a job and are left out."""
    env = userdata.boot_env(settings, run_uri=run_uri, group="", code_uri="")
    # The price table's figure is EC2's spot estimate, not SageMaker's ml.* price, which AWS publishes no
    # spot price for: the run records no price rather than a wrong one; the job's billable seconds are its cost.
    unpriced = (environment.PRICE_PER_HOUR, environment.PRICE_NOTE)
    return {k: str(v) for k, v in env.items()
            if (k in environment.OPTIONS or k in _JOB_KEYS) and k not in unpriced}


def job_spec(settings, *, run_uri: pulumi.Input[str], image: pulumi.Input[str], role_arn: pulumi.Input[str],
             job_prefix: str) -> pulumi.Output[str]:
    """What `ops start` submits, as the stack's `sagemakerJob` output (JSON, schedulers.sagemaker.JobSpec's
    fields): everything but the deadline, which counts from the run's first start."""
    c = settings.compute
    return pulumi.Output.all(run_uri, image, role_arn).apply(lambda v: json.dumps({
        "region": settings.region,
        "run_uri": v[0],
        "image": v[1],
        "role_arn": v[2],
        "job_prefix": job_prefix,
        "instance_type": sagemaker.instance_type(c.instance_types[0]),
        "instance_count": c.nodes,
        "volume_gb": c.root_disk_gb,
        "spot": c.spot,
        "max_runtime_s": int(c.max_runtime_hours * 3600),
        "hyperparameters": hyperparameters(settings, v[0]),
    }, sort_keys=True))
