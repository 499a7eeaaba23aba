"""The `trainstack:kubernetes` block (with `trainstack:scheduler: kubernetes`): the run as a Job on the user's
own cluster, and the checks that block and the rest of the stack must pass together.

How the stack reaches the cluster is said explicitly, never taken from the ambient kubeconfig: either a named
`context` of the operator's kubeconfig file, or `kubeconfigSecret: true`, the whole kubeconfig held as the
Pulumi secret `kubernetes:kubeconfig` (`pulumi config set --secret kubernetes:kubeconfig "$(cat FILE)"`), in the
provider's own namespace as every credential is: trainstack's own keys hold no secret. `spotNodes` names the
cluster's kind of spot nodes, whose label the Job selects and whose taint it tolerates.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from components.settings.errors import ConfigError, keyed, refuse_set

# The image the groups run the shipped trainer code in: without the trainer a Job cannot use it.
DEFAULT_IMAGE_REPOSITORY = "tensorflow/tensorflow"

# The cloud each kind of spot nodes belongs to.
SPOT_NODES_CLOUD = {"gke": "gcp", "eks": "aws", "karpenter": "aws"}
# A Kubernetes quantity (the API's resource.Quantity): 4, 500m, 16Gi, 1.5.
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class KubernetesSettings(BaseModel):
    """The cluster the Job runs on: how to reach it, its namespace, its spot nodes, the pod's size and limits."""

    # The same rules as every other block (schema._Block): camelCase keys, unknown keys refused.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              allow_inf_nan=False)

    context: str | None = Field(None, description="A named context of your kubeconfig file (KUBECONFIG or "
                                "~/.kube/config); or set kubeconfigSecret.")
    kubeconfig_secret: bool = Field(False, description="true: the kubeconfig is the Pulumi secret "
                                    "kubernetes:kubeconfig (pulumi config set --secret).")
    namespace: str | None = Field(None, description="The namespace the stack creates and owns; default: "
                                  "trainstack-<run id>.")
    spot_nodes: Literal["gke", "eks", "karpenter"] = Field(description="The cluster's spot nodes: gke "
                                                           "(cloud.google.com/gke-spot), eks (managed node groups, "
                                                           "eks.amazonaws.com/capacityType) or karpenter "
                                                           "(karpenter.sh/capacity-type).")
    oidc_issuer: str | None = Field(None, description="EKS: the cluster's OIDC issuer without https:// "
                                    "(oidc.eks.REGION.amazonaws.com/id/ID), which IRSA trusts; required on AWS.")
    cpu: str = Field("4", description="CPU of each pod, requested and limited (a Kubernetes quantity).")
    memory: str = Field("16Gi", description="Memory of each pod, requested and limited (a Kubernetes quantity).")
    termination_grace_seconds: int | None = Field(
        None, ge=1, le=3600, description="The pod's terminationGracePeriodSeconds; default: 15 on gke (its spot "
        "nodes give pods 15 s of their 30 s notice), 90 on eks and karpenter (within the 2-minute notice, which "
        "reaches pods only through a termination handler: docs/kubernetes.md).")
    backoff_limit: int = Field(3, ge=0, le=100, description="Pod failures the Job tolerates (crashes; evictions "
                               "are not counted).")
    ttl_seconds_after_finished: int = Field(7 * 24 * 3600, ge=0, description="Seconds the finished Job and its pods "
                                            "(their logs) are kept.")

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if not _QUANTITY.fullmatch(str(v)):
            raise ValueError("expected a Kubernetes quantity such as 4, 500m or 16Gi")
        return str(v)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        if v is not None and not _DNS_LABEL.fullmatch(v):
            raise ValueError("expected a DNS label: lowercase letters, digits and '-', 1-63 characters")
        if v in ("default", "kube-system", "kube-public", "kube-node-lease"):
            raise ValueError("is the cluster's own; the stack creates and deletes its namespace: name another")
        return v

    @field_validator("oidc_issuer")
    @classmethod
    def _issuer(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"oidc\.eks\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/id/[A-Za-z0-9]+", v):
            raise ValueError("expected the EKS cluster's OIDC issuer without https://, e.g. "
                             "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE")
        return v

    @model_validator(mode="after")
    def _one_way_in(self) -> KubernetesSettings:
        if self.context is not None and self.kubeconfig_secret:
            raise keyed("context", "is set together with kubeconfigSecret: true; name one way to reach the cluster")
        if self.context is None and not self.kubeconfig_secret:
            raise keyed("context", "is required (or kubeconfigSecret: true): trainstack never takes the kubeconfig's "
                        "current context silently")
        if self.context is not None and not self.context.strip():
            raise keyed("context", "is empty; name a context of your kubeconfig (kubectl config get-contexts)")
        return self

    def grace_seconds(self) -> int:
        """The pod's terminationGracePeriodSeconds: the block's, or the spot nodes' notice (docs/kubernetes.md)."""
        if self.termination_grace_seconds is not None:
            return self.termination_grace_seconds
        return 15 if self.spot_nodes == "gke" else 90


def validate(s: Any) -> None:
    """Refuse a kubernetes block without its scheduler (and the reverse), spot nodes of the other cloud, and what
    a Job on a cluster cannot take, each in one line naming the key."""
    k = getattr(s, "kubernetes", None)
    if getattr(s, "scheduler", "groups") != "kubernetes":
        if k is not None:
            raise ConfigError("kubernetes", "is set but trainstack:scheduler is not kubernetes; set "
                              "scheduler: kubernetes or remove the block")
        return
    if k is None:
        raise ConfigError("kubernetes", "is required with scheduler kubernetes (at least: context and spotNodes)")
    cloud = SPOT_NODES_CLOUD[k.spot_nodes]
    if s.cloud != cloud:
        raise ConfigError("kubernetes.spotNodes", f"{k.spot_nodes!r}: are {cloud.upper()} nodes and this stack's "
                          f"cloud is {s.cloud}")
    if s.cloud == "aws" and not k.oidc_issuer:
        raise ConfigError("kubernetes.oidcIssuer", "is required on EKS: the pods' role trusts the cluster's OIDC "
                          "issuer (aws eks describe-cluster --query cluster.identity.oidc.issuer)")
    if s.cloud == "gcp" and k.oidc_issuer:
        raise ConfigError("kubernetes.oidcIssuer", "is EKS's; a GKE cluster's pods use Workload Identity: remove it")
    if s.image.build:
        raise ConfigError("image.build", "true: scheduler kubernetes does not build the image yet; build and push "
                          "trainer/Dockerfile yourself and give image.repository and image.digest")
    if not s.image.digest:
        raise ConfigError("image.digest", "is required with scheduler kubernetes: the Job runs the trainer's image "
                          "pinned by digest (sha256:…), never a tag that can move")
    if s.image.repository == DEFAULT_IMAGE_REPOSITORY:
        raise ConfigError("image.repository", f"{s.image.repository!r} has no trainer in it; give the repository "
                          "you pushed trainer/Dockerfile's image to")
    c = s.compute
    if len(s.placement_list) > 1:
        raise ConfigError("placements", f"{len(s.placement_list)} placements: a Job runs on one cluster; remove "
                          "placements")
    refuse_set("kubernetes", (
        ("compute.maxPricePerHour", c.max_price_per_hour, "the cluster's node pools set their own price"),
        ("compute.subnets", c.subnets, "the cluster places its nodes itself"),
        ("compute.zones", c.zones, "the cluster places its nodes itself"),
        ("compute.imageId", c.image_id, "the cluster's nodes boot their own image"),
        ("access.sshPublicKey", s.access.ssh_public_key, "nobody logs in to a pod; use kubectl"),
        ("access.allowedCidrs", s.access.allowed_cidrs, "nobody logs in to a pod; use kubectl"),
        ("access.jupyter", s.access.jupyter, "nobody logs in to a pod; use kubectl"),
        ("run.code", s.run.code, "the Job runs the image alone: bake your code into it (image.build)"),
    ))
