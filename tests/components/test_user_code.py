"""`run.code` ships with the trainer on both clouds: in the content-hashed archive and in the built image.

The archive holds `trainer/` and the user's folder as `usercode/`; the machines' env file names
that folder as the trainer's `--code-dir` (TRAINSTACK_CODE_DIR); an unchanged folder gives the
same bytes, so nothing is uploaded again.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from components.code import archive_key, build_context, pack
from components.userdata import USER_CODE_DIR
from tests.components.aws.helpers import synth_raw
from tests.components.gcp.helpers import gcp

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "image-cnn"
RUN = {"model": "shapes.model:build", "code": "examples/image-cnn"}
OBJECTS = {"aws": "aws:s3/bucketObjectv2:BucketObjectv2", "gcp": "gcp:storage/bucketObject:BucketObject"}
IMAGE = "docker-build:index:Image"


def _synth(cloud: str, overrides: dict):
    return synth_raw(overrides) if cloud == "aws" else gcp(overrides)


def _names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return [m.name for m in tar.getmembers()]


def _env(text: str, key: str) -> list[str]:
    return re.findall(rf"^\s*{key}='([^']*)'$", text, re.M)


def test_archive_holds_trainer_and_user_folder_and_is_stable(tmp_path):
    user = tmp_path / "mine"
    (user / "pkg" / "__pycache__").mkdir(parents=True)
    (user / "pkg" / "model.py").write_text("def build(): pass\n")
    (user / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (user / "labels.json").write_text("[]\n")
    (user / ".env").write_text("SECRET=1\n")
    first = pack(user_code=user)
    names = _names(first)
    assert [n for n in names if n.startswith("usercode/")] == ["usercode/labels.json", "usercode/pkg/model.py"]
    assert "trainer/__main__.py" in names and names == [*sorted(n for n in names if n.startswith("runfolder/")),
                                                        *sorted(n for n in names if n.startswith("trainer/")),
                                                        "usercode/labels.json", "usercode/pkg/model.py"]
    assert pack(user_code=user) == first  # unchanged folder: same bytes, same key, no upload
    (user / "pkg" / "model.py").write_text("def build(): return 1\n")
    assert archive_key(pack(user_code=user)) != archive_key(first)
    assert not any(n.startswith("usercode/") for n in _names(pack()))


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_stack_with_run_code_uploads_it_and_names_it_for_the_trainer(cloud):
    r = _synth(cloud, {"run": RUN})
    # The trainer's archive (the other object is the machines' boot scripts).
    (obj,) = [x for x in r.of_type(OBJECTS[cloud]) if "/trainer-" in x["inputs"]["name" if cloud == "gcp" else "key"]]
    data = Path(obj["inputs"]["source"]["fileAsset"]).read_bytes()
    names = _names(data)
    for p in ("shapes/model.py", "shapes/data.py", "write_tfrecords.py"):
        assert f"usercode/{p}" in names, names
    assert obj["inputs"]["name" if cloud == "gcp" else "key"] == archive_key(data)
    (text,) = r.user_data.values()
    assert _env(text, "TRAINSTACK_CODE_DIR") == [USER_CODE_DIR]
    assert _env(text, "TRAINSTACK_MODEL") == ["shapes.model:build"]
    plain = _synth(cloud, {})
    (plain_text,) = plain.user_data.values()
    assert _env(plain_text, "TRAINSTACK_CODE_DIR") == []


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_built_image_context_holds_the_user_folder(cloud, tmp_path):
    r = _synth(cloud, {"run": RUN, "image": {"build": True}})
    (img,) = r.of_type(IMAGE)
    context = ROOT / img["inputs"]["context"]["location"]
    assert (context / "usercode" / "shapes" / "model.py").read_bytes() == (EXAMPLE / "shapes" / "model.py").read_bytes()
    dockerfile = (context / "trainer" / "Dockerfile").read_text()
    assert "COPY . /opt/trainstack/code/" in dockerfile and "usercode/requirements.txt" in dockerfile
    assert USER_CODE_DIR == "/opt/trainstack/code/usercode"
    # The same code gives the same context folder (and tag); the plain stack's differs.
    data = pack(user_code=EXAMPLE)
    assert build_context(data, tmp_path).name == Path(archive_key(data)).name.removesuffix(".tar.gz")
    (plain,) = _synth(cloud, {"image": {"build": True}}).of_type(IMAGE)
    assert plain["inputs"]["tags"] != img["inputs"]["tags"]
