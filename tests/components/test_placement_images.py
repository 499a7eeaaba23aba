"""`image.build: true` with several placements: the image is built once and pushed to a repository in
each placement's region, and each placement's machines pull `<their region's repository>@<the digest>`.

The stacks run the real `__main__.py` under the mocks (`ops synth`), through the stacks of
tests/components/test_placements.py (three placements a cloud) with `image.build: true`; the example
stack `stacks/Pulumi.regions.yaml` goes through `python -m ops synth`, every policy rule and parliament.
"""

from __future__ import annotations

import json
import re
from functools import cache

import pytest
import yaml

from components.machine import ENV_FILE
from components.settings import load_stack_file
from ops import synth
from policy import iam, rules
from tests.components.test_placements import RAW, REGIONS, TEMPLATE, synthesized

IMAGE = "docker-build:index:Image"
REPO = {"aws": "aws:ecr/repository:Repository", "gcp": "gcp:artifactregistry/repository:Repository"}
PULL = "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@cache
def built(cloud: str) -> synth.Result:
    return synth.synthesize({**RAW[cloud], "image": {"build": True}}, stack="places")


def _env(user_data: str) -> dict[str, str]:
    (text,) = [f["content"] for f in yaml.safe_load(user_data)["write_files"] if f["path"] == ENV_FILE]
    return {k: v.strip("'") for k, v in (line.split("=", 1) for line in text.splitlines())}


def _providers(r: synth.Result, cloud: str) -> dict[str, str]:
    return {x["name"]: x["inputs"]["region"] for x in r.of_type(f"pulumi:providers:{cloud}")
            if x["name"] != "trainstack-gcp-apis"}


def _repositories(r: synth.Result, cloud: str) -> dict[str, dict]:
    """Each image repository by the region it lives in (AWS: its provider's; GCP: its location, which must be
    its provider's too)."""
    providers = _providers(r, cloud)
    out = {}
    # The GCP placement controller's repository holds its function's images, not the trainer's.
    for repo in (x for x in r.of_type(REPO[cloud]) if x["parent"] != "trainstack-controller"):
        region = providers[repo["options"]["provider"]]
        if cloud == "gcp":
            assert repo["inputs"]["location"] == region
        assert region not in out, f"two repositories in {region}"
        out[region] = repo
    return out


def _pulls(r: synth.Result) -> list[dict]:
    """The machines' grants on image repositories (the controller's build account pushes to its own)."""
    return [x for x in r.of_type(PULL) if x["parent"] != "trainstack-controller"]


def _url(cloud: str, region: str, repo: dict) -> str:
    """The registry path a repository has (the fake cloud's account and the stack's project)."""
    if cloud == "aws":
        return f"{synth.FAKE_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{repo['inputs']['name']}"
    return f"{region}-docker.pkg.dev/my-proj-123/{repo['inputs']['repositoryId']}/trainer"


def _settings(repo: dict) -> dict:
    """A repository's inputs but where it is (GCP's location; an ECR repository's region is its provider's)."""
    return {k: v for k, v in repo["inputs"].items() if k != "location"}


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_each_placement_region_has_a_repository_with_the_home_repositorys_settings(cloud):
    r = built(cloud)
    repos = _repositories(r, cloud)
    assert sorted(repos) == sorted(REGIONS[cloud])
    home = repos[REGIONS[cloud][0]]
    for region, repo in repos.items():
        assert _settings(repo) == _settings(home), region
        assert repo["options"]["retainOnDelete"] is False  # images are rebuilt at will: they go with the stack
    if cloud == "aws":
        assert home["inputs"]["imageTagMutability"] == "IMMUTABLE" and home["inputs"]["forceDelete"] is True
        assert home["inputs"]["imageScanningConfiguration"] == {"scanOnPush": True}
        # Each repository keeps the last image.keepImages images, through its own region's provider.
        providers = _providers(r, cloud)
        policies = {providers[p["options"]["provider"]]: p["inputs"]["policy"]
                    for p in r.of_type("aws:ecr/lifecyclePolicy:LifecyclePolicy")}
        assert sorted(policies) == sorted(REGIONS[cloud]) and len(set(policies.values())) == 1
        assert json.loads(policies[REGIONS[cloud][0]])["rules"][0]["selection"]["countNumber"] == 10
    else:
        assert home["inputs"]["dockerConfig"] == {"immutableTags": True}
        assert [p["id"] for p in home["inputs"]["cleanupPolicies"]] == ["keep-newest", "delete-older"]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_image_is_built_once_and_pushed_to_every_placements_repository(cloud):
    r = built(cloud)
    repos = _repositories(r, cloud)
    (image,) = r.of_type(IMAGE)
    urls = [_url(cloud, region, repos[region]) for region in REGIONS[cloud]]
    tag = image["inputs"]["tags"][0].rsplit(":", 1)[1]
    assert image["inputs"]["tags"] == [f"{u}:{tag}" for u in urls]
    # Pushed once every repository exists.
    assert set(image["options"]["dependsOn"]) >= {repo["name"] for repo in repos.values()}
    # A login for each registry, secret, by its host.
    registries = image["inputs"]["registries"]
    assert "4dabf18193072939515e22adb298388d" in registries
    assert [login["address"] for login in registries["value"]] == [u.split("/", 1)[0] for u in urls]
    if cloud == "aws":
        # An ECR token is for one region's registry: asked through each placement's provider, once each.
        # The invokes run concurrently, so their order is not part of the contract.
        providers = _providers(r, cloud)
        tokens = [providers[i["provider"]] for i in r.invokes
                  if i["token"] == "aws:ecr/getAuthorizationToken:getAuthorizationToken"]
        assert sorted(tokens) == sorted(REGIONS[cloud])
        assert len({login["password"] for login in registries["value"]}) == 3
    else:
        # The deployer's access token is no region's: one lookup serves every registry.
        assert len({login["password"] for login in registries["value"]}) == 1
        assert [i["provider"] for i in r.invokes
                if i["token"] == "gcp:organizations/getClientConfig:getClientConfig"] == ["trainstack-gcp"]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_each_placements_machines_pull_their_own_regions_repository_at_the_one_digest(cloud):
    r = built(cloud)
    repos = _repositories(r, cloud)
    providers = _providers(r, cloud)
    pulled = {}
    for t in r.of_type(TEMPLATE[cloud]):
        # The template's region: its provider's (AWS), its group's region (GCP: the template is global).
        env = _env(r.user_data[t["name"]])
        region = env["TRAINSTACK_REGION"]
        if cloud == "aws":
            assert providers[t["options"]["provider"]] == region
        pulled[region] = env["TRAINSTACK_IMAGE"]
    assert sorted(pulled) == sorted(REGIONS[cloud])
    digests = set()
    for region, ref in pulled.items():
        repository, digest = ref.split("@")
        assert repository == _url(cloud, region, repos[region]), region
        assert DIGEST.fullmatch(digest)
        digests.add(digest)
    assert len(digests) == 1
    assert r.outputs["imageRef"] == pulled[REGIONS[cloud][0]]  # the stack's output: home's


def test_the_aws_role_pulls_from_exactly_the_placements_repositories():
    r = built("aws")
    repos = _repositories(r, "aws")
    (policy,) = [x for x in r.of_type("aws:iam/rolePolicy:RolePolicy") if x["parent"] == "trainstack-identity"]
    statements = {s["Sid"]: s for s in json.loads(policy["inputs"]["policy"])["Statement"]}
    assert statements["PullStackImage"]["Resource"] == [
        f"arn:aws:ecr:{region}:{synth.FAKE_ACCOUNT}:repository/{repos[region]['inputs']['name']}"
        for region in REGIONS["aws"]]
    assert statements["PullStackImage"]["Action"] == [
        "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
    # Nothing else changed: the statements are those of the same stack with the public image.
    plain = {s["Sid"]: s for s in json.loads(synthesized("aws").named("trainstack-identity-policy")["inputs"]["policy"])
             ["Statement"]}
    assert {k: v for k, v in statements.items() if k != "PullStackImage"} == \
        {k: v for k, v in plain.items() if k != "PullStackImage"}
    assert plain["PullStackImage"]["Resource"] == statements["PullStackImage"]["Resource"][0]


def test_the_gcp_account_reads_exactly_the_placements_repositories():
    r = built("gcp")
    repos = _repositories(r, "gcp")
    pulls = _pulls(r)
    assert sorted((p["inputs"]["location"], p["inputs"]["repository"]) for p in pulls) == sorted(
        (region, repos[region]["inputs"]["repositoryId"]) for region in REGIONS["gcp"])
    assert {p["inputs"]["role"] for p in pulls} == {"roles/artifactregistry.reader"}
    assert len({p["inputs"]["member"] for p in pulls}) == 1 and pulls[0]["inputs"]["member"].startswith(
        "serviceAccount:ts-places-")
    # The groups wait for every grant, the pulls too: a machine that boots first would fail its pull.
    for g in r.of_type("gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"):
        assert {p["name"] for p in pulls} <= set(g["options"]["dependsOn"]), g["name"]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_without_image_build_the_stack_keeps_its_one_repository(cloud):
    r = synthesized(cloud)
    assert list(_repositories(r, cloud)) == [REGIONS[cloud][0]]
    assert r.of_type(IMAGE) == []
    if cloud == "gcp":
        assert len(_pulls(r)) == 1


def test_ops_synth_of_the_regions_stack_with_a_built_image_passes_every_rule(tmp_path):
    from ops.__main__ import main

    doc = yaml.safe_load((synth.STACKS_DIR / "Pulumi.regions.yaml").read_text())
    doc["config"]["trainstack:image"]["build"] = True
    (tmp_path / "stacks").mkdir()
    stack_file = tmp_path / "stacks" / "Pulumi.regions.yaml"
    stack_file.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert main(["synth", "--stack", "regions", "--out", str(out), "--stacks-dir", str(tmp_path / "stacks"),
                 "--offline"]) == 0
    resources = json.loads((out / "resources.json").read_text())
    images = [x for x in resources if x["type"] == IMAGE]
    assert len(images) == 1 and len(images[0]["inputs"]["tags"]) == 2
    refs = {}
    for path in sorted((out / "user-data").iterdir()):
        env = _env(path.read_text())
        refs[env["TRAINSTACK_REGION"]] = env["TRAINSTACK_IMAGE"]
    assert sorted(refs) == ["us-east-1", "us-west-2"]
    for region, ref in refs.items():
        assert ref.split("/", 1)[0] == f"{synth.FAKE_ACCOUNT}.dkr.ecr.{region}.amazonaws.com"
    assert len({ref.split("@")[1] for ref in refs.values()}) == 1
    # Every rule of the policy pack, and parliament on the role's policy, as for the shipped stacks.
    assert rules.check(resources, rules.context_from_settings(load_stack_file(stack_file))) == []
    docs = iam.policy_documents(resources)
    assert any(d.kind == "identity" for d in docs)
    assert [str(f) for f in iam.lint(docs)] == []
