"""TrainingStack for `scheduler: kubernetes`: the run as a Job on the user's own EKS or GKE cluster.

The cloud side is the groups' own pieces: the stack's bucket (`TrainingBucket` of its cloud) and an identity
that may touch only this run's prefix (the same statements and grants as the machines', `bucket_statements` /
`bucket_grants`), bound to the Job's ServiceAccount: an IAM role trusted by the cluster's OIDC issuer for that
one ServiceAccount (EKS IRSA), or a Google service account that ServiceAccount may act as (GKE Workload
Identity). The cluster side, through an explicit pulumi-kubernetes provider (a named context or the kubeconfig
held as a Pulumi secret, never the ambient one): the run's Namespace, ResourceQuota, LimitRange,
ServiceAccount, NetworkPolicy, with several nodes a headless Service, and the Job (`manifests.py`).

trainstack does not build the cluster; docs/kubernetes.md says what it must have. The run folder is the only
language shared with `ops` and the trainer: the Job's pods write it as the groups' machines do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.common import StackOutputs, TrainingStackArgs, run_uri
from components.kubernetes import manifests
from runfolder import environment

__all__ = ["TrainingStack", "TrainingStackArgs", "namespace_name"]

JOB_NAME = "train"
WORKERS_SERVICE = "workers"
# The script mode's own stop ends this long before the pod's grace does (the trainer records it meanwhile).
SCRIPT_STOP_MARGIN_S = 5


def namespace_name(settings: Any) -> str:
    """The run's namespace: the block's, or trainstack-<run id> within a DNS label's 63 characters."""
    k = settings.kubernetes
    return k.namespace or f"trainstack-{settings.run_id}"[:63].rstrip("-")


def pod_env(settings: Any, run: str) -> dict[str, str]:
    """The trainer's options as its own variables (the groups' env file, less what belongs to a machine's boot),
    plus what a pod needs: a writable HOME, the region on AWS, and with several nodes every worker's address."""
    from components.userdata import boot_env

    s, k = settings, settings.kubernetes
    reads = {*environment.OPTIONS, environment.EXTRA_ARGS, environment.COMMAND}
    env = {key: v for key, v in boot_env(s, run_uri=run, group="", code_uri="").items() if key in reads}
    env[environment.PLACEMENT] = f"kubernetes {s.cloud} {s.region}"
    if s.run.command:
        env[environment.STOP_GRACE_S] = str(max(5, k.grace_seconds() - SCRIPT_STOP_MARGIN_S))
    env["HOME"] = "/tmp"
    if s.cloud == "aws":
        env["AWS_DEFAULT_REGION"] = s.region
    if s.compute.nodes > 1:
        env[environment.WORKERS] = manifests.worker_addresses(JOB_NAME, WORKERS_SERVICE, namespace_name(s),
                                                              s.compute.nodes)
    return env


def job_manifest(settings: Any, run: str) -> dict[str, Any]:
    """The Job for these settings, its run folder at `run`."""
    s, k, c = settings, settings.kubernetes, settings.compute
    affinity: dict[str, list[str]] = {}
    if "instance_types" in c.model_fields_set:
        affinity["node.kubernetes.io/instance-type"] = list(c.instance_types)
    if c.accelerator:
        affinity["cloud.google.com/gke-accelerator"] = [c.accelerator]
    return manifests.job(
        namespace_name(s), s.run_id, name=JOB_NAME, image=s.image.reference, args=[], env=pod_env(s, run),
        nodes=c.nodes, gpus=c.gpus_per_node, cpu=k.cpu, memory=k.memory,
        spot_nodes=k.spot_nodes if c.spot else None, node_affinity=affinity, grace_seconds=k.grace_seconds(),
        deadline_seconds=int(c.max_runtime_hours * 3600), backoff_limit=k.backoff_limit,
        ttl_seconds=k.ttl_seconds_after_finished, service=WORKERS_SERVICE if c.nodes > 1 else None)


def cluster_manifests(settings: Any, *, run: str, identity_annotations: dict[str, str]) -> list[dict[str, Any]]:
    """Every object the stack puts on the cluster, in the order they depend on each other."""
    s, k, c = settings, settings.kubernetes, settings.compute
    ns = namespace_name(s)
    out = [
        manifests.namespace(ns, s.run_id),
        manifests.resource_quota(ns, s.run_id, nodes=c.nodes, gpus=c.gpus_per_node, cpu=k.cpu, memory=k.memory),
        manifests.limit_range(ns, s.run_id, cpu=k.cpu, memory=k.memory),
        manifests.service_account(ns, s.run_id, annotations=identity_annotations),
        manifests.network_policy(ns, s.run_id, cloud=s.cloud),
    ]
    if c.nodes > 1:
        out.append(manifests.headless_service(ns, s.run_id, WORKERS_SERVICE))
    out.append(job_manifest(s, run))
    return out


# pulumi-kubernetes' resource class of each kind the stack makes.
RESOURCE_CLASSES = {
    "Namespace": k8s.core.v1.Namespace, "ResourceQuota": k8s.core.v1.ResourceQuota,
    "LimitRange": k8s.core.v1.LimitRange, "ServiceAccount": k8s.core.v1.ServiceAccount,
    "NetworkPolicy": k8s.networking.v1.NetworkPolicy, "Service": k8s.core.v1.Service, "Job": k8s.batch.v1.Job,
}


def provider(name: str, settings: Any, parent: pulumi.Resource) -> k8s.Provider:
    """The cluster's provider: a named context, or the kubeconfig held as the Pulumi secret kubernetes:kubeconfig.
    Never the ambient current context."""
    k = settings.kubernetes
    opts = pulumi.ResourceOptions(parent=parent)
    if k.kubeconfig_secret:
        kubeconfig = pulumi.Config("kubernetes").get_secret("kubeconfig")
        if kubeconfig is None:
            raise pulumi.RunError("kubernetes:kubeconfig: is required by trainstack:kubernetes.kubeconfigSecret; "
                                  'pulumi config set --secret kubernetes:kubeconfig "$(cat KUBECONFIG_FILE)"')
        return k8s.Provider(f"{name}-k8s", kubeconfig=kubeconfig, opts=opts)
    return k8s.Provider(f"{name}-k8s", context=k.context, opts=opts)


class TrainingStack(StackOutputs):
    """Everything one training run on a Kubernetes cluster needs: bucket, identity, and the run's objects."""

    def __init__(self, name: str, args: TrainingStackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:kubernetes:TrainingStack", name, None, opts)
        s = args.settings
        ns = namespace_name(s)
        cloud = _AwsSide(self, name, args, ns) if s.cloud == "aws" else _GcpSide(self, name, args, ns)
        run = run_uri(s.cloud, cloud.bucket_name, s.run_id)
        self.k8s_provider = provider(name, s, self)
        at_cluster = pulumi.ResourceOptions(parent=self, providers={"kubernetes": self.k8s_provider})
        objects = pulumi.Output.all(run, cloud.annotations).apply(
            lambda v: cluster_manifests(s, run=v[0], identity_annotations=v[1]))
        self.objects: dict[str, pulumi.Resource] = {}
        previous: list[pulumi.Resource] = []
        kinds = [m["kind"] for m in cluster_manifests(s, run="", identity_annotations={})]
        for i, kind in enumerate(kinds):
            manifest = objects.apply(lambda ms, i=i: ms[i])
            fields = {arg: manifest.apply(lambda m, key=key: m.get(key)) for arg, key in _fields(kind)}
            # The namespace and its guards first; the Job last, once its quota, account and policy exist.
            resource = RESOURCE_CLASSES[kind](f"{name}-{kind.lower()}", **fields,
                                              opts=pulumi.ResourceOptions.merge(
                                                  at_cluster, pulumi.ResourceOptions(depends_on=list(previous))))
            self.objects[kind] = resource
            previous = [resource] if kind == "Namespace" else [*previous, resource]
        self._set_outputs(s, bucket_name=cloud.bucket_name, run_uri=run, image_ref=pulumi.Output.from_input(
            s.image.reference), group_name=pulumi.Output.from_input(""), code_uri=pulumi.Output.from_input(""),
            gcp_project=s.project if s.cloud == "gcp" else None)


def _fields(kind: str) -> tuple[tuple[str, str], ...]:
    """(pulumi-kubernetes' keyword argument, the manifest's key) of each top-level field of a kind."""
    if kind == "ServiceAccount":
        return ("metadata", "metadata"), ("automount_service_account_token", "automountServiceAccountToken")
    if kind == "Namespace":
        return (("metadata", "metadata"),)
    return ("metadata", "metadata"), ("spec", "spec")


class _AwsSide:
    """EKS: the bucket and the pods' identity, in the stack's region through one explicit provider."""

    def __init__(self, parent: pulumi.Resource, name: str, args: TrainingStackArgs, ns: str):
        import pulumi_aws as aws

        from components.aws.bucket import TrainingBucket, TrainingBucketArgs
        from components.aws.naming import default_bucket_name
        from components.tags import aws_tags

        s = args.settings
        tags = aws_tags(project=args.project, stack=s.stack, run_id=s.run_id)
        home = aws.Provider(f"{name}-aws", region=s.region, opts=pulumi.ResourceOptions(parent=parent))
        at_home = pulumi.ResourceOptions(parent=parent, providers={"aws": home})
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOptions(provider=home, parent=parent)).account_id
        bucket_name = s.storage.bucket_name or account.apply(
            lambda acct: default_bucket_name(project=args.project, stack=s.stack, account_id=acct, region=s.region))
        bucket = TrainingBucket(f"{name}-bucket", TrainingBucketArgs(
            bucket_name=bucket_name, keep_on_destroy=s.storage.keep_on_destroy, adopt=args.adopt_bucket,
            noncurrent_days=s.storage.noncurrent_days, tags=tags), opts=at_home)
        identity = PodRole(f"{name}-pods", PodRoleArgs(
            bucket_arn=bucket.arn, run_id=s.run_id, oidc_issuer=s.kubernetes.oidc_issuer, namespace=ns,
            data_uri=s.run.data_uri, validation_data_uri=s.run.validation_data_uri, tags=tags), opts=at_home)
        self.bucket_name = bucket.name
        self.annotations = identity.role_arn.apply(manifests.irsa_annotations)


@dataclass(kw_only=True)
class PodRoleArgs:
    """Inputs of a PodRole."""

    bucket_arn: pulumi.Input[str]
    """ARN of the stack's bucket."""
    run_id: str
    """The run's folder: the role may write only under runs/<run_id>/."""
    oidc_issuer: str
    """The EKS cluster's OIDC issuer, without https://."""
    namespace: str
    """The run's namespace: its ServiceAccount `trainstack` alone may assume the role."""
    data_uri: str | None = None
    """s3://BUCKET/PREFIX of the training data, read only; None for synthetic data."""
    validation_data_uri: str | None = None
    """s3://BUCKET/PREFIX of the validation data, read only; None without."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the role."""


class PodRole(pulumi.ComponentResource):
    """EKS IRSA: an IAM role the run's ServiceAccount alone may assume, with the machines' bucket statements
    (the run's prefix, the package cache, the data read only) and nothing else: no image pull (the nodes pull),
    no group."""

    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: PodRoleArgs, opts: pulumi.ResourceOptions | None = None):
        import pulumi_aws as aws

        from components.aws.identity import bucket_statements, deployer_account, role_with_policy

        super().__init__("trainstack:kubernetes:PodRole", name, None, opts)
        partition, account = deployer_account(self)
        issuer, ns = args.oidc_issuer, args.namespace
        trust = pulumi.Output.all(partition, account).apply(lambda v: json.dumps(irsa_trust(
            f"arn:{v[0]}:iam::{v[1]}:oidc-provider/{issuer}", issuer, ns)))
        policy = pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": bucket_statements(
            partition=partition, bucket_arn=args.bucket_arn, run_id=args.run_id, data_uri=args.data_uri,
            validation_data_uri=args.validation_data_uri)})
        self.role: aws.iam.Role
        self.role, _ = role_with_policy(self, name, trust=trust, policy=policy, tags=args.tags,
                                        description="trainstack Job pods (IRSA): one run's bucket prefix")
        self.role_arn = self.role.arn
        self.register_outputs({"role_arn": self.role_arn})


def irsa_trust(provider_arn: str, issuer: str, ns: str) -> dict[str, Any]:
    """The role's trust: a web identity token of the cluster's issuer, for the run's ServiceAccount alone."""
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow",
        "Principal": {"Federated": provider_arn},
        "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {f"{issuer}:sub": f"system:serviceaccount:{ns}:trainstack",
                                       f"{issuer}:aud": "sts.amazonaws.com"}},
    }]}


class _GcpSide:
    """GKE: the bucket and a service account the Job's ServiceAccount alone may act as (Workload Identity)."""

    def __init__(self, parent: pulumi.Resource, name: str, args: TrainingStackArgs, ns: str):
        import pulumi_gcp as gcp

        from components.gcp.bucket import TrainingBucket, TrainingBucketArgs
        from components.gcp.identity import BucketAccess, bucket_grants
        from components.gcp.naming import default_bucket_name, service_account_id
        from components.tags import gcp_labels

        s = args.settings
        names = {"project": args.project, "stack": s.stack}
        home = gcp.Provider(f"{name}-gcp", project=s.project, region=s.region,
                            opts=pulumi.ResourceOptions(parent=parent))
        at_home = pulumi.ResourceOptions(parent=parent, providers={"gcp": home})
        bucket = TrainingBucket(f"{name}-bucket", TrainingBucketArgs(
            bucket_name=s.storage.bucket_name or default_bucket_name(**names, gcp_project=s.project, region=s.region),
            location=s.region, keep_on_destroy=s.storage.keep_on_destroy, adopt=args.adopt_bucket,
            noncurrent_days=s.storage.noncurrent_days,
            labels=gcp_labels(project=args.project, stack=s.stack, run_id=s.run_id)), opts=at_home)
        account = gcp.serviceaccount.Account(
            f"{name}-pods-sa", account_id=service_account_id(**names), display_name="trainstack Job pods",
            description="one run's bucket prefix, through GKE Workload Identity", opts=at_home)
        member = pulumi.Output.concat("serviceAccount:", account.email)
        bucket_grants(f"{name}-pods", BucketAccess(
            bucket_name=bucket.name, run_id=s.run_id, data_uri=s.run.data_uri,
            validation_data_uri=s.run.validation_data_uri, data_grant=s.run.data_grant), member=member, child=at_home)
        # Only the run's ServiceAccount in the run's namespace may act as the account.
        gcp.serviceaccount.IAMMember(
            f"{name}-pods-workload-identity", service_account_id=account.name, role="roles/iam.workloadIdentityUser",
            member=f"serviceAccount:{s.project}.svc.id.goog[{ns}/trainstack]", opts=at_home)
        self.bucket_name = bucket.name
        self.annotations = account.email.apply(manifests.workload_identity_annotations)
