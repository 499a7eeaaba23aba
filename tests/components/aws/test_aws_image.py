"""`image.build: true` on AWS: trainer/Dockerfile built from the trainer archive and pushed
to the stack's ECR repository by a content tag; the machines run it by digest, logged in
by their role, never by the deployer's token. Also the build context itself."""

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from components import registry
from components.code import TRAINER_DIR, archive_key, boot_key, build_context, content_tag, pack, pack_boot_scripts
from ops import synth
from policy.rules import image_problem
from tests.components.aws.helpers import ROOT, one, synth_raw

# The default image as every machine runs it: by the tag's digest (synth's stand-in).
PINNED = f"tensorflow/tensorflow@{registry.stand_in('tensorflow/tensorflow', '2.21.0-gpu')}"

IMAGE = "docker-build:index:Image"
OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"
TOKEN = "aws:ecr/getAuthorizationToken:getAuthorizationToken"
REPO_URL = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/trainstack/unit"
# How the SDK marks a secret value on the wire (pulumi.runtime.rpc).
SECRET_SIG = "4dabf18193072939515e22adb298388d"
TRAINER_HASH = hashlib.sha256(pack()).hexdigest()[:16]


def env_line(text: str, key: str) -> str:
    values = re.findall(rf"^\s*{key}='([^']*)'$", text, re.M)
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def test_build_true_builds_trainer_dockerfile_for_amd64_and_pushes_a_content_tag():
    r = synth_raw({"image": {"build": True}})
    image = one(r, IMAGE)
    assert image["parent"] == "trainstack-image"
    assert one(r, "trainstack:aws:TrainerImage")["name"] == "trainstack-image"
    inputs = image["inputs"]
    assert (inputs["push"], inputs["platforms"], inputs["buildOnPreview"]) == (True, ["linux/amd64"], False)
    # The Dockerfile builds FROM the base image pinned by its digest (components/registry.py).
    assert inputs["tags"] == [f"{REPO_URL}:{content_tag(pack(), PINNED)}"]
    assert inputs["buildArgs"] == {"BASE_IMAGE": PINNED}
    # The context is the trainer archive unpacked: the same bytes the tag's hash names.
    context = (Path.cwd() / inputs["context"]["location"]).resolve()
    dockerfile = (Path.cwd() / inputs["dockerfile"]["location"]).resolve()
    assert context.name == f"trainer-{TRAINER_HASH}"
    assert dockerfile == context / "trainer" / "Dockerfile"
    assert dockerfile.read_bytes() == (TRAINER_DIR / "Dockerfile").read_bytes()
    assert image["options"]["dependsOn"] == ["trainstack-images-repo"]


def test_registry_login_is_the_deployers_secret_token_and_never_reaches_user_data():
    r = synth_raw({"image": {"build": True}})
    registries = one(r, IMAGE)["inputs"]["registries"]
    assert SECRET_SIG in registries, "the registry credentials must be a secret"
    (login,) = registries["value"]
    assert login["address"] == REPO_URL.split("/")[0]
    assert login["username"] == "AWS"
    tokens = [i for i in r.invokes if i["token"] == TOKEN]
    assert tokens == [{"token": TOKEN, "args": {"registryId": "123456789012"}, "provider": "trainstack-aws"}]
    password = login["password"]
    assert password.startswith("fake-ecr-token-")
    assert len(r.user_data) == 1
    for text in r.user_data.values():
        assert password not in text
    assert password not in json.dumps(r.outputs)


def test_machines_run_the_pushed_digest_with_the_code_baked_in(tmp_path):
    r = synth_raw({"image": {"build": True}})
    ref = r.outputs["imageRef"]
    assert re.fullmatch(re.escape(REPO_URL) + r"@sha256:[0-9a-f]{64}", ref), ref
    assert image_problem(ref) is None
    (text,) = r.user_data.values()
    assert env_line(text, "TRAINSTACK_IMAGE") == ref
    assert env_line(text, "TRAINSTACK_CODE_URI") == ""
    assert r.outputs["codeUri"] == ""
    assert [x["inputs"]["key"] for x in r.of_type(OBJECT)] == [boot_key(pack_boot_scripts())]  # no trainer archive
    # The boot script logs in to ECR for this host and pulls the reference as it is.
    lib = (ROOT / "userdata" / "lib.sh").read_text()
    assert "*.dkr.ecr.*.amazonaws.com)" in lib and re.fullmatch(r"[0-9]+\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com",
                                                               ref.split("/")[0])
    (doc,) = [p for p in synth.write(r, tmp_path) if p.parent.name == "user-data"]
    schema = subprocess.run(["cloud-init", "schema", "--config-file", str(doc)], capture_output=True, text=True, timeout=60)
    assert schema.returncode == 0, schema.stdout + schema.stderr
    assert "Valid" in schema.stdout


def test_an_unchanged_trainer_keeps_its_tag_and_a_changed_one_gets_a_new_one(tmp_path):
    src = tmp_path / "trainer"
    shutil.copytree(TRAINER_DIR, src, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "models.cpython-311.pyc").write_bytes(b"not part of the image")
    base = "tensorflow/tensorflow:2.21.0-gpu"
    tag = content_tag(pack(src), base)
    assert tag == content_tag(pack(TRAINER_DIR), base) and re.fullmatch(r"trainer-[0-9a-f]{16}", tag)
    # the base image is part of the tag: a new base is a new image under a new tag
    assert content_tag(pack(src), "tensorflow/tensorflow:2.21.1-gpu") != tag
    (src / "models.py").write_text((src / "models.py").read_text() + "\n# changed\n")
    assert content_tag(pack(src), base) != tag


def test_build_false_builds_nothing_and_runs_the_pinned_image():
    r = synth_raw()
    assert r.of_type(IMAGE) == [] and r.of_type("trainstack:aws:TrainerImage") == []
    assert [i for i in r.invokes if i["token"] == TOKEN] == []
    assert r.outputs["imageRef"] == PINNED
    (text,) = r.user_data.values()
    assert env_line(text, "TRAINSTACK_IMAGE") == PINNED
    assert env_line(text, "TRAINSTACK_CODE_URI") == r.outputs["codeUri"] != ""


def test_build_context_is_the_archive_as_the_dockerfile_expects(tmp_path):
    data = pack()
    ctx = build_context(data, tmp_path / "image")
    assert ctx.name == Path(archive_key(data)).name.removesuffix(".tar.gz")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = sorted(m.name for m in tar.getmembers() if m.isfile())
    unpacked = sorted(str(p.relative_to(ctx)) for p in ctx.rglob("*") if p.is_file())
    assert unpacked == members and "trainer/__main__.py" in unpacked
    # Every COPY source of the Dockerfile is in the context.
    sources = [line.split()[1] for line in (ctx / "trainer" / "Dockerfile").read_text().splitlines()
               if line.startswith("COPY ")]
    assert sources and all((ctx / s).exists() for s in sources), sources
    # Same bytes, same folder; nothing else left behind.
    assert build_context(data, tmp_path / "image") == ctx
    assert sorted(p.name for p in (tmp_path / "image").iterdir()) == [ctx.name]


def test_an_archive_without_a_dockerfile_is_refused_and_leaves_nothing(tmp_path):
    src = tmp_path / "trainer"
    src.mkdir()
    (src / "__main__.py").write_text("print('hi')\n")
    with pytest.raises(FileNotFoundError, match="no trainer/Dockerfile"):
        build_context(pack(src), tmp_path / "image")
    assert list((tmp_path / "image").iterdir()) == []


def test_the_stacks_pinned_image_is_the_base_and_part_of_the_tag():
    digest = "sha256:" + "ab" * 32
    pinned = synth_raw({"image": {"build": True, "digest": digest}})
    plain = synth_raw({"image": {"build": True}})
    (a,), (b,) = pinned.of_type(IMAGE), plain.of_type(IMAGE)
    assert a["inputs"]["buildArgs"] == {"BASE_IMAGE": f"tensorflow/tensorflow@{digest}"}
    assert a["inputs"]["tags"] != b["inputs"]["tags"]
    dockerfile = (TRAINER_DIR / "Dockerfile").read_text()
    assert "FROM ${BASE_IMAGE}" in dockerfile and "ARG BASE_IMAGE=tensorflow/tensorflow:2.21.0-gpu" in dockerfile
