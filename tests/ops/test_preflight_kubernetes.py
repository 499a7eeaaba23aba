"""`python -m ops preflight` on a Job stack (ops/preflight/kubernetes.py): the cluster, read with the official
Kubernetes client from a fake API server on 127.0.0.1 (tests/ops/fake_kube_api.py), and on EKS the account (moto):
each thing the cluster lacks is one line naming the key or the missing thing; a clean cluster passes."""

from __future__ import annotations

import argparse
import os

import boto3
import pytest
import yaml
from moto import mock_aws

from components.kubernetes.manifests import labels
from components.kubernetes.stack import namespace_name
from ops import kube, preflight, synth
from ops.preflight import kubernetes as kp
from tests.ops.fake_kube_api import FakeKubeAPI
from tests.ops.test_kube import _job, _kubeconfig

EKS = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
GKE = synth.load_source(synth.STACKS_DIR / "Pulumi.gke.yaml").settings


def _node(name: str, *, gpus: int = 1, node_labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels or {}},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi", **({kp.GPU: str(gpus)} if gpus else {})}}}


EKS_SPOT = {"eks.amazonaws.com/capacityType": "SPOT"}
GKE_SPOT = {"cloud.google.com/gke-spot": "true", "iam.gke.io/gke-metadata-server-enabled": "true"}


def _problems(settings, api: FakeKubeAPI) -> list[str]:
    client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
    return [p.line() for p in kp.cluster_problems(settings, client)]


@pytest.mark.parametrize("settings, spot", [(EKS, EKS_SPOT), (GKE, GKE_SPOT)], ids=["eks", "gke"])
def test_a_cluster_with_spot_gpu_nodes_and_nothing_in_the_way_passes(settings, spot):
    with FakeKubeAPI(namespace_name(settings), _job()) as api:
        api.nodes = [_node("cpu-1", gpus=0), _node("gpu-1", node_labels=spot)]
        assert _problems(settings, api) == []
        reads = {r["path"] for r in api.requests}
    # The version, the nodes and the namespace were asked for (it is absent: `pulumi up` creates it).
    assert {"/version/", "/api/v1/nodes", f"/api/v1/namespaces/{namespace_name(settings)}"} <= reads


def _ours(settings, api: FakeKubeAPI, annotations: dict | None) -> None:
    ns = namespace_name(settings)
    api.namespaces[ns] = {"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": ns, "labels": labels(settings.run_id)}}
    if annotations is not None:
        api.service_accounts[(ns, "trainstack")] = {"apiVersion": "v1", "kind": "ServiceAccount",
                                                    "metadata": {"name": "trainstack", "namespace": ns,
                                                                 "annotations": annotations}}


@pytest.mark.parametrize("case, settings, setup, want", [
    ("old version", EKS, lambda a: a.version.update(minor="30+", gitVersion="v1.30.9-eks-1"),
     "the cluster runs Kubernetes v1.30.9-eks-1; the Job's podFailurePolicy"),
    ("no device plugin", EKS, lambda a: a.nodes.__setitem__(0, _node("gpu-1", gpus=0, node_labels=EKS_SPOT)),
     "no node of the cluster (1 read) has allocatable nvidia.com/gpu: the NVIDIA device plugin"),
    ("no spot label", EKS, lambda a: a.nodes.__setitem__(0, _node("gpu-1", node_labels={})),
     "no GPU node has the label eks.amazonaws.com/capacityType=SPOT (kubernetes.spotNodes: eks)"),
    ("too few GPUs", GKE.model_copy(update={"compute": GKE.compute.model_copy(update={"gpus_per_node": 2})}),
     lambda a: None,
     "no GPU node has the label cloud.google.com/gke-spot=true (kubernetes.spotNodes: gke) and 2 allocatable "
     "nvidia.com/gpu (compute.gpusPerNode)"),
    ("no metadata server", GKE, lambda a: a.nodes.__setitem__(0, _node("gpu-1", node_labels={
        "cloud.google.com/gke-spot": "true"})),
     "Workload Identity: the GPU nodes (gpu-1) lack iam.gke.io/gke-metadata-server-enabled=true"),
    ("another's namespace", EKS, lambda a: a.namespaces.__setitem__(namespace_name(EKS), {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace_name(EKS)}}),
     f"kubernetes.namespace: {namespace_name(EKS)} exists and is not this run's"),
    ("no service account", EKS, lambda a: _ours(EKS, a, None),
     f"the ServiceAccount {namespace_name(EKS)}/trainstack is missing"),
    ("no IRSA annotation", EKS, lambda a: _ours(EKS, a, {"other": "x"}),
     f"the ServiceAccount {namespace_name(EKS)}/trainstack lacks the annotation eks.amazonaws.com/role-arn"),
    ("no Workload Identity annotation", GKE, lambda a: _ours(GKE, a, {"eks.amazonaws.com/role-arn": "arn"}),
     f"the ServiceAccount {namespace_name(GKE)}/trainstack lacks the annotation iam.gke.io/gcp-service-account"),
])
def test_each_thing_the_cluster_lacks_is_one_line_naming_it(case, settings, setup, want):
    spot = EKS_SPOT if settings.cloud == "aws" else GKE_SPOT
    with FakeKubeAPI(namespace_name(settings), _job()) as api:
        api.nodes = [_node("gpu-1", node_labels=spot)]
        assert _problems(EKS if settings.cloud == "aws" else GKE, api) == []  # clean before the case's change
        setup(api)
        got = _problems(settings, api)
    assert len(got) == 1 and got[0].startswith(want), got
    assert "; fix: " in got[0] and "\n" not in got[0]


def test_an_unreachable_cluster_is_one_line_and_no_other_check(tmp_path):
    with FakeKubeAPI(namespace_name(EKS), _job()) as api:
        config = _kubeconfig(api) | {"current-context": "gpu"}
    # The server is gone: the client's connection is refused.
    got = [p.line() for p in kp.cluster_problems(EKS, kube.api_client(kubeconfig=config))]
    assert len(got) == 1 and got[0].startswith(f"kubernetes.context {EKS.kubernetes.context}: the cluster did not "
                                               "answer (")


def test_a_context_missing_from_the_kubeconfig_names_the_key(tmp_path, monkeypatch):
    (tmp_path / "config").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [],
                                                     "users": [], "contexts": []}))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "config"))
    settings = GKE  # no AWS side to ask
    got = [p.line() for p in kp.check_kubernetes(settings, stack="gke")]
    assert len(got) == 1 and got[0].startswith("kubernetes.context: the cluster cannot be reached: ")
    assert settings.kubernetes.context in got[0]


def _aws(with_provider: bool):
    iam = boto3.client("iam", region_name="us-east-1")
    if with_provider:
        iam.create_open_id_connect_provider(Url=f"https://{EKS.kubernetes.oidc_issuer}", ClientIDList=["sts.amazonaws.com"],
                                           ThumbprintList=["9" * 40])
    return boto3.session.Session(region_name="us-east-1")


@pytest.mark.parametrize("with_provider", [True, False])
def test_ops_preflight_on_an_eks_stack_checks_the_cluster_and_the_oidc_provider(with_provider, capsys,
                                                                                   monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws(), FakeKubeAPI(namespace_name(EKS), _job()) as api:
        api.nodes = [_node("gpu-1", node_labels=EKS_SPOT)]
        client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
        args = argparse.Namespace(stack="eks", stacks_dir=str(synth.STACKS_DIR))
        rc = preflight.cmd_preflight(args, aws_session=_aws(with_provider), kube_client=client)
    out = capsys.readouterr().out.strip().splitlines()
    if with_provider:
        assert (rc, out) == (0, [f"preflight eks: ok (aws, us-east-1, cluster of {EKS.kubernetes.context})"])
    else:
        assert rc == 1 and len(out) == 2, out
        assert out[0].startswith(f"kubernetes.oidcIssuer: the account has no IAM OIDC provider for "
                                 f"{EKS.kubernetes.oidc_issuer}")
        assert out[1] == "preflight eks: 1 problem(s); the Job would not run as asked"


def test_a_kubeconfig_secret_stack_is_reached_through_the_pulumi_cli(tmp_path, monkeypatch):
    """kubeconfigSecret: ops reads the secret as `pulumi config get` decrypts it, and its cluster only."""
    from tests.ops.test_status import fake_pulumi

    doc = yaml.safe_load((synth.STACKS_DIR / "Pulumi.gke.yaml").read_text())
    k = doc["config"]["trainstack:kubernetes"]
    del k["context"]
    k["kubeconfigSecret"] = True
    (tmp_path / "Pulumi.sec.yaml").write_text(yaml.safe_dump(doc))
    settings = synth.load_source(tmp_path / "Pulumi.sec.yaml").settings
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with FakeKubeAPI(namespace_name(settings), _job()) as api:
        api.nodes = [_node("gpu-1", node_labels=GKE_SPOT)]
        args_file = fake_pulumi(tmp_path / "bin", _kubeconfig(api) | {"current-context": "gpu"})
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
        assert kp.check_kubernetes(settings, stack="sec") == []
        assert kube.status_lines_for_stack("sec", stacks_dir=tmp_path)[0].startswith("job train: 1 active")
    assert args_file.read_text().splitlines()[1:] == ["config", "get", "kubernetes:kubeconfig", "--stack", "sec"]
    # The CLI printing no kubeconfig is one line naming the key.
    fake_pulumi(tmp_path / "bin", None)
    got = [p.line() for p in kp.check_kubernetes(settings, stack="sec")]
    assert len(got) == 1 and got[0].startswith("trainstack:kubernetes.kubeconfigSecret: pulumi config get "
                                               "kubernetes:kubeconfig --stack sec printed no kubeconfig")


def test_no_aws_credentials_on_an_eks_stack_is_one_line_exit_2(capsys):
    class NoCredentialsSession:
        def get_credentials(self):
            return None

    with FakeKubeAPI(namespace_name(EKS), _job()) as api:
        api.nodes = [_node("gpu-1", node_labels=EKS_SPOT)]
        client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
        args = argparse.Namespace(stack="eks", stacks_dir=str(synth.STACKS_DIR))
        assert preflight.cmd_preflight(args, aws_session=NoCredentialsSession(), kube_client=client) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ops preflight: no AWS credentials found (") and err.count("\n") == 1
