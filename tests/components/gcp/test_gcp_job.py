"""What a Vertex AI stack's `ops start` would submit (components/gcp/job.py): the machine's GPUs in Vertex AI's
names (checked against the aiplatform v1 discovery document's enumeration), and the `vertexJob` output that
schedulers.vertex.JobSpec reads and turns into a CustomJob in the document's shape."""

from __future__ import annotations

import contextvars

import pulumi
import pytest

from components import catalog
from components.gcp import job
from components.settings import load_settings
from runfolder import environment
from schedulers import vertex
from tests.fixtures import discovery

DOC = discovery.document("aiplatform", "v1")
ENUM = DOC["schemas"]["GoogleCloudAiplatformV1MachineSpec"]["properties"]["acceleratorType"]["enum"]


@pytest.mark.parametrize("machine", sorted(catalog.GCP_GPU_MACHINES))
def test_every_gpu_machine_the_catalog_knows_has_vertex_s_name_and_its_count(machine):
    kind, count = job.accelerator(machine, None, 1)
    assert kind in ENUM and count == catalog.GCP_GPU_MACHINES[machine]


@pytest.mark.parametrize("n1", catalog.GCP_N1_ACCELERATORS)
def test_an_n1_machine_takes_its_accelerator_by_count(n1):
    assert job.accelerator("n1-standard-8", n1, 4) == (n1.upper().replace("-", "_"), 4)
    assert job.accelerator("n1-standard-8", n1, 4)[0] in ENUM


def test_a_machine_without_gpus_asks_for_none():
    assert job.accelerator("e2-standard-4", None, 1) == ("", 0)
    assert job.accelerator("n1-standard-4", None, 1) == ("", 0)


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args):
        return [f"{args.name}-id", args.inputs]

    def call(self, args):
        return {}


def test_the_job_output_reads_as_a_spec_whose_custom_job_the_document_accepts():
    s = load_settings({"cloud": "gcp", "region": "us-central1", "project": "my-project-123",
                       "run": {"synthetic": True, "steps": 7},
                       "compute": {"instanceTypes": ["a2-highgpu-2g"], "gpusPerNode": 2, "nodes": 2}}, stack="dev")
    seen: list[str] = []

    def run() -> None:
        pulumi.runtime.set_mocks(_Mocks(), project="trainstack", stack="unit", preview=False)

        @pulumi.runtime.test
        def rendered():
            out = job.job_spec(s, run_uri="gs://b/runs/dev", image="r/i@sha256:" + "b" * 64,
                               service_account="m@my-project-123.iam.gserviceaccount.com", job_prefix="trainstack-dev")
            return out.apply(seen.append)

        rendered()

    contextvars.copy_context().run(run)
    assert len(seen) == 1  # the apply ran
    spec = vertex.JobSpec.from_json(seen[0])
    assert (spec.accelerator_type, spec.accelerator_count, spec.nodes) == ("NVIDIA_TESLA_A100", 2, 2)
    assert spec.env[environment.STEPS] == "7" and environment.GROUP not in spec.env
    assert not {environment.PRICE_PER_HOUR, environment.PRICE_NOTE} & set(spec.env)
    body = vertex.custom_job(spec, name="trainstack-dev--1", deadline=1e9 + 60, now=1e9)
    assert discovery.invalid(body, {"$ref": "GoogleCloudAiplatformV1CustomJob"}, DOC["schemas"], "body") == []
