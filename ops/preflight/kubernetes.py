"""Preflight on a Job stack's cluster (`trainstack:scheduler: kubernetes`): what the run needs from a cluster
trainstack does not build, read through the Kubernetes API as the stack reaches it (its named context or its
kubeconfig secret, never the current context), and the identity binding's cloud side.

- the cluster answers through `kubernetes.context` (or the kubeconfig secret), and runs Kubernetes 1.31 or later
  (the Job's podFailurePolicy is GA from 1.31; the manifests are validated at 1.31 to 1.35);
- a node with allocatable `nvidia.com/gpu` at all (else the NVIDIA device plugin is not running on any node),
  and one with the spot label `spotNodes` names and `gpusPerNode` of them (the Job could be scheduled);
- the namespace: absent (`pulumi up` creates it) or this run's; another's would refuse `pulumi up`;
- the identity binding: once the namespace is there, its ServiceAccount `trainstack` bears the annotation of the
  cloud's binding; on GKE the GPU nodes run the GKE metadata server (Workload Identity); on EKS the account has
  an IAM OIDC provider for `kubernetes.oidcIssuer` (IRSA), and the stack's bucket is checked as on the groups.

A node pool that scales from zero has no node to read: the node checks then say so in their fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from components import settings as config
from ops.preflight.common import NoCredentials, Problem, run_checks

# The oldest Kubernetes the Job's manifest is valid for (components/kubernetes/manifests.py SUPPORTED_VERSIONS).
MIN_MINOR = 31
GPU = "nvidia.com/gpu"
# The label GKE puts on the nodes of a pool that runs the GKE metadata server (Workload Identity's).
GKE_METADATA_LABEL = ("iam.gke.io/gke-metadata-server-enabled", "true")
IDENTITY_ANNOTATION = {"aws": "eks.amazonaws.com/role-arn", "gcp": "iam.gke.io/gcp-service-account"}
SERVICE_ACCOUNT = "trainstack"  # components/kubernetes/manifests.py's ServiceAccount
TIMEOUT_S = 20


def _scale_note(label: str) -> str:
    return (f"a node pool that scales from zero shows no node until a pod waits: if yours does (labelled {label}, "
            "with the device plugin), this check cannot see it")


def version_problems(version: Any) -> list[Problem]:
    """The API server's version (`/version`): 1.31 or later."""
    major, minor = str(version.major), re.match(r"\d+", str(version.minor or ""))
    if major == "1" and minor is not None and int(minor.group()) < MIN_MINOR:
        return [Problem(f"the cluster runs Kubernetes {version.git_version}; the Job's podFailurePolicy (evictions "
                        f"not counted as failures) needs 1.{MIN_MINOR} or later",
                        f"upgrade the cluster to 1.{MIN_MINOR} or later (the manifests are validated at 1.31-1.35)")]
    return []


def _gpus(node: Any) -> int:
    raw = str((node.status.allocatable or {}).get(GPU, "0"))
    return int(raw) if raw.isdigit() else 0


def node_problems(settings: config.Settings, nodes: list) -> list[Problem]:
    """A node with allocatable GPUs at all (the device plugin), and one with the spot label and enough of them;
    on GKE, Workload Identity's metadata server on the GPU nodes."""
    from components.kubernetes.manifests import SPOT_LABELS

    k, c = settings.kubernetes, settings.compute
    gpu_nodes = [n for n in nodes if _gpus(n) > 0]
    key, value = SPOT_LABELS[k.spot_nodes]
    label = f"{key}={value}" if c.spot else "any label"
    if not gpu_nodes:
        return [Problem(f"no node of the cluster ({len(nodes)} read) has allocatable {GPU}: the NVIDIA device plugin "
                        "runs on no GPU node, or no GPU node is up",
                        "on GKE add a GPU node pool (GKE installs the plugin); on EKS use the GPU AMIs with the "
                        f"nvidia-device-plugin DaemonSet, or the NVIDIA GPU Operator; {_scale_note(label)}")]
    fit = [n for n in gpu_nodes if _gpus(n) >= c.gpus_per_node
           and (not c.spot or (n.metadata.labels or {}).get(key) == value)]
    problems = []
    if not fit:
        seen = ", ".join(f"{n.metadata.name} ({_gpus(n)}, {key}={(n.metadata.labels or {}).get(key, '-')})"
                         for n in gpu_nodes[:3])
        problems.append(Problem(
            f"no GPU node has the label {key}={value} (kubernetes.spotNodes: {k.spot_nodes}) and {c.gpus_per_node} "
            f"allocatable {GPU} (compute.gpusPerNode); GPU nodes: {seen}" if c.spot else
            f"no node has {c.gpus_per_node} allocatable {GPU} (compute.gpusPerNode); GPU nodes: {seen}",
            f"add a spot GPU node pool with that label, or set kubernetes.spotNodes to the label yours carry; "
            f"{_scale_note(label)}"))
    if settings.cloud == "gcp":
        with_server = [n for n in (fit or gpu_nodes)
                       if (n.metadata.labels or {}).get(GKE_METADATA_LABEL[0]) == GKE_METADATA_LABEL[1]]
        if not with_server:
            problems.append(Problem(
                f"Workload Identity: the GPU nodes ({', '.join(n.metadata.name for n in (fit or gpu_nodes)[:3])}) "
                f"lack {GKE_METADATA_LABEL[0]}={GKE_METADATA_LABEL[1]}: the pods would get the node's identity, "
                "not the run's service account",
                "gcloud container clusters update CLUSTER --workload-pool=PROJECT.svc.id.goog, then gcloud container "
                "node-pools update POOL --cluster CLUSTER --workload-metadata=GKE_METADATA"))
    return problems


def namespace_problems(settings: config.Settings, core: Any) -> list[Problem]:
    """The namespace is absent (the stack creates it) or this run's, and then its ServiceAccount bears the
    identity binding's annotation."""
    from kubernetes.client.exceptions import ApiException

    from components.kubernetes.manifests import labels
    from components.kubernetes.stack import namespace_name

    ns = namespace_name(settings)
    try:
        found = core.read_namespace(ns, _request_timeout=TIMEOUT_S)
    except ApiException as e:
        if e.status == 404:
            return []
        raise
    mine = labels(settings.run_id)
    have = found.metadata.labels or {}
    if any(have.get(key) != value for key, value in mine.items()):
        return [Problem(f"kubernetes.namespace: {ns} exists and is not this run's (its labels lack "
                        f"{', '.join(f'{key}={value}' for key, value in mine.items())}): `pulumi up` would fail "
                        "to create it",
                        "name another kubernetes.namespace, or delete that namespace if it is a left-over")]
    annotation = IDENTITY_ANNOTATION[settings.cloud]
    try:
        account = core.read_namespaced_service_account(SERVICE_ACCOUNT, ns, _request_timeout=TIMEOUT_S)
    except ApiException as e:
        if e.status != 404:
            raise
        account = None
    if account is None or not (account.metadata.annotations or {}).get(annotation):
        what = "is missing" if account is None else f"lacks the annotation {annotation}"
        return [Problem(f"the ServiceAccount {ns}/{SERVICE_ACCOUNT} {what}: the pods would not get the run's "
                        "identity and could not write the run folder",
                        "run `pulumi up` again (the stack makes it), and do not edit it by hand")]
    return []


def oidc_problems(settings: config.Settings, iam: Any) -> list[Problem]:
    """EKS IRSA: the account has an IAM OIDC provider for the cluster's issuer (the role's trust names it)."""
    issuer = settings.kubernetes.oidc_issuer
    arns = [p["Arn"] for p in iam.list_open_id_connect_providers().get("OpenIDConnectProviderList", [])]
    if any(arn.endswith(f":oidc-provider/{issuer}") for arn in arns):
        return []
    return [Problem(f"kubernetes.oidcIssuer: the account has no IAM OIDC provider for {issuer}: the pods' IRSA "
                    "role could not be assumed",
                    "eksctl utils associate-iam-oidc-provider --cluster CLUSTER --approve (or create one for "
                    f"https://{issuer} in IAM)")]


def cluster_problems(settings: config.Settings, client: Any) -> list[Problem]:
    """Every check the cluster answers; an unreachable cluster is one problem, the others unasked."""
    from kubernetes import client as k

    k8s = settings.kubernetes
    where = (f"kubernetes.context {k8s.context}" if k8s.context is not None
             else "the kubeconfig of kubernetes.kubeconfigSecret")
    try:
        version = k.VersionApi(client).get_code(_request_timeout=TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - refused, unreachable, a bad certificate: each is the same one line
        return [Problem(f"{where}: the cluster did not answer ({_describe(e)})",
                        "check the context's server, credentials and network (kubectl --context ... version)")]
    core = k.CoreV1Api(client)
    return [*version_problems(version), *run_checks([
        ("the nodes", lambda: node_problems(settings, core.list_node(_request_timeout=TIMEOUT_S).items)),
        ("the namespace", lambda: namespace_problems(settings, core)),
    ], _describe)]


def check_kubernetes(settings: config.Settings, *, stack: str, client: Any = None,
                     aws_session: Any = None) -> list[Problem]:
    """The cluster's checks and, on EKS, the identity binding's and the bucket's in the account."""
    from kubernetes.config.config_exception import ConfigException

    from ops import hosts, kube

    problems: list[Problem] = []
    if client is None:
        try:
            client = kube.stack_client(settings, stack)
        except config.ConfigError as e:  # already one line naming the key
            problems.append(Problem(str(e), "then run preflight again"))
        except (ConfigException, hosts.HostsError, OSError) as e:
            key = "kubernetes.context" if settings.kubernetes.context else "kubernetes.kubeconfigSecret"
            problems.append(Problem(f"{key}: the cluster cannot be reached: {' '.join(str(e).split())[:300]}",
                                    "name a context of your kubeconfig file (KUBECONFIG or ~/.kube/config), "
                                    "as kubectl config get-contexts lists them"))
    if client is not None:
        problems += cluster_problems(settings, client)
    if settings.cloud == "aws":
        problems += _aws_problems(settings, aws_session)
    return problems


def _aws_problems(settings: config.Settings, session: Any) -> list[Problem]:
    import boto3
    import botocore.exceptions

    from ops.preflight.aws import _aws_error, _usable_credentials, aws_bucket_problems

    try:
        session = session or boto3.session.Session(region_name=settings.region)
    except botocore.exceptions.ProfileNotFound as e:
        raise NoCredentials("AWS", str(e), "name a profile of ~/.aws/config in AWS_PROFILE, or unset it") from e
    if getattr(session, "get_credentials", None) is not None:
        _usable_credentials(session)  # none: one line for the whole account side, as on the groups
    client = lambda name: session.client(name, region_name=settings.region)  # noqa: E731 - one line, local
    checks: list[tuple[str, Callable[[], list[Problem]]]] = [
        ("the IAM OIDC provider", lambda: oidc_problems(settings, client("iam"))),
        ("bucket", lambda: aws_bucket_problems(settings, client("s3"), client("sts"))),
    ]
    return run_checks(checks, _aws_error)


def _describe(e: Exception) -> str:
    status = getattr(e, "status", None)
    if status is not None and getattr(e, "reason", None):
        return f"{type(e).__name__}: {status} {e.reason}"
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
