"""The SageMaker job's role, as AWS would evaluate it: the calls the job makes are allowed, the rest refused.

The documents are the synth output's own (a `scheduler: sagemaker` stack). moto answers HTTP 500 for a
trust policy with a `Service` principal, so the trust and the identity policy are both evaluated by the
project's own evaluator (tests/iam/policy_eval.py), one request at a time.
"""

from __future__ import annotations

import json

import pytest

from tests.components.aws.helpers import synth_raw
from tests.iam.policy_eval import Decision, Request, evaluate, evaluate_trust

ACCOUNT = "123456789012"
REGION = "eu-west-1"
JOB = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/trainstack-unit-exp-7--1"
LOGS = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs"


@pytest.fixture(scope="module")
def documents() -> dict:
    result = synth_raw({"scheduler": "sagemaker", "image": {"build": True}, "compute": {"instanceTypes": ["g5.xlarge"]},
                        "run": {"synthetic": False, "dataUri": "s3://my-data/train/"}}, stack="unit")
    (role,) = result.of_type("aws:iam/role:Role")
    (policy,) = result.of_type("aws:iam/rolePolicy:RolePolicy")
    (repo,) = result.of_type("aws:ecr/repository:Repository")
    return {"trust": role["inputs"]["assumeRolePolicy"], "policy": policy["inputs"]["policy"],
            "bucket": result.outputs["bucketName"], "repo": f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/"
            + repo["inputs"]["name"]}


@pytest.mark.parametrize(("context", "decision"), [
    ({"aws:SourceAccount": ACCOUNT, "aws:SourceArn": JOB}, Decision.ALLOW),
    ({"aws:SourceAccount": ACCOUNT, "aws:SourceArn": JOB.replace("--1", "--27")}, Decision.ALLOW),
    # Another account's job of the same name (the confused deputy).
    ({"aws:SourceAccount": "210987654321", "aws:SourceArn": JOB.replace(ACCOUNT, "210987654321")},
     Decision.IMPLICIT_DENY),
    # Another stack's jobs: one whose name starts the same, and a notebook or endpoint of this account.
    ({"aws:SourceAccount": ACCOUNT, "aws:SourceArn": JOB.replace("exp-7--1", "exp-7-b--1")}, Decision.IMPLICIT_DENY),
    ({"aws:SourceAccount": ACCOUNT, "aws:SourceArn": JOB.replace("training-job", "notebook-instance")},
     Decision.IMPLICIT_DENY),
    ({"aws:SourceAccount": ACCOUNT, "aws:SourceArn": JOB.replace(REGION, "us-east-1")}, Decision.IMPLICIT_DENY),
    ({}, Decision.IMPLICIT_DENY),
])
def test_sagemaker_may_assume_the_role_for_this_runs_jobs_only(documents, context, decision):
    assert evaluate_trust(documents["trust"], service="sagemaker.amazonaws.com", action="sts:AssumeRole",
                          context=context) is decision


def test_no_other_service_may_assume_it(documents):
    context = {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": JOB}
    assert evaluate_trust(documents["trust"], service="ec2.amazonaws.com", action="sts:AssumeRole",
                          context=context) is Decision.IMPLICIT_DENY


def _requests(d: dict) -> tuple[list[Request], list[Request]]:
    run = f"arn:aws:s3:::{d['bucket']}/runs/exp-7"
    allowed = [
        Request("s3:GetObject", f"{run}/checkpoints/ckpt-100/COMMITTED"),
        Request("s3:PutObject", f"{run}/events.jsonl"),
        Request("s3:DeleteObject", f"{run}/checkpoints/ckpt-50/x"),
        Request("s3:ListBucket", f"arn:aws:s3:::{d['bucket']}", {"s3:prefix": "runs/exp-7/checkpoints/"}),
        Request("s3:GetObject", "arn:aws:s3:::my-data/train/part-0.tfrecord"),
        Request("ecr:GetAuthorizationToken", "*"),
        Request("ecr:BatchGetImage", d["repo"]),
        Request("ecr:GetDownloadUrlForLayer", d["repo"]),
        Request("logs:CreateLogStream", f"{LOGS}:log-stream:trainstack-unit-exp-7--1/algo-1-1700000000"),
        Request("logs:PutLogEvents", f"{LOGS}:log-stream:trainstack-unit-exp-7--1/algo-1-1700000000"),
        Request("logs:CreateLogGroup", LOGS),
        Request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}),
    ]
    refused = [
        Request("s3:GetObject", f"arn:aws:s3:::{d['bucket']}/runs/other-run/progress.json"),
        Request("s3:PutObject", f"arn:aws:s3:::{d['bucket']}/runs/exp-70/events.jsonl"),
        Request("s3:ListBucket", f"arn:aws:s3:::{d['bucket']}", {"s3:prefix": "runs/"}),
        # The code is in the image: the machines' code/ is not the job's.
        Request("s3:GetObject", f"arn:aws:s3:::{d['bucket']}/code/trainer-abc.tar.gz"),
        Request("s3:PutObject", "arn:aws:s3:::my-data/train/part-0.tfrecord"),
        Request("s3:GetObject", "arn:aws:s3:::someone-else/runs/exp-7/progress.json"),
        Request("ecr:BatchGetImage", d["repo"].replace("trainstack/unit", "trainstack/other")),
        Request("ecr:PutImage", d["repo"]),
        Request("logs:PutLogEvents", f"{LOGS}:log-stream:other-job--1/algo-1-1700000000"),
        Request("logs:PutLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/lambda/x:log-stream:y"),
        Request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "AWS/EC2"}),
        Request("sagemaker:CreateTrainingJob", JOB),
        Request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/anything"),
        Request("autoscaling:UpdateAutoScalingGroup", "*", {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}),
    ]
    return allowed, refused


def test_the_jobs_calls_are_allowed_and_the_rest_refused(documents):
    allowed, refused = _requests(documents)
    decided = [(r.action, r.resource, evaluate([documents["policy"]], r)) for r in allowed + refused]
    assert [d for d in decided[:len(allowed)] if d[2] is not Decision.ALLOW] == []
    assert [d for d in decided[len(allowed):] if d[2] is Decision.ALLOW] == []
    assert len(decided) == len(allowed) + len(refused) == 26
    assert json.loads(documents["policy"])["Statement"]
