"""The run's Kubernetes objects as plain manifests (dicts as the API spells them), without Pulumi.

`TrainingStack` (stack.py) hands these to pulumi-kubernetes; the tests validate the same dicts with the API's
own schemas (kubernetes-validate, strict) at every version in `SUPPORTED_VERSIONS`, and run the Job through the
fake Job controller (`tests/components/kubernetes/fake_controller.py`). One function per object.

Several nodes: an Indexed Job (`completionMode: Indexed`, parallelism = completions = compute.nodes) and a
headless Service; each pod's DNS name is `<job>-<index>.<service>` and its index comes as JOB_COMPLETION_INDEX,
from which the trainer's TF_CONFIG is made (`trainer/pod.py`). A plain Job rather than JobSet: JobSet is a CRD
a cluster must install first, and an Indexed Job with `podFailurePolicy` gives what the run needs (a stable
address per worker, a replaced pod at the same index, evictions not counted) on every supported version. The
cost: a worker that fails is replaced alone, while its peers exit `exits.PEER_LOST` and are replaced in turn
(JobSet would restart the whole set at once).
"""

from __future__ import annotations

from typing import Any

from runfolder import environment, exits

# The Kubernetes versions whose API the manifests are valid for (podFailurePolicy is GA since 1.31).
SUPPORTED_VERSIONS = ("1.31", "1.32", "1.33", "1.34", "1.35")
TRAINER_CONTAINER = "trainer"
# The exit code of a bad configuration: argparse's and the trainer's ConfigError (trainer/__main__.py). Another
# pod would fail the same way: the Job fails at once instead of spending its backoffLimit.
BAD_CONFIG_EXIT = 2
# Port the workers' collective runtime listens on (TF_CONFIG's addresses).
WORKER_PORT = 2222
GPU_RESOURCE = "nvidia.com/gpu"

# Each kind of spot nodes: the label the Job selects them by, and the taint (if any) it tolerates.
SPOT_LABELS = {
    "gke": ("cloud.google.com/gke-spot", "true"),
    "eks": ("eks.amazonaws.com/capacityType", "SPOT"),
    "karpenter": ("karpenter.sh/capacity-type", "spot"),
}
# GKE taints the GPU nodes it creates nvidia.com/gpu=present:NoSchedule (and spot node pools, when asked,
# cloud.google.com/gke-spot=true:NoSchedule); EKS's and Karpenter's GPU node pools are commonly tainted
# nvidia.com/gpu too. Tolerating a taint that is absent costs nothing.
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}

# The documented identity endpoints: GKE's metadata server (Workload Identity) answers pods at
# 169.254.169.254:80; with Dataplane V2 the network policy must also allow 169.254.169.252:988.
GKE_METADATA = [("169.254.169.254/32", 80), ("169.254.169.252/32", 988)]
# Link-local addresses (the node's instance metadata, whose role is not the pod's) stay closed to HTTPS egress.
LINK_LOCAL = "169.254.0.0/16"


def labels(run_id: str) -> dict[str, str]:
    """The labels of every object and of the Job's pods: what the NetworkPolicy and the Service select."""
    return {"app.kubernetes.io/name": "trainstack", "app.kubernetes.io/instance": run_id,
            "trainstack.dev/run": run_id}


def namespace(name: str, run_id: str) -> dict[str, Any]:
    """The run's namespace; pods there must meet the `restricted` Pod Security Standard."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
        **labels(run_id),
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}}


def resource_quota(ns: str, run_id: str, *, nodes: int, gpus: int, cpu: str, memory: str) -> dict[str, Any]:
    """At most the run's pods, GPUs, CPU and memory, twice over: a replacement pod may start while an evicted one
    is still terminating."""
    pods = 2 * nodes
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "trainstack", "namespace": ns, "labels": labels(run_id)},
            "spec": {"hard": {
                "pods": str(pods),
                f"requests.{GPU_RESOURCE}": str(pods * gpus),
                "requests.cpu": _times(cpu, pods), "limits.cpu": _times(cpu, pods),
                "requests.memory": _times(memory, pods), "limits.memory": _times(memory, pods),
                "count/jobs.batch": "2",
                "services.loadbalancers": "0", "services.nodeports": "0",
            }}}


def _times(quantity: str, n: int) -> str:
    """n times a quantity: the number scaled, the unit kept (16Gi x 2 = 32Gi; 500m x 3 = 1500m)."""
    i = len(quantity.rstrip("kMGTPEim"))
    number, unit = quantity[:i], quantity[i:]
    value = float(number) * n
    return (str(int(value)) if value == int(value) else f"{value:g}") + unit


def limit_range(ns: str, run_id: str, *, cpu: str, memory: str) -> dict[str, Any]:
    """A container that says nothing gets small requests and limits; none may exceed the trainer's size."""
    return {"apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": "trainstack", "namespace": ns, "labels": labels(run_id)},
            "spec": {"limits": [{
                "type": "Container",
                "default": {"cpu": "500m", "memory": "512Mi"},
                "defaultRequest": {"cpu": "100m", "memory": "128Mi"},
                "max": {"cpu": cpu, "memory": memory},
            }]}}


def service_account(ns: str, run_id: str, *, annotations: dict[str, str]) -> dict[str, Any]:
    """The pods' identity, bound to the cloud identity by `annotations` (IRSA role / Workload Identity account).
    No API token is mounted: the trainer never calls the Kubernetes API."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "trainstack", "namespace": ns, "labels": labels(run_id),
                         "annotations": annotations},
            "automountServiceAccountToken": False}


def irsa_annotations(role_arn: str) -> dict[str, str]:
    """EKS IRSA: the pod identity webhook gives the pods a token for this role."""
    return {"eks.amazonaws.com/role-arn": role_arn, "eks.amazonaws.com/sts-regional-endpoints": "true"}


def workload_identity_annotations(account_email: str) -> dict[str, str]:
    """GKE Workload Identity: the metadata server answers the pods as this Google service account."""
    return {"iam.gke.io/gcp-service-account": account_email}


def network_policy(ns: str, run_id: str, *, cloud: str) -> dict[str, Any]:
    """Deny by default; allow DNS, HTTPS to the store and the cloud's token service (not to the node's
    metadata), the cloud's identity endpoint, and traffic between the Job's own pods."""
    own = {"podSelector": {"matchLabels": labels(run_id)}}
    egress: list[dict[str, Any]] = [
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                 "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
         "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [LINK_LOCAL]}}], "ports": [{"protocol": "TCP", "port": 443}]},
        {"to": [own]},
    ]
    if cloud == "gcp":
        egress += [{"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": port}]}
                   for cidr, port in GKE_METADATA]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "trainstack", "namespace": ns, "labels": labels(run_id)},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [own]}], "egress": egress}}


def headless_service(ns: str, run_id: str, name: str) -> dict[str, Any]:
    """The workers' DNS names (`<job>-<index>.<name>`): no cluster IP, published before they are ready (each
    worker waits for its peers' ports itself)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": labels(run_id)},
            "spec": {"clusterIP": "None", "selector": labels(run_id), "publishNotReadyAddresses": True,
                     "ports": [{"name": "worker", "port": WORKER_PORT, "protocol": "TCP"}]}}


def pod_failure_policy() -> dict[str, Any]:
    """Evictions and spot terminations (the DisruptionTarget condition) are not failures; a bad configuration
    fails the Job at once; a trainer stopped by a signal after its checkpoint committed is replaced and resumes.
    Everything else counts against backoffLimit. Rules are evaluated in order; the first match wins."""
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": TRAINER_CONTAINER, "operator": "In",
                                              "values": [BAD_CONFIG_EXIT]}},
        {"action": "Ignore", "onExitCodes": {"containerName": TRAINER_CONTAINER, "operator": "In",
                                             "values": [exits.PREEMPTED]}},
    ]}


def job(ns: str, run_id: str, *, name: str, image: str, args: list[str], env: dict[str, str], nodes: int,
        gpus: int, cpu: str, memory: str, spot_nodes: str | None, node_affinity: dict[str, list[str]],
        grace_seconds: int, deadline_seconds: int, backoff_limit: int, ttl_seconds: int,
        service: str | None) -> dict[str, Any]:
    """The training Job: `nodes` indexed pods of the pinned image, one per node's GPUs, on spot nodes."""
    resources = {"cpu": cpu, "memory": memory, GPU_RESOURCE: str(gpus)}
    pod_env = [{"name": k, "value": v} for k, v in sorted(env.items())]
    # The downward API: the trainer knows its pod, node and namespace (events, logs, status).
    # The pod's name is its name in the run's lease, as an instance's id is on the groups.
    pod_env += [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": p}}} for n, p in (
        (environment.MACHINE_ID, "metadata.name"), (environment.POD_NAMESPACE, "metadata.namespace"),
        (environment.NODE_NAME, "spec.nodeName"))]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": "trainstack",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": grace_seconds,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "tolerations": [GPU_TOLERATION],
        "containers": [{
            "name": TRAINER_CONTAINER,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["python", "-m", "trainer.pod", *args],
            "env": pod_env,
            "resources": {"requests": resources, "limits": resources},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}],
        }],
        # The only writable places: scratch for checkpoints before upload, and shared memory for the data pipeline.
        "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}],
    }
    if spot_nodes is not None:
        key, value = SPOT_LABELS[spot_nodes]
        pod_spec["nodeSelector"] = {key: value}
        pod_spec["tolerations"] = [GPU_TOLERATION, {"key": key, "operator": "Equal", "value": value,
                                                    "effect": "NoSchedule"}]
    if node_affinity:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": k, "operator": "In", "values": v} for k, v in sorted(node_affinity.items())]}]}}}
    if service is not None:
        pod_spec["subdomain"] = service
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": labels(run_id)},
            "spec": {
                "completionMode": "Indexed",
                "completions": nodes,
                "parallelism": nodes,
                "backoffLimit": backoff_limit,
                "activeDeadlineSeconds": deadline_seconds,
                "ttlSecondsAfterFinished": ttl_seconds,
                "podFailurePolicy": pod_failure_policy(),
                # A replacement starts only once the evicted pod is gone: one trainer per index holds the lease.
                "podReplacementPolicy": "Failed",
                "template": {"metadata": {"labels": labels(run_id)}, "spec": pod_spec},
            }}


def worker_addresses(job_name: str, service: str, ns: str, nodes: int) -> str:
    """Every worker's address, by index: what TF_CONFIG's cluster lists (`trainer/pod.py`)."""
    return ",".join(f"{job_name}-{i}.{service}.{ns}.svc:{WORKER_PORT}" for i in range(nodes))
