"""`image.build: true` on GCP: trainer/Dockerfile pushed to Artifact Registry; the machines run its digest."""

import re
import subprocess
from pathlib import Path

from components import registry
from components.code import boot_key, pack_boot_scripts
from ops import synth
from tests.components.gcp.helpers import (
    AR_URL,
    AWS_BASE,
    CLIENT_CONFIG,
    IMAGE,
    gcp,
    one,
)

# The default image as every machine runs it: by the tag's digest (synth's stand-in).
PINNED = f"tensorflow/tensorflow@{registry.stand_in('tensorflow/tensorflow', '2.21.0-gpu')}"


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
    assert tag.endswith(content_tag(data, PINNED))
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
    assert r.outputs["codeUri"] == ""
    # No trainer archive: only the machines' boot scripts.
    assert [x["inputs"]["name"] for x in r.of_type("gcp:storage/bucketObject:BucketObject")] == [
        boot_key(pack_boot_scripts())]
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
    assert r.outputs["imageRef"] == PINNED
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
    assert a["inputs"]["buildArgs"] == {"BASE_IMAGE": PINNED}
    tags = [i["inputs"]["tags"][0].rsplit(":", 1)[1] for i in (a, g)]
    assert tags[0] == tags[1] and tags[0].startswith("trainer-")

