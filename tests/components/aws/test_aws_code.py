"""TrainerCode: a deterministic, content-addressed trainer archive in the bucket."""

import hashlib
import io
import os
import re
import tarfile
from pathlib import Path

import pytest

from components.code import archive_key, boot_key, pack, pack_boot_scripts, write_archive
from components.project import RUNFOLDER_DIR
from tests.components.aws.helpers import synth_raw

OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"


def make_trainer(root: Path) -> Path:
    src = root / "trainer"
    (src / "__pycache__").mkdir(parents=True)
    (src / "sub").mkdir()
    (src / "__init__.py").write_text("")
    (src / "__main__.py").write_text("print('train')\n")
    (src / "sub" / "models.py").write_text("X = 1\n")
    (src / "requirements.txt").write_text("tensorboard==2.20.0\n")
    (src / "Dockerfile").write_text("FROM tensorflow/tensorflow:2.21.0-gpu\n")
    (src / "__pycache__" / "models.cpython-311.pyc").write_bytes(b"\0junk")
    (src / "notes.md").write_text("not shipped\n")
    (src / ".secret.py").write_text("hidden\n")
    return src


def test_archive_holds_code_requirements_and_dockerfile_only(tmp_path):
    data = pack(make_trainer(tmp_path))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    # The run folder's package travels beside the trainer, which imports it (its .py files only).
    ground = sorted(f"runfolder/{p.relative_to(RUNFOLDER_DIR).as_posix()}" for p in RUNFOLDER_DIR.rglob("*.py")
                    if "__pycache__" not in p.parts)
    assert "runfolder/layout.py" in ground and [n for n in names if n.startswith("runfolder/")] == ground
    assert [n for n in names if not n.startswith("runfolder/")] == [
        "trainer/Dockerfile", "trainer/__init__.py", "trainer/__main__.py",
        "trainer/requirements.txt", "trainer/sub/models.py",
    ]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.mode) for m in members} == {(946684800, 0, 0, "", 0o644)}


def test_the_trainers_archive_carries_the_cuda_wheels_requirements():
    """The machines install trainer/requirements-gpu.txt from the archive (userdata/bootstrap.sh)."""
    with tarfile.open(fileobj=io.BytesIO(pack()), mode="r:gz") as tar:
        names = tar.getnames()
    assert "trainer/requirements-gpu.txt" in names and "trainer/requirements.txt" in names


def test_archive_bytes_depend_on_content_only(tmp_path):
    src = make_trainer(tmp_path / "a")
    first = pack(src)
    for p in src.rglob("*"):
        os.utime(p, (1_800_000_000, 1_800_000_000))
    assert pack(src) == first  # new mtimes, same bytes
    (src / "sub" / "models.py").write_text("X = 2\n")
    changed = pack(src)
    assert changed != first
    assert archive_key(first) != archive_key(changed)
    assert re.fullmatch(r"code/trainer-[0-9a-f]{16}\.tar\.gz", archive_key(first))


def test_empty_trainer_is_refused(tmp_path):
    (tmp_path / "trainer").mkdir()
    with pytest.raises(FileNotFoundError, match="no trainer files"):
        pack(tmp_path / "trainer")


def test_write_archive_is_content_addressed(tmp_path):
    data = pack(make_trainer(tmp_path))
    path = write_archive(data, tmp_path / "build")
    assert path.name == Path(archive_key(data)).name
    assert path.read_bytes() == data
    assert write_archive(data, tmp_path / "build") == path
    assert sorted(p.name for p in (tmp_path / "build").iterdir()) == [path.name]


def test_stack_uploads_the_archive_and_the_boot_scripts_under_their_hashes():
    r = synth_raw({"storage": {"bucketName": "code-bucket"}})
    objects = {x["inputs"]["key"].split("-")[0]: x["inputs"] for x in r.of_type(OBJECT)}
    assert sorted(objects) == ["code/boot", "code/trainer"]
    obj = objects["code/trainer"]
    asset = Path(obj["source"]["fileAsset"])
    digest = hashlib.sha256(asset.read_bytes()).hexdigest()[:16]
    assert obj["key"] == f"code/trainer-{digest}.tar.gz"
    assert obj["bucket"] == "code-bucket"
    assert r.outputs["codeUri"] == f"s3://code-bucket/code/trainer-{digest}.tar.gz"
    boot = objects["code/boot"]
    data = Path(boot["source"]["fileAsset"]).read_bytes()
    assert data == pack_boot_scripts() and boot["key"] == boot_key(data) == f"code/boot-{hashlib.sha256(data).hexdigest()[:16]}.tar.gz"
    assert boot["bucket"] == "code-bucket"
    (text,) = r.user_data.values()
    assert f"TRAINSTACK_BOOT_URI='s3://code-bucket/{boot['key']}'" in text


def test_image_build_uploads_only_the_boot_scripts_and_points_at_the_stack_repository():
    r = synth_raw({"image": {"build": True, "tag": "v3"}})
    assert [x["inputs"]["key"] for x in r.of_type(OBJECT)] == [boot_key(pack_boot_scripts())]
    assert r.outputs["codeUri"] == ""
    # The pushed trainer image, by digest (tests/components/aws/test_aws_image.py).
    assert re.fullmatch(r"123456789012\.dkr\.ecr\.eu-west-1\.amazonaws\.com/trainstack/unit@sha256:[0-9a-f]{64}",
                        r.outputs["imageRef"])
    (text,) = r.user_data.values()
    assert "TRAINSTACK_CODE_URI=''" in text


def test_an_archive_replaced_by_a_new_one_stays_in_the_bucket():
    """A change of code or boot scripts is a new key: machines of the old launch template still fetch the old."""
    r = synth_raw({"storage": {"bucketName": "code-bucket"}})
    kept = [x["options"]["retainOnDelete"] for x in r.of_type(OBJECT)]
    assert kept == [True, True]
