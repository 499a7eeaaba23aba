"""The GCP stack under `ops synth`: the same shape as the AWS one, and its own security,
spot and runtime-cap properties (pulumi-gcp 10 inputs, camelCase)."""

import copy
import datetime as dt
import json
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from components.gcp.group import IMAGE_FAMILY, WORKER_PORTS, cap_cron
from components.gcp.identity import RESIZE_PERMISSIONS
from components.gcp.naming import default_bucket_name, group_name, service_account_id
from components.settings import bucket_name_problem
from ops import synth

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test@trainstack"
BASE = {
    "cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
    "run": {"id": "exp-7", "synthetic": True, "steps": 100},
    "compute": {"instanceTypes": ["g2-standard-8", "g2-standard-12"], "maxRuntimeHours": 6},
}
AWS_BASE = {"cloud": "aws", "region": "us-east-1", "run": {"id": "exp-7", "synthetic": True, "steps": 100}}
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"
FIREWALL = "gcp:compute/firewall:Firewall"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"


@lru_cache(maxsize=16)
def _cached(frozen: str, stack: str) -> synth.Result:
    return synth.synthesize(json.loads(frozen), stack=stack)


def gcp(overrides: dict | None = None, stack: str = "unit") -> synth.Result:
    raw = copy.deepcopy(BASE)
    for k, v in (overrides or {}).items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    return _cached(json.dumps(raw, sort_keys=True), stack)


def one(result: synth.Result, type_token: str) -> dict:
    found = result.of_type(type_token)
    assert len(found) == 1, f"expected one {type_token}, found {len(found)}"
    return found[0]


@pytest.mark.slow  # the first GCP synth loads pulumi-gcp (several seconds)
def test_same_components_and_outputs_as_the_aws_stack():
    g = gcp()
    a = synth.synthesize(AWS_BASE, stack="unit")
    names = {cloud: sorted(x["type"].split(":", 2)[2] for x in r.resources if x["type"].startswith("trainstack:"))
             for cloud, r in (("aws", a), ("gcp", g))}
    assert names["gcp"] == names["aws"] == sorted(
        ["TrainingStack", "TrainingBucket", "InstanceIdentity", "ImageRepository", "TrainerCode", "SpotGroup"]
    )
    assert set(g.outputs) == set(a.outputs) == {
        "bucketName", "runUri", "imageRef", "groupName", "region", "watchCommand", "codeUri",
    }
    bucket = g.outputs["bucketName"]
    assert g.outputs["runUri"] == f"gs://{bucket}/runs/exp-7"
    assert g.outputs["codeUri"].startswith(f"gs://{bucket}/code/trainer-")
    assert g.outputs["groupName"] == "trainstack-unit-gpu" == a.outputs["groupName"]
    assert g.outputs["region"] == "us-central1"


def test_every_resource_goes_through_the_stacks_provider_and_is_labelled():
    r = gcp()
    custom = [x for x in r.resources if x["options"]["custom"] and not x["type"].startswith(("pulumi:providers:", "gcp:projects/service:"))]
    assert len(custom) == 13
    assert {x["options"]["provider"] for x in custom} == {"trainstack-gcp"}
    providers = {p["name"]: p for p in r.of_type("pulumi:providers:gcp")}
    assert sorted(providers) == ["trainstack-gcp", "trainstack-gcp-apis"]
    provider = providers["trainstack-gcp"]
    assert (provider["inputs"]["project"], provider["inputs"]["region"]) == ("my-proj-123", "us-central1")
    # The APIs are on before anything is made through the stack's provider.
    apis = r.of_type("gcp:projects/service:Service")
    assert sorted(a["inputs"]["service"] for a in apis) == [
        "artifactregistry.googleapis.com", "cloudscheduler.googleapis.com", "compute.googleapis.com",
        "iam.googleapis.com", "storage.googleapis.com"]
    assert {a["options"]["provider"] for a in apis} == {"trainstack-gcp-apis"}
    assert all(a["inputs"]["disableOnDestroy"] is False for a in apis)
    assert sorted(provider["options"]["dependsOn"]) == sorted(a["name"] for a in apis)
    labelled = [x for x in custom if "labels" in x["inputs"]]
    assert len(labelled) == 3  # bucket, repository, template
    want = {"trainstack-project": "trainstack", "trainstack-stack": "unit", "trainstack-run": "exp-7"}
    assert all(want.items() <= x["inputs"]["labels"].items() for x in labelled)
    assert [i["provider"] for i in r.invokes] == ["trainstack-gcp"]


def test_user_data_is_the_rendered_cloud_config_in_the_template_metadata():
    r = gcp()
    template = one(r, TEMPLATE)
    text = template["inputs"]["metadata"]["user-data"]
    assert r.user_data == {template["name"]: text}
    assert text.startswith("#cloud-config\n")
    assert "TRAINSTACK_CLOUD='gcp'" in text
    assert f"TRAINSTACK_RUN_URI='{r.outputs['runUri']}'" in text
    assert f"TRAINSTACK_GROUP='{r.outputs['groupName']}'" in text


def test_bucket_is_private_versioned_with_lifecycle_and_kept():
    r = gcp({"storage": {"noncurrentDays": 12}})
    bucket = one(r, "gcp:storage/bucket:Bucket")
    b = bucket["inputs"]
    assert (b["uniformBucketLevelAccess"], b["publicAccessPrevention"], b["versioning"]) == (
        True, "enforced", {"enabled": True})
    assert b["location"] == "US-CENTRAL1"
    rules = {rule["action"]["type"]: rule["condition"] for rule in b["lifecycleRules"]}
    assert rules == {"Delete": {"daysSinceNoncurrentTime": 12, "withState": "ARCHIVED"},
                     "AbortIncompleteMultipartUpload": {"age": 7}}
    assert bucket["options"]["retainOnDelete"] is True and b["forceDestroy"] is False
    gone = one(gcp({"storage": {"keepOnDestroy": False}}), "gcp:storage/bucket:Bucket")
    assert gone["options"]["retainOnDelete"] is False and gone["inputs"]["forceDestroy"] is True


def test_service_account_reaches_only_its_run_prefix_code_repository_and_group():
    r = gcp({"storage": {"bucketName": "team-ckpts"}})
    members = {m["name"]: m["inputs"] for m in r.of_type(BUCKET_MEMBER)}
    assert sorted(members) == ["trainstack-identity-code-read", "trainstack-identity-run-objects"]
    run = members["trainstack-identity-run-objects"]
    assert run["role"] == "roles/storage.objectUser" and run["bucket"] == "team-ckpts"
    assert 'startsWith("projects/_/buckets/team-ckpts/objects/runs/exp-7/")' in run["condition"]["expression"]
    code = members["trainstack-identity-code-read"]
    assert code["role"] == "roles/storage.objectViewer"
    assert 'startsWith("projects/_/buckets/team-ckpts/objects/code/")' in code["condition"]["expression"]
    email = one(r, "gcp:serviceaccount/account:Account")["inputs"]["accountId"] + "@my-proj-123.iam.gserviceaccount.com"
    grants = r.of_type(BUCKET_MEMBER) + r.of_type("gcp:projects/iAMMember:IAMMember") + r.of_type(
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert len(grants) == 4
    assert {g["inputs"]["member"] for g in grants} == {f"serviceAccount:{email}"}
    pull = one(r, "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")["inputs"]
    assert (pull["role"], pull["repository"]) == ("roles/artifactregistry.reader", "trainstack-unit")
    role = one(r, "gcp:projects/iAMCustomRole:IAMCustomRole")["inputs"]
    assert role["permissions"] == RESIZE_PERMISSIONS == [
        "compute.instanceGroupManagers.get", "compute.instanceGroupManagers.update"]
    resize = one(r, "gcp:projects/iAMMember:IAMMember")["inputs"]
    assert resize["role"] == f"projects/my-proj-123/roles/{role['roleId']}"
    assert resize["condition"]["expression"] == (
        'resource.name == "projects/my-proj-123/regions/us-central1/instanceGroupManagers/trainstack-unit-gpu"')
    assert not {g["inputs"]["role"] for g in grants} & {"roles/owner", "roles/editor", "roles/viewer"}


def test_gcs_data_uri_adds_a_read_only_grant_on_that_prefix():
    r = gcp({"run": {"synthetic": False, "dataUri": "gs://corpus-bucket/lm/shards/"}})
    data = [m["inputs"] for m in r.of_type(BUCKET_MEMBER) if m["name"].endswith("data-read")]
    assert len(data) == 1
    assert (data[0]["bucket"], data[0]["role"]) == ("corpus-bucket", "roles/storage.objectViewer")
    assert 'startsWith("projects/_/buckets/corpus-bucket/objects/lm/shards/")' in data[0]["condition"]["expression"]


def test_repository_has_immutable_tags_scanning_and_keeps_n():
    repo = one(gcp({"image": {"keepImages": 4}}), "gcp:artifactregistry/repository:Repository")["inputs"]
    assert (repo["format"], repo["dockerConfig"]) == ("DOCKER", {"immutableTags": True})
    assert repo["vulnerabilityScanningConfig"] == {"enablementConfig": "AUTOMATIC"}
    policies = {p["id"]: p for p in repo["cleanupPolicies"]}
    assert policies["keep-newest"]["action"] == "KEEP"
    assert policies["keep-newest"]["mostRecentVersions"] == {"keepCount": 4}
    assert policies["delete-older"]["action"] == "DELETE"
    assert repo["cleanupPolicyDryRun"] is False


def test_template_is_spot_with_max_run_duration_shielded_and_no_ssh_key():
    r = gcp()
    t = one(r, TEMPLATE)["inputs"]
    assert t["scheduling"] == {
        "provisioningModel": "SPOT", "preemptible": True, "automaticRestart": False,
        "onHostMaintenance": "TERMINATE", "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": 6 * 3600},
    }
    assert t["shieldedInstanceConfig"] == {"enableSecureBoot": False, "enableVtpm": True, "enableIntegrityMonitoring": True}
    meta = t["metadata"]
    assert (meta["block-project-ssh-keys"], meta["disable-legacy-endpoints"]) == ("true", "true")
    assert "ssh-keys" not in meta
    (disk,) = t["disks"]
    assert disk["boot"] is True and disk["autoDelete"] is True and disk["diskSizeGb"] == 200
    assert IMAGE_FAMILY in disk["sourceImage"]
    (lookup,) = r.invokes
    assert lookup["args"] == {"family": IMAGE_FAMILY, "project": "ubuntu-os-accelerator-images"}
    assert t["machineType"] == "g2-standard-8"


def test_nothing_inbound_by_default():
    walls = gcp().of_type(FIREWALL)
    assert len(walls) == 1
    deny = walls[0]["inputs"]
    assert deny["denies"] == [{"protocol": "all"}] and deny["sourceRanges"] == ["0.0.0.0/0"]
    assert "allows" not in deny and deny["targetTags"] == ["trainstack-unit"]


def test_ssh_from_allowed_cidrs_and_workers_from_each_other_only():
    r = gcp({"compute": {"nodes": 2}, "access": {"sshPublicKey": SSH_KEY, "allowedCidrs": ["203.0.113.0/24"]}})
    walls = {w["name"].rsplit("-", 1)[-1]: w["inputs"] for w in r.of_type(FIREWALL)}
    assert sorted(walls) == ["inbound", "ssh", "workers"]
    deny_priority = walls["inbound"]["priority"]
    assert walls["ssh"]["sourceRanges"] == ["203.0.113.0/24"]
    assert walls["ssh"]["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert walls["workers"]["sourceTags"] == walls["workers"]["targetTags"] == ["trainstack-unit"]
    assert walls["workers"]["allows"] == [{"protocol": "tcp", "ports": [f"{WORKER_PORTS[0]}-{WORKER_PORTS[1]}"]}]
    assert "sourceRanges" not in walls["workers"]
    assert walls["ssh"]["priority"] < deny_priority and walls["workers"]["priority"] < deny_priority
    assert one(r, TEMPLATE)["inputs"]["metadata"]["ssh-keys"] == f"ubuntu:{SSH_KEY}"


def test_group_keeps_nodes_over_ranked_types_and_ignores_its_size_later():
    r = gcp({"compute": {"nodes": 3, "instanceTypes": ["g2-standard-12", "g2-standard-8", "g2-standard-16"],
                         "zones": ["us-central1-a", "us-central1-b"]}})
    mig = one(r, MIG)
    m = mig["inputs"]
    assert (m["name"], m["targetSize"], m["region"]) == ("trainstack-unit-gpu", 3, "us-central1")
    selections = m["instanceFlexibilityPolicy"]["instanceSelections"]
    assert [(s["rank"], s["machineTypes"]) for s in selections] == [
        (1, ["g2-standard-12"]), (2, ["g2-standard-8"]), (3, ["g2-standard-16"])]
    assert m["distributionPolicyZones"] == ["us-central1-a", "us-central1-b"]
    assert m["versions"][0]["instanceTemplate"].endswith(tuple("0123456789"))  # the template's unique link
    assert mig["options"]["ignoreChanges"] == ["targetSize"]
    assert "trainstack-identity-resize" in mig["options"]["dependsOn"]
    single = one(gcp({"compute": {"instanceTypes": ["g2-standard-8"]}}), MIG)["inputs"]
    assert "instanceFlexibilityPolicy" not in single


def test_on_demand_accelerator_and_own_image():
    r = gcp({"compute": {"spot": False, "instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4",
                         "gpusPerNode": 2, "imageId": "projects/my-proj-123/global/images/my-gpu-image"}})
    t = one(r, TEMPLATE)["inputs"]
    assert t["scheduling"]["provisioningModel"] == "STANDARD" and t["scheduling"]["preemptible"] is False
    assert t["scheduling"]["maxRunDuration"] == {"seconds": 6 * 3600}
    assert t["guestAccelerators"] == [{"type": "nvidia-tesla-t4", "count": 2}]
    assert t["disks"][0]["sourceImage"] == "projects/my-proj-123/global/images/my-gpu-image"
    assert r.invokes == []


def test_cloud_scheduler_resizes_the_group_to_zero_at_the_cap():
    before = dt.datetime.now(dt.UTC)
    job = one(gcp({"compute": {"maxRuntimeHours": 10}}, stack="capped"), "gcp:cloudscheduler/job:Job")
    after = dt.datetime.now(dt.UTC)
    j = job["inputs"]
    assert j["httpTarget"]["uri"] == ("https://compute.googleapis.com/compute/v1/projects/my-proj-123/regions/"
                                      "us-central1/instanceGroupManagers/trainstack-capped-gpu/resize?size=0")
    assert j["httpTarget"]["httpMethod"] == "POST"
    assert j["httpTarget"]["oauthToken"]["serviceAccountEmail"].endswith("@my-proj-123.iam.gserviceaccount.com")
    assert j["timeZone"] == "Etc/UTC"
    assert j["schedule"] in {cap_cron(10, before), cap_cron(10, after)}
    assert job["options"]["ignoreChanges"] == ["schedule"]
    assert cap_cron(2, dt.datetime(2030, 12, 31, 23, 30, 5, tzinfo=dt.UTC)) == "31 1 1 1 *"


@pytest.mark.parametrize("stack", ["dev", "Prod_EU.google", "x" * 90])
def test_generated_names_are_valid(stack):
    bucket = default_bucket_name(project="trainstack", stack=stack, gcp_project="my-proj-123", region="us-central1")
    assert bucket_name_problem("gcp", bucket) is None
    sa = service_account_id(project="trainstack", stack=stack)
    assert re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", sa)
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", group_name(project="trainstack", stack=stack))


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
]


@pytest.mark.parametrize("path", GCP_STACK_FILES or [pytest.param(None, marks=pytest.mark.skip("no GCP stack file yet"))],
                         ids=lambda p: getattr(p, "name", "none"))
def test_gcp_stack_files_synthesize(path):
    r = synth.synthesize(path)
    assert len(r.of_type(MIG)) == 1 and len(r.of_type(TEMPLATE)) == 1
    assert r.outputs["runUri"].startswith(f"gs://{r.outputs['bucketName']}/runs/")


@pytest.mark.parametrize("nodes", [1, 2])
def test_only_a_multi_node_group_may_list_instances(nodes):
    r = gcp({"compute": {"nodes": nodes}})
    roles = {x["inputs"]["roleId"]: x["inputs"]["permissions"] for x in r.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")}
    peers = {k: v for k, v in roles.items() if k.endswith("_peers")}
    assert len(roles) == 1 + (nodes > 1)
    if nodes > 1:
        (role_id, perms), = peers.items()
        assert perms == ["compute.instances.list"] and len(role_id) <= 64
        grant = [m["inputs"] for m in r.of_type("gcp:projects/iAMMember:IAMMember") if m["inputs"]["role"].endswith(role_id)]
        assert len(grant) == 1 and grant[0]["member"].startswith("serviceAccount:")
    else:
        assert peers == {}


IMAGE = "docker-build:index:Image"
CLIENT_CONFIG = "gcp:organizations/getClientConfig:getClientConfig"
AR_URL = "us-central1-docker.pkg.dev/my-proj-123/trainstack-unit/trainer"


def test_image_build_pushes_the_trainer_to_artifact_registry_and_machines_run_its_digest(tmp_path):
    r = gcp({"image": {"build": True}})
    assert one(r, "trainstack:gcp:TrainerImage")["name"] == "trainstack-image"
    image = one(r, IMAGE)
    inputs = image["inputs"]
    assert (inputs["push"], inputs["platforms"], inputs["buildOnPreview"]) == (True, ["linux/amd64"], False)
    (tag,) = inputs["tags"]
    assert re.fullmatch(re.escape(AR_URL) + r":trainer-[0-9a-f]{16}", tag), tag
    context = (Path.cwd() / inputs["context"]["location"]).resolve()
    from components.code import archive_key, content_tag, pack

    data = pack()
    assert tag.endswith(content_tag(data, "tensorflow/tensorflow:2.21.0-gpu"))
    assert context.name == archive_key(data).split("/")[-1].removesuffix(".tar.gz")
    assert (Path.cwd() / inputs["dockerfile"]["location"]).resolve() == context / "trainer" / "Dockerfile"
    # The deployer's access token, secret, through the stack's provider; never in user data.
    registries = inputs["registries"]
    assert "4dabf18193072939515e22adb298388d" in registries
    (login,) = registries["value"]
    assert (login["address"], login["username"]) == ("us-central1-docker.pkg.dev", "oauth2accesstoken")
    assert login["password"].startswith("ya29.fake-access-token-")
    assert [i["provider"] for i in r.invokes if i["token"] == CLIENT_CONFIG] == ["trainstack-gcp"]
    ref = r.outputs["imageRef"]
    assert re.fullmatch(re.escape(AR_URL) + r"@sha256:[0-9a-f]{64}", ref), ref
    assert r.outputs["codeUri"] == "" and r.of_type("gcp:storage/bucketObject:BucketObject") == []
    (text,) = r.user_data.values()
    assert login["password"] not in text
    assert re.findall(r"^\s*TRAINSTACK_IMAGE='([^']*)'$", text, re.M) == [ref]
    assert re.findall(r"^\s*TRAINSTACK_CODE_URI='([^']*)'$", text, re.M) == [""]
    (doc,) = [p for p in synth.write(r, tmp_path) if p.parent.name == "user-data"]
    schema = subprocess.run(["cloud-init", "schema", "--config-file", str(doc)], capture_output=True, text=True, timeout=60)
    assert schema.returncode == 0, schema.stdout + schema.stderr
    assert "Valid" in schema.stdout


def test_without_image_build_nothing_is_built():
    r = gcp()
    assert r.of_type(IMAGE) == [] and r.of_type("trainstack:gcp:TrainerImage") == []
    assert [i for i in r.invokes if i["token"] == CLIENT_CONFIG] == []
    assert r.outputs["imageRef"] == "tensorflow/tensorflow:2.21.0-gpu"
    (text,) = r.user_data.values()
    assert re.findall(r"^\s*TRAINSTACK_IMAGE='([^']*)'$", text, re.M) == [r.outputs["imageRef"]]


def test_both_clouds_build_the_same_image_under_the_same_tag():
    aws_r = synth.synthesize({**AWS_BASE, "image": {"build": True}}, stack="unit")
    gcp_r = gcp({"image": {"build": True}})
    images = [r.of_type("docker-build:index:Image") for r in (aws_r, gcp_r)]
    assert [len(i) for i in images] == [1, 1]
    (a,), (g,) = images
    for key in ("context", "dockerfile", "buildArgs", "platforms"):
        assert a["inputs"][key] == g["inputs"][key], key
    assert a["inputs"]["buildArgs"] == {"BASE_IMAGE": "tensorflow/tensorflow:2.21.0-gpu"}
    tags = [i["inputs"]["tags"][0].rsplit(":", 1)[1] for i in (a, g)]
    assert tags[0] == tags[1] and tags[0].startswith("trainer-")
