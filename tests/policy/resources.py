"""Hand-made resources in the synth shape: a clean AWS stack and a clean GCP one, built fresh per call.

They follow what the components register (input names of pulumi-aws 7.51 / pulumi-gcp 10.2,
camelCase as the mocks and the policy engine see them), so each rule test can break one
property of an otherwise clean stack and see exactly that rule fire.
"""

from __future__ import annotations

import base64
import json

STACK, RUN = "dev", "dev"
TAGS = {"trainstack-project": "trainstack", "trainstack-stack": STACK, "trainstack-run": RUN, "managed-by": "pulumi"}
BUCKET = "trainstack-dev-0123456789ab"
BUCKET_ARN = f"arn:aws:s3:::{BUCKET}"
GROUP = "trainstack-dev-gpu"
IMAGE = "tensorflow/tensorflow@sha256:" + "5a" * 32


def user_data(image: str = IMAGE, extra: str = "") -> str:
    """A #cloud-config document with the env file, as components.userdata renders it."""
    env = f"TRAINSTACK_CLOUD='aws'\nTRAINSTACK_IMAGE='{image}'\nTRAINSTACK_RUN_URI='s3://{BUCKET}/runs/{RUN}'\n{extra}"
    return "#cloud-config\nwrite_files:\n- path: /etc/trainstack/env\n  content: |\n" + "".join(
        f"    {line}\n" for line in env.splitlines()
    )


def _r(type_: str, name: str, parent: str | None, inputs: dict, options: dict | None = None) -> dict:
    return {"type": type_, "name": name, "parent": parent, "inputs": inputs, "options": options or {}}


def role_policy() -> dict:
    """The machine role's policy: scoped to this stack's bucket prefix, repository and group."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListRunPrefix", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": BUCKET_ARN,
             "Condition": {"StringLike": {"s3:prefix": [f"runs/{RUN}/*"]}}},
            {"Sid": "ReadWriteRun", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
             "Resource": f"{BUCKET_ARN}/runs/{RUN}/*"},
            {"Sid": "EcrLogin", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
            {"Sid": "PullStackImage", "Effect": "Allow",
             "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
             "Resource": "arn:aws:ecr:us-east-1:123456789012:repository/trainstack/dev"},
            {"Sid": "ScaleOwnGroup", "Effect": "Allow",
             "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:UpdateAutoScalingGroup"],
             "Resource": f"arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/{GROUP}"},
        ],
    }


def trust_policy() -> dict:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


def bucket_policy() -> dict:
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
         "Resource": [BUCKET_ARN, f"{BUCKET_ARN}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


def aws_stack(*, ssh_cidrs: list[str] | None = None, nodes: int = 1) -> list[dict]:
    """A clean AWS stack: every rule stays quiet on it."""
    b, g = "dev-bucket", "dev-group"
    ingress = []
    if ssh_cidrs:
        ingress.append({"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ssh_cidrs})
    if nodes > 1:
        ingress.append({"protocol": "tcp", "fromPort": 2222, "toPort": 2231, "self": True})
    keep = {"retainOnDelete": True}
    return [
        _r("aws:s3/bucket:Bucket", "dev-bucket", b, {"bucket": BUCKET, "forceDestroy": False, "tags": dict(TAGS)}, keep),
        _r("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "dev-bucket-public-access", b,
           {"bucket": BUCKET, "blockPublicAcls": True, "blockPublicPolicy": True, "ignorePublicAcls": True,
            "restrictPublicBuckets": True}, keep),
        _r("aws:s3/bucketVersioning:BucketVersioning", "dev-bucket-versioning", b,
           {"bucket": BUCKET, "versioningConfiguration": {"status": "Enabled"}}, keep),
        _r("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration", "dev-bucket-encryption", b,
           {"bucket": BUCKET, "rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"},
                                         "bucketKeyEnabled": True}]}, keep),
        _r("aws:s3/bucketPolicy:BucketPolicy", "dev-bucket-policy", b,
           {"bucket": BUCKET, "policy": json.dumps(bucket_policy())}, keep),
        _r("aws:iam/role:Role", "dev-identity-role", "dev-identity",
           {"assumeRolePolicy": json.dumps(trust_policy()), "tags": dict(TAGS)}),
        _r("aws:iam/rolePolicy:RolePolicy", "dev-identity-policy", "dev-identity",
           {"role": "dev-identity-role", "policy": json.dumps(role_policy())}),
        _r("aws:iam/instanceProfile:InstanceProfile", "dev-identity-profile", "dev-identity",
           {"role": "dev-identity-role", "tags": dict(TAGS)}),
        _r("aws:ecr/repository:Repository", "dev-repo", "dev-images",
           {"name": "trainstack/dev", "imageTagMutability": "IMMUTABLE",
            "imageScanningConfiguration": {"scanOnPush": True}, "tags": dict(TAGS)}),
        _r("aws:ec2/securityGroup:SecurityGroup", "dev-group-sg", g,
           {"ingress": ingress, "egress": [{"protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"]}],
            "tags": dict(TAGS)}),
        _r("aws:ec2/launchTemplate:LaunchTemplate", "dev-group-lt", g, {
            "userData": base64.b64encode(user_data().encode()).decode(),
            "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1},
            "blockDeviceMappings": [{"deviceName": "/dev/sda1", "ebs": {"volumeType": "gp3", "volumeSize": 200,
                                                                         "encrypted": "true"}}],
            "tagSpecifications": [{"resourceType": k, "tags": dict(TAGS)} for k in ("instance", "volume")],
            "tags": dict(TAGS)}),
        _r("aws:autoscaling/group:Group", "dev-group-asg", g, {
            "name": GROUP, "minSize": 0, "maxSize": nodes, "desiredCapacity": nodes, "capacityRebalance": True,
            "mixedInstancesPolicy": {
                "instancesDistribution": {"onDemandBaseCapacity": 0, "onDemandPercentageAboveBaseCapacity": 0,
                                          "spotAllocationStrategy": "price-capacity-optimized"},
                "launchTemplate": {"overrides": [{"instanceType": "g5.xlarge"}]}},
            "tags": [{"key": k, "value": v, "propagateAtLaunch": False} for k, v in sorted(TAGS.items())]},
           {"ignoreChanges": ["desiredCapacity"]}),
        _r("aws:autoscaling/schedule:Schedule", "dev-group-runtime-cap", g, {
            "scheduledActionName": f"{GROUP}-runtime-cap", "autoscalingGroupName": GROUP,
            "minSize": 0, "maxSize": 0, "desiredCapacity": 0, "startTime": "2026-12-01T10:00:00Z"}),
    ]


GLABELS = {k: v for k, v in TAGS.items()}


def gcp_stack() -> list[dict]:
    """A clean GCP stack (bucket, template, group, firewall) for the rules that cover GCP."""
    return [
        _r("gcp:storage/bucket:Bucket", "dev-bucket", "dev-bucket-c", {
            "name": "trainstack-dev-0123", "location": "US-CENTRAL1", "uniformBucketLevelAccess": True,
            "publicAccessPrevention": "enforced", "versioning": {"enabled": True}, "forceDestroy": False,
            "labels": dict(GLABELS)}, {"retainOnDelete": True}),
        _r("gcp:storage/bucketIAMMember:BucketIAMMember", "dev-bucket-sa", "dev-bucket-c", {
            "bucket": "trainstack-dev-0123", "role": "roles/storage.objectAdmin",
            "member": "serviceAccount:trainstack-dev@p.iam.gserviceaccount.com"}),
        _r("gcp:compute/instanceTemplate:InstanceTemplate", "dev-group-tpl", "dev-group", {
            "machineType": "g2-standard-4",
            "metadata": {"user-data": user_data(), "block-project-ssh-keys": "true"},
            "shieldedInstanceConfig": {"enableVtpm": True, "enableIntegrityMonitoring": True},
            "scheduling": {"provisioningModel": "SPOT", "preemptible": True, "instanceTerminationAction": "DELETE",
                           "maxRunDuration": {"seconds": 36000}},
            "labels": dict(GLABELS)}),
        _r("gcp:compute/instanceGroupManager:InstanceGroupManager", "dev-group-mig", "dev-group", {
            "targetSize": 1, "baseInstanceName": "trainstack-dev"}),
        _r("gcp:projects/iAMMember:IAMMember", "dev-identity-resize", "dev-identity", {
            "project": "my-project-123", "role": "roles/compute.instanceAdmin.v1",
            "member": "serviceAccount:trainstack-dev@p.iam.gserviceaccount.com",
            "condition": {"title": "own group only", "expression":
                          'resource.name.endsWith("/instanceGroupManagers/trainstack-dev-gpu")'}}),
        _r("gcp:compute/firewall:Firewall", "dev-group-workers", "dev-group", {
            "direction": "INGRESS", "sourceTags": ["trainstack-dev"], "targetTags": ["trainstack-dev"],
            "allows": [{"protocol": "tcp", "ports": ["2222-2231"]}]}),
    ]


def by_name(resources: list[dict], name: str) -> dict:
    """The one resource called `name` (a test mutates it in place)."""
    found = [r for r in resources if r["name"] == name]
    assert len(found) == 1, name
    return found[0]
