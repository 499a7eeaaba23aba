"""The whole GCP stack: the same components and outputs as AWS, one provider, the APIs, the user data."""

import subprocess

import pytest
import yaml

from components.gcp.naming import PREREQUISITE_APIS
from ops import synth
from tests.components.gcp.helpers import (
    AWS_BASE,
    MIG,
    TEMPLATE,
    gcp,
    one,
)


@pytest.mark.slow  # the first GCP synth loads pulumi-gcp (several seconds)
def test_same_components_and_outputs_as_the_aws_stack():
    g = gcp()
    a = synth.synthesize(AWS_BASE, stack="unit")
    names = {cloud: sorted(x["type"].split(":", 2)[2] for x in r.resources if x["type"].startswith("trainstack:"))
             for cloud, r in (("aws", a), ("gcp", g))}
    assert names["gcp"] == names["aws"] == sorted(
        ["TrainingStack", "TrainingBucket", "InstanceIdentity", "ImageRepository", "TrainerCode", "SpotGroup"]
    )
    assert set(a.outputs) == {"bucketName", "runUri", "imageRef", "groupName", "region", "watchCommand", "codeUri"}
    # GCP adds the stack's project: `ops` asks gcloud about it, not about the one gcloud is set to.
    assert set(g.outputs) == set(a.outputs) | {"project"}
    assert g.outputs["project"] == "my-proj-123", g.outputs
    bucket = g.outputs["bucketName"]
    assert g.outputs["runUri"] == f"gs://{bucket}/runs/exp-7"
    assert g.outputs["codeUri"].startswith(f"gs://{bucket}/code/trainer-")
    assert g.outputs["groupName"] == "trainstack-unit--exp-7-gpu" == a.outputs["groupName"]
    assert g.outputs["region"] == "us-central1"


def test_every_resource_goes_through_the_stacks_provider_and_is_labelled():
    r = gcp()
    custom = [x for x in r.resources if x["options"]["custom"] and not x["type"].startswith(("pulumi:providers:", "gcp:projects/service:"))]
    # The custom roles' random suffix is made by the random provider, in state only.
    (suffix,) = [x for x in custom if x["type"].startswith("random:")]
    assert suffix["type"] == "random:index/randomId:RandomId"
    custom = [x for x in custom if x is not suffix]
    assert len(custom) == 18  # with the resize-operations role and its grant, the package cache's two grants and the boot archive
    assert {x["options"]["provider"] for x in custom} == {"trainstack-gcp"}
    providers = {p["name"]: p for p in r.of_type("pulumi:providers:gcp")}
    assert sorted(providers) == ["trainstack-gcp", "trainstack-gcp-apis"]
    provider = providers["trainstack-gcp"]
    assert (provider["inputs"]["project"], provider["inputs"]["region"]) == ("my-proj-123", "us-central1")
    # The APIs are on before anything is made through the stack's provider.
    apis = r.of_type("gcp:projects/service:Service")
    assert sorted(a["inputs"]["service"] for a in apis) == [
        "artifactregistry.googleapis.com", "cloudresourcemanager.googleapis.com", "cloudscheduler.googleapis.com",
        "compute.googleapis.com", "iam.googleapis.com", "storage.googleapis.com"]
    assert {a["options"]["provider"] for a in apis} == {"trainstack-gcp-apis"}
    assert all(a["inputs"]["disableOnDestroy"] is False for a in apis)
    assert sorted(provider["options"]["dependsOn"]) == sorted(a["name"] for a in apis)
    labelled = [x for x in custom if "labels" in x["inputs"]]
    assert len(labelled) == 3  # bucket, repository, template
    want = {"trainstack-project": "trainstack", "trainstack-stack": "unit", "trainstack-run": "exp-7"}
    assert all(want.items() <= x["inputs"]["labels"].items() for x in labelled)
    assert [i["provider"] for i in r.invokes] == ["trainstack-gcp", "trainstack-gcp"]  # the image and the zones


def test_user_data_is_the_rendered_cloud_config_in_the_template_metadata():
    r = gcp()
    template = one(r, TEMPLATE)
    text = template["inputs"]["metadata"]["user-data"]
    assert r.user_data == {template["name"]: text}
    assert text.startswith("#cloud-config\n")
    assert "TRAINSTACK_CLOUD='gcp'" in text
    assert f"TRAINSTACK_RUN_URI='{r.outputs['runUri']}'" in text
    assert f"TRAINSTACK_GROUP='{r.outputs['groupName']}'" in text


def test_user_data_passes_cloud_init_schema(tmp_path):
    r = gcp({"compute": {"nodes": 2}})
    written = synth.write(r, tmp_path)
    (doc,) = [p for p in written if p.parent.name == "user-data"]
    assert doc.name == "trainstack-group-template.yaml"
    schema = subprocess.run(["cloud-init", "schema", "--config-file", str(doc)], capture_output=True, text=True, timeout=60)
    assert schema.returncode == 0, schema.stdout + schema.stderr
    assert "Valid" in schema.stdout


GCP_STACK_FILES = [
    p for p in sorted((synth.STACKS_DIR).glob("Pulumi.*.yaml"))
    if ((yaml.safe_load(p.read_text()) or {}).get("config") or {}).get("trainstack:cloud") == "gcp"
    # A kubernetes stack makes a Job, no group (tests/components/kubernetes/).
    and ((yaml.safe_load(p.read_text()) or {}).get("config") or {}).get("trainstack:scheduler", "groups") == "groups"
]


@pytest.mark.parametrize("path", GCP_STACK_FILES or [pytest.param(None, marks=pytest.mark.skip("no GCP stack file yet"))],
                         ids=lambda p: getattr(p, "name", "none"))
def test_gcp_stack_files_synthesize(path):
    r = synth.synthesize(path)
    assert len(r.of_type(MIG)) == 1 and len(r.of_type(TEMPLATE)) == 1
    assert r.outputs["runUri"].startswith(f"gs://{r.outputs['bucketName']}/runs/")



def test_resource_manager_api_is_turned_on_first_and_named_as_a_prerequisite():
    # Project IAM grants (the resize role) go through the Cloud Resource Manager API, which
    # a fresh project has off; the other APIs are turned on after it.
    r = gcp()
    apis = {a["inputs"]["service"]: a for a in r.of_type("gcp:projects/service:Service")}
    crm = apis["cloudresourcemanager.googleapis.com"]
    assert crm["name"] == "trainstack-api-cloudresourcemanager"
    assert crm["options"]["dependsOn"] == []
    others = [a for service, a in apis.items() if service != "cloudresourcemanager.googleapis.com"]
    assert len(others) == 5
    assert all(a["options"]["dependsOn"] == [crm["name"]] for a in others)
    # Every project-level grant is made through the stack's provider, which waits for all APIs.
    (provider,) = [p for p in r.of_type("pulumi:providers:gcp") if p["name"] == "trainstack-gcp"]
    assert crm["name"] in provider["options"]["dependsOn"]
    grants = r.of_type("gcp:projects/iAMMember:IAMMember")
    assert grants and {g["options"]["provider"] for g in grants} == {"trainstack-gcp"}
    assert PREREQUISITE_APIS == ("cloudresourcemanager.googleapis.com", "serviceusage.googleapis.com")
