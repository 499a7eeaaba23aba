"""A `scheduler: vertex` stack (components/gcp/job.py): the bucket, the image repository with the built image,
the aiplatform API, the job's service account and Vertex AI's agents' grants; no group, template, schedule or
controller; and the `vertexJob` output `ops start` submits: the machine's GPUs in Vertex AI's names (checked
against the aiplatform v1 discovery document's enumeration), read by schedulers.vertex.JobSpec and turned into
a CustomJob in the document's shape."""

from __future__ import annotations

import contextvars

import pulumi
import pytest

from components import catalog
from components.gcp import job
from components.settings import load_settings
from ops import synth
from ops.fakes.gcp import project_number
from runfolder import environment
from schedulers import vertex
from tests.components.aws.helpers import STACKS
from tests.components.gcp.helpers import BUCKET_MEMBER, MIG, TEMPLATE, gcp
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


# -- the stack -------------------------------------------------------------------------------------------------

VERTEX = {"scheduler": "vertex", "image": {"build": True},
          "compute": {"instanceTypes": ["g2-standard-8"], "maxRuntimeHours": 6, "nodes": 2}}
ACCOUNT = "serviceAccount:ts-unit-54b5a4@my-proj-123.iam.gserviceaccount.com"
CODE_AGENT = f"serviceAccount:service-{project_number('my-proj-123')}@gcp-sa-aiplatform-cc.iam.gserviceaccount.com"
MAIN_AGENT = f"serviceAccount:service-{project_number('my-proj-123')}@gcp-sa-aiplatform.iam.gserviceaccount.com"


@pytest.fixture(scope="module")
def result():
    return gcp(VERTEX)


def _grants(result, member: str) -> list[tuple[str, str]]:
    """(type, role) of every grant to `member`."""
    return sorted((r["type"].rsplit(":", 1)[-1], r["inputs"]["role"]) for r in result.resources
                  if r["inputs"].get("member") == member)


def test_only_what_the_job_needs_and_nothing_that_idles(result):
    types = sorted({r["type"] for r in result.resources})
    assert types == [
        "docker-build:index:Image", "gcp:artifactregistry/repository:Repository",
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember",
        # The built image is signed as every built image is (components/gcp/signing_key.py): Vertex AI checks
        # no signature, but the digest it runs is the one the findings gate passed and the key signed.
        "gcp:kms/cryptoKey:CryptoKey", "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember",
        "gcp:kms/cryptoKeyVersion:CryptoKeyVersion", "gcp:kms/keyRing:KeyRing", "gcp:projects/iAMMember:IAMMember",
        "gcp:projects/service:Service", "gcp:projects/serviceIdentity:ServiceIdentity",
        "gcp:serviceaccount/account:Account", "gcp:serviceaccount/iAMMember:IAMMember",
        "gcp:storage/bucket:Bucket", "gcp:storage/bucketIAMMember:BucketIAMMember",
        "pulumi-python:dynamic:Resource",  # the findings gate between the push and the job's image, the signature
        "pulumi:providers:gcp", "random:index/randomId:RandomId", "trainstack:gcp:ImageRepository",
        "trainstack:gcp:JobIdentity", "trainstack:gcp:SigningKey", "trainstack:gcp:TrainerImage",
        "trainstack:gcp:TrainingBucket", "trainstack:gcp:TrainingStack",
    ]
    # The same settings under the groups make a group, an instance template and the machines' account.
    groups = gcp({**VERTEX, "scheduler": "groups"})
    assert groups.of_type(MIG) and groups.of_type(TEMPLATE)
    assert not result.of_type(MIG) and not result.of_type("gcp:cloudscheduler/job:Job")


def test_the_aiplatform_api_is_on_and_vertex_s_agent_is_asked_for_after_it(result):
    apis = {r["inputs"]["service"]: r for r in result.of_type("gcp:projects/service:Service")}
    assert "aiplatform.googleapis.com" in apis and apis["aiplatform.googleapis.com"]["inputs"]["project"] == "my-proj-123"
    assert "cloudscheduler.googleapis.com" not in apis  # no runtime-cap schedule: the job's timeout is the cap
    assert "aiplatform.googleapis.com" not in {r["inputs"]["service"] for r in gcp({**VERTEX, "scheduler": "groups"})
                                                .of_type("gcp:projects/service:Service")}
    (agent,) = result.of_type("gcp:projects/serviceIdentity:ServiceIdentity")
    assert agent["inputs"] == {"project": "my-proj-123", "service": "aiplatform.googleapis.com"}
    assert apis["aiplatform.googleapis.com"]["name"] in agent["options"]["dependsOn"]


def test_the_jobs_account_reaches_the_runs_prefix_the_cache_and_its_logs_only(result):
    (account,) = result.of_type("gcp:serviceaccount/account:Account")
    assert account["inputs"]["accountId"] == "ts-unit-54b5a4"
    assert _grants(result, ACCOUNT) == [
        ("BucketIAMMember", "roles/storage.objectCreator"), ("BucketIAMMember", "roles/storage.objectUser"),
        ("BucketIAMMember", "roles/storage.objectViewer"), ("IAMMember", "roles/logging.logWriter"),
    ]
    conditions = {r["inputs"]["role"]: r["inputs"]["condition"]["expression"]
                  for r in result.of_type(BUCKET_MEMBER) if r["inputs"]["member"] == ACCOUNT}
    assert conditions["roles/storage.objectUser"].endswith('/objects/runs/exp-7/")')
    assert all("/objects/cache/" in conditions[role] for role in ("roles/storage.objectViewer",
                                                                  "roles/storage.objectCreator"))
    # The code is baked into the image: no read of code/ (a machine's account has one).
    assert not any("/objects/code/" in c for c in conditions.values())
    (logs,) = [r for r in result.of_type("gcp:projects/iAMMember:IAMMember") if r["inputs"]["member"] == ACCOUNT]
    assert "condition" not in logs["inputs"] and logs["inputs"]["project"] == "my-proj-123"


def test_vertex_s_agents_run_the_job_as_the_account_and_pull_the_stacks_image_only(result):
    (tokens,) = result.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    assert tokens["inputs"] == {
        "serviceAccountId": "projects/my-proj-123/serviceAccounts/ts-unit-54b5a4@my-proj-123.iam.gserviceaccount.com",
        "role": "roles/iam.serviceAccountTokenCreator", "member": CODE_AGENT}
    pulls = {r["inputs"]["member"]: r["inputs"] for r in
             result.of_type("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")}
    assert set(pulls) == {CODE_AGENT, MAIN_AGENT}
    (repo,) = result.of_type("gcp:artifactregistry/repository:Repository")
    for grant in pulls.values():
        assert (grant["role"], grant["repository"], grant["location"]) == \
            ("roles/artifactregistry.reader", repo["inputs"]["repositoryId"], "us-central1")
    # Each agent has these grants and nothing else of the stack's.
    assert _grants(result, CODE_AGENT) == [("IAMMember", "roles/iam.serviceAccountTokenCreator"),
                                           ("RepositoryIamMember", "roles/artifactregistry.reader")]
    assert _grants(result, MAIN_AGENT) == [("RepositoryIamMember", "roles/artifactregistry.reader")]


def test_the_job_output_holds_what_the_submit_needs_and_its_custom_job_is_in_the_documents_shape(result):
    spec = vertex.JobSpec.from_json(result.outputs["vertexJob"])
    assert spec.image == result.outputs["imageRef"] and "@sha256:" in spec.image
    assert spec.service_account == ACCOUNT.removeprefix("serviceAccount:")
    assert (spec.project, spec.region, spec.run_uri, spec.job_prefix) == \
        ("my-proj-123", "us-central1", result.outputs["runUri"], "trainstack-unit-exp-7")
    assert (spec.machine_type, spec.accelerator_type, spec.accelerator_count, spec.nodes, spec.max_runtime_s) == \
        ("g2-standard-8", "NVIDIA_L4", 1, 2, 6 * 3600)
    assert result.outputs["groupName"] == "" and "sagemakerJob" not in result.outputs
    body = vertex.custom_job(spec, name="trainstack-unit-exp-7--1", deadline=1e9 + 60, now=1e9)
    assert discovery.invalid(body, {"$ref": "GoogleCloudAiplatformV1CustomJob"}, DOC["schemas"], "body") == []
    assert body["jobSpec"]["serviceAccount"] == spec.service_account


def test_the_vertex_stack_file_synthesizes_a_job_identity_and_no_group():
    r = synth.synthesize(STACKS / "Pulumi.vertex.yaml")
    types = {x["type"] for x in r.resources}
    assert "trainstack:gcp:JobIdentity" in types and "trainstack:gcp:TrainerImage" in types
    assert not {t for t in types if t.startswith(("gcp:compute", "gcp:cloudscheduler", "gcp:cloudfunctions"))}
    spec = vertex.JobSpec.from_json(r.outputs["vertexJob"])
    assert (spec.machine_type, spec.accelerator_type, spec.max_runtime_s, spec.disk_gb, spec.spot) == \
        ("g2-standard-8", "NVIDIA_L4", 10 * 3600, 200, True)


def test_the_plan_says_what_the_job_is_and_that_its_price_is_an_estimate():
    from components.settings import load_stack_file

    r = synth.synthesize(STACKS / "Pulumi.vertex.yaml")
    text = synth.plan(r, load_stack_file(STACKS / "Pulumi.vertex.yaml"), ask_prices=False)
    assert "Vertex AI: the run is one CustomJob on g2-standard-8 with 1 x NVIDIA_L4 x 1, Spot, within 10 h of its " \
           "first start (scheduling.timeout); nothing runs until `python -m ops start --stack vertex` submits it" in text
    assert "Price: an estimate. The figures above are Compute Engine's; Vertex AI bills custom training" in text
