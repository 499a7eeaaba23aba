"""A `scheduler: sagemaker` stack (components/aws/job.py): the bucket, the image repository with the built
image, and the job's role; no group, launch template, controller or anything else that idles; and the
`sagemakerJob` output `ops start` submits."""

from __future__ import annotations

import json

import pytest

from components.aws.job import hyperparameters
from components.settings import load_settings, load_stack_file
from runfolder import environment
from tests.components.aws.helpers import STACKS, synth_raw, synth_stack

SAGEMAKER = {"scheduler": "sagemaker", "image": {"build": True},
             "compute": {"instanceTypes": ["g5.xlarge"], "maxRuntimeHours": 6, "nodes": 2}}


@pytest.fixture(scope="module")
def result():
    return synth_raw(SAGEMAKER, stack="unit")


def test_only_what_the_job_needs_and_nothing_that_idles(result):
    types = sorted({r["type"] for r in result.resources if not r["type"].startswith("aws:s3/")})
    assert types == [
        "aws:ecr/lifecyclePolicy:LifecyclePolicy", "aws:ecr/repository:Repository", "aws:iam/role:Role",
        "aws:iam/rolePolicy:RolePolicy",
        "aws:kms/key:Key",  # the key that signs the job's image (a KMS key is billed by the month, used or not)
        "docker-build:index:Image",
        "pulumi-python:dynamic:Resource",  # the findings gate and the signature between the push and the job's image
        "pulumi:providers:aws", "trainstack:aws:ImageRepository", "trainstack:aws:JobIdentity",
        "trainstack:aws:SigningKey", "trainstack:aws:TrainerImage", "trainstack:aws:TrainingBucket",
        "trainstack:aws:TrainingStack",
    ]
    assert result.of_type("aws:s3/bucket:Bucket")
    # The same settings under the groups make a group, a launch template and the machines' role.
    groups = synth_raw({**SAGEMAKER, "scheduler": "groups"}, stack="unit")
    assert groups.of_type("aws:autoscaling/group:Group") and groups.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert not result.of_type("aws:iam/instanceProfile:InstanceProfile")


def test_the_role_is_trusted_by_sagemaker_for_this_runs_jobs(result):
    (role,) = result.of_type("aws:iam/role:Role")
    trust = json.loads(role["inputs"]["assumeRolePolicy"])
    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert statement["Condition"] == {
        "StringEquals": {"aws:SourceAccount": "123456789012"},
        "ArnLike": {"aws:SourceArn": "arn:aws:sagemaker:eu-west-1:123456789012:training-job/trainstack-unit-exp-7--*"},
    }


def test_the_job_output_holds_what_the_submit_needs(result):
    job = json.loads(result.outputs["sagemakerJob"])
    assert job["image"] == result.outputs["imageRef"] and "@sha256:" in job["image"]
    (role,) = result.of_type("aws:iam/role:Role")
    assert job["role_arn"].startswith("arn:aws:iam::123456789012:role/")
    assert (job["instance_type"], job["instance_count"], job["max_runtime_s"], job["spot"]) == \
        ("ml.g5.xlarge", 2, 6 * 3600, True)
    assert job["run_uri"] == result.outputs["runUri"] and job["job_prefix"] == "trainstack-unit-exp-7"
    assert all(isinstance(v, str) for v in job["hyperparameters"].values())
    assert job["hyperparameters"][environment.RUN_URI] == result.outputs["runUri"]
    assert result.outputs["groupName"] == ""


def test_hyperparameters_are_the_trainers_options_and_not_the_machines_keys():
    s = load_settings({"cloud": "aws", "region": "us-east-1", "scheduler": "sagemaker", "image": {"build": True},
                       "run": {"synthetic": True, "steps": 7, "extraArgs": ["--precision=mixed_float16"]}},
                      stack="dev")
    hp = hyperparameters(s, "s3://b/runs/dev")
    assert hp[environment.STEPS] == "7" and hp[environment.SYNTHETIC] == "1"
    assert hp[environment.EXTRA_ARGS] == "--precision=mixed_float16"
    assert not {environment.GROUP, environment.BOOT_URI, environment.NOTICE_GRACE_S, environment.POLL_S} & set(hp)
    # EC2's spot estimate is not SageMaker's price: none is recorded.
    assert not {environment.PRICE_PER_HOUR, environment.PRICE_NOTE} & set(hp)


def test_the_sagemaker_stack_file_synthesizes_a_job_role_and_no_group():
    r = synth_stack("sagemaker")
    types = {x["type"] for x in r.resources}
    assert "trainstack:aws:JobIdentity" in types and "trainstack:aws:TrainerImage" in types
    assert not {t for t in types if t.startswith(("aws:autoscaling", "aws:ec2", "aws:lambda", "aws:scheduler"))}
    job = json.loads(r.outputs["sagemakerJob"])
    assert (job["instance_type"], job["max_runtime_s"], job["volume_gb"]) == ("ml.g5.xlarge", 10 * 3600, 200)


def test_the_plan_says_what_the_job_is_and_that_its_price_is_an_estimate():
    from ops import synth

    r = synth_stack("sagemaker")
    text = synth.plan(r, load_stack_file(STACKS / "Pulumi.sagemaker.yaml"), ask_prices=False)
    assert "SageMaker: the run is one training job on ml.g5.xlarge x 1, managed spot, waiting and training within " \
           "10 h of its first start; nothing runs until `python -m ops start --stack sagemaker` submits it" in text
    assert "Price: an estimate. SageMaker publishes no spot price by API" in text
