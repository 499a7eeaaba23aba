"""`ops preflight` on a Vertex AI stack: Vertex AI's own custom-training GPU quota in the region (Spot or on demand),
its API, the APIs `pulumi up` needs first and the data bucket; none of Compute Engine's quotas, zones or network.
The checks run against a fake `GcpApi`; the REST client's read of Service Usage's consumerQuotaMetrics against
answers of the documented shape.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from components import settings as config
from components.gcp.naming import PREREQUISITE_APIS
from components.project import STACKS_DIR
from ops import preflight
from ops.preflight import vertex as preflight_vertex
from ops.preflight.gcp_api import ApiDisabled, RestGcpApi

REGION = "us-central1"  # the vertex stack's: g2-standard-8 with one NVIDIA_L4, Spot
SPOT_L4 = "aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_l4_gpus"
L4 = "aiplatform.googleapis.com/custom_model_training_nvidia_l4_gpus"
ENABLED = set(PREREQUISITE_APIS) | {"aiplatform.googleapis.com"}


def stack(**compute) -> config.Settings:
    """The repository's `vertex` stack, with `compute` changed."""
    raw = copy.deepcopy(config.raw_from_config(config.read_stack_file(Path(STACKS_DIR) / "Pulumi.vertex.yaml")))
    raw["compute"].update(compute)
    return config.load_settings(raw, stack="vertex")


class FakeVertexGcp:
    """The reads a Vertex AI stack's preflight makes: the enabled services and Service Usage's quota limits by
    metric (region -> limit, "" for every other region's default), and every Cloud KMS permission. Any Compute Engine
    read fails the test."""

    def __init__(self, limits: dict[str, dict[str, float]], services: set[str] = ENABLED) -> None:
        self.limits, self.services, self.asked = limits, services, []

    def enabled_services(self, project: str) -> set[str]:
        return self.services

    def service_quota_limits(self, project: str, service: str, metric: str) -> dict[str, float] | None:
        self.asked.append((project, service, metric))
        return self.limits.get(metric)

    def project_permissions(self, project: str, permissions: list[str]) -> set[str]:
        return set(permissions)  # the deployer may make the image-signing key (test_preflight_signing.py)

    def __getattr__(self, name: str):
        raise AssertionError(f"a Vertex AI stack's preflight read {name}")


def test_enough_spot_quota_is_clean_and_no_compute_engine_read_is_made() -> None:
    api = FakeVertexGcp({SPOT_L4: {REGION: 1.0, "": 0.0}, L4: {"": 0.0}})
    assert preflight.check(stack(), gcp_api=api) == []
    assert api.asked == [("my-training-project", "aiplatform.googleapis.com", SPOT_L4)]


def test_a_new_project_s_zero_is_one_line_naming_the_metric_and_the_request() -> None:
    (p,) = preflight.check(stack(nodes=2), gcp_api=FakeVertexGcp({SPOT_L4: {"": 0.0}}))
    assert p.what.startswith("Vertex AI quota custom_model_training_preemptible_nvidia_l4_gpus (project "
                             f"my-training-project, region {REGION}) is 0; the job needs 2 (1 NVIDIA_L4 x 2 node(s))")
    assert p.fix.startswith(f"request 2 in IAM & Admin > Quotas (service aiplatform.googleapis.com, metric {SPOT_L4}, "
                            f"region {REGION};")


def test_a_region_without_its_own_value_gets_the_default() -> None:
    assert preflight.check(stack(), gcp_api=FakeVertexGcp({SPOT_L4: {"": 4.0}})) == []
    (p,) = preflight.check(stack(gpusPerNode=2, instanceTypes=["g2-standard-24"]),
                           gcp_api=FakeVertexGcp({SPOT_L4: {"": 1.0}}))
    assert "is 1; the job needs 2 (2 NVIDIA_L4 x 1 node(s))" in p.what


def test_another_region_s_quota_is_not_the_job_s() -> None:
    (p,) = preflight.check(stack(), gcp_api=FakeVertexGcp({SPOT_L4: {"us-east4": 8.0, "": 0.0}}))
    assert f"region {REGION}) is 0" in p.what


def test_no_limit_is_room() -> None:
    assert preflight.check(stack(), gcp_api=FakeVertexGcp({SPOT_L4: {REGION: -1.0}})) == []


@pytest.mark.parametrize("spot, metric", [(True, SPOT_L4), (False, L4)])
def test_spot_and_on_demand_draw_on_their_own_quota(spot: bool, metric: str) -> None:
    # The other kind has room; the job's own kind has none (a Spot job does not fall back to the standard one).
    other = L4 if spot else SPOT_L4
    api = FakeVertexGcp({metric: {"": 0.0}, other: {"": 8.0}})
    (p,) = preflight.check(stack(spot=spot), gcp_api=api)
    assert f"metric {metric}," in p.fix
    assert [m for _, _, m in api.asked] == [metric]


@pytest.mark.parametrize("kind, spot, metric", [
    ("NVIDIA_TESLA_T4", True, "aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_t4_gpus"),
    ("NVIDIA_TESLA_T4", False, "aiplatform.googleapis.com/custom_model_training_nvidia_t4_gpus"),
    ("NVIDIA_A100_80GB", True, "aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_a100_80gb_gpus"),
    ("NVIDIA_TESLA_A100", False, "aiplatform.googleapis.com/custom_model_training_nvidia_a100_gpus"),
    ("NVIDIA_H100_80GB", True, "aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_h100_gpus"),
])
def test_vertex_gpu_metrics(kind: str, spot: bool, metric: str) -> None:
    assert preflight_vertex.vertex_gpu_metric(kind, spot=spot) == metric


def test_an_n1_machine_s_accelerator_is_the_one_checked() -> None:
    s = stack(instanceTypes=["n1-standard-8"], accelerator="nvidia-tesla-t4", gpusPerNode=4)
    (p,) = preflight.check(s, gcp_api=FakeVertexGcp({
        "aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_t4_gpus": {"": 2.0}}))
    assert "is 2; the job needs 4 (4 NVIDIA_TESLA_T4 x 1 node(s))" in p.what


def test_a_metric_vertex_ai_does_not_have_says_it_cannot_be_checked() -> None:
    (p,) = preflight.check(stack(), gcp_api=FakeVertexGcp({}))
    assert p.what.startswith("Vertex AI has no per-region quota custom_model_training_preemptible_nvidia_l4_gpus")


def test_the_vertex_ai_api_off_is_one_line_and_no_quota_is_read() -> None:
    api = FakeVertexGcp({SPOT_L4: {"": 8.0}}, services=set(PREREQUISITE_APIS))
    (p,) = preflight.check(stack(), gcp_api=api)
    assert p.what.startswith("the Vertex AI API (aiplatform.googleapis.com) is off in project my-training-project")
    assert p.fix.startswith("gcloud services enable aiplatform.googleapis.com --project my-training-project")
    assert api.asked == []


def test_an_api_that_refuses_the_quota_read_as_off_is_named() -> None:
    class Off(FakeVertexGcp):
        def service_quota_limits(self, project: str, service: str, metric: str) -> dict[str, float] | None:
            raise ApiDisabled("serviceusage.googleapis.com", "Service Usage API has not been used")

    (p,) = preflight.check(stack(), gcp_api=Off({}))
    assert p.what.startswith("the API serviceusage.googleapis.com is off in project my-training-project")


def test_the_prerequisite_apis_are_still_checked() -> None:
    api = FakeVertexGcp({SPOT_L4: {"": 1.0}}, services={"aiplatform.googleapis.com"})
    (p,) = preflight.check(stack(), gcp_api=api)
    assert p.what.startswith("API(s) ") and "gcloud services enable" in p.fix


class FakeResponse:
    def __init__(self, status: int, doc: dict) -> None:
        self.status_code, self._doc, self.text = status, doc, str(doc)

    def json(self) -> dict:
        return self._doc


class FakeSession:
    def __init__(self, pages: dict[str, FakeResponse]) -> None:
        self.pages, self.asked = pages, []

    def get(self, url: str, params: dict | None = None, timeout: float = 0) -> FakeResponse:
        self.asked.append(url)
        return self.pages[url]


def test_the_rest_client_reads_service_usage_s_consumer_quota_metric() -> None:
    base = ("https://serviceusage.googleapis.com/v1beta1/projects/p/services/aiplatform.googleapis.com/"
            "consumerQuotaMetrics/aiplatform.googleapis.com%2F")
    name = "projects/123/services/aiplatform.googleapis.com/consumerQuotaMetrics/aiplatform.googleapis.com%2Fx"
    doc = {"name": name, "metric": SPOT_L4, "displayName": "Custom model training preemptible Nvidia L4 GPUs",
           "consumerQuotaLimits": [
               {"name": f"{name}/limits/%2Fproject", "unit": "1/{project}", "metric": SPOT_L4,
                "quotaBuckets": [{"effectiveLimit": "99", "defaultLimit": "99"}]},
               {"name": f"{name}/limits/%2Fproject%2Fregion", "unit": "1/{project}/{region}", "metric": SPOT_L4,
                "quotaBuckets": [
                    {"defaultLimit": "0"},  # proto3 JSON leaves out a zero effectiveLimit
                    {"effectiveLimit": "4", "defaultLimit": "0", "dimensions": {"region": "us-central1"}},
                    {"effectiveLimit": "7", "dimensions": {"region": "us-east4", "zone": "us-east4-a"}}]}]}
    session = FakeSession({base + "custom_model_training_preemptible_nvidia_l4_gpus": FakeResponse(200, doc),
                           base + "custom_model_training_nvidia_l4_gpus": FakeResponse(404, {"error": {"code": 404}})})
    api = RestGcpApi(session, anonymous=object())
    assert api.service_quota_limits("p", "aiplatform.googleapis.com", SPOT_L4) == {"": 0.0, "us-central1": 4.0}
    assert api.service_quota_limits("p", "aiplatform.googleapis.com", L4) is None
    off = FakeSession({base + "custom_model_training_nvidia_l4_gpus": FakeResponse(403, {"error": {
        "code": 403, "message": "Service Usage API has not been used", "details": [
            {"reason": "SERVICE_DISABLED", "metadata": {"service": "serviceusage.googleapis.com"}}]}})})
    with pytest.raises(ApiDisabled) as e:
        RestGcpApi(off, anonymous=object()).service_quota_limits("p", "aiplatform.googleapis.com", L4)
    assert e.value.service == "serviceusage.googleapis.com"
