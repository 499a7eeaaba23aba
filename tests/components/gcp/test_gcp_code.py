"""TrainerCode (GCP): the same content-addressed trainer archive as on AWS, in the GCS bucket.

The archive itself (members, determinism) is tested once, in tests/components/aws/test_aws_code.py:
both clouds pack it with components/code.py.
"""

import hashlib
import re
from pathlib import Path

from components.code import archive_key, boot_key, pack, pack_boot_scripts
from tests.components.gcp.helpers import gcp

OBJECT = "gcp:storage/bucketObject:BucketObject"


def test_stack_uploads_the_archive_and_the_boot_scripts_under_their_hashes():
    r = gcp({"storage": {"bucketName": "code-bucket"}})
    objects = {x["inputs"]["name"].split("-")[0]: x["inputs"] for x in r.of_type(OBJECT)}
    assert sorted(objects) == ["code/boot", "code/trainer"]
    boot = objects["code/boot"]
    assert Path(boot["source"]["fileAsset"]).read_bytes() == pack_boot_scripts()
    assert boot["name"] == boot_key(pack_boot_scripts()) and boot["bucket"] == "code-bucket"
    obj = objects["code/trainer"]
    asset = Path(obj["source"]["fileAsset"])
    digest = hashlib.sha256(asset.read_bytes()).hexdigest()[:16]
    assert obj["name"] == f"code/trainer-{digest}.tar.gz" == archive_key(pack())
    assert (obj["bucket"], obj["contentType"]) == ("code-bucket", "application/gzip")
    assert r.outputs["codeUri"] == f"gs://code-bucket/code/trainer-{digest}.tar.gz"


def test_image_build_uploads_only_the_boot_scripts():
    r = gcp({"image": {"build": True}})
    assert [x["inputs"]["name"] for x in r.of_type(OBJECT)] == [boot_key(pack_boot_scripts())]
    assert r.outputs["codeUri"] == ""
    (text,) = r.user_data.values()
    assert re.findall(r"^\s*TRAINSTACK_CODE_URI='([^']*)'$", text, re.M) == [""]


def test_an_archive_replaced_by_a_new_one_stays_in_the_bucket():
    """A change of code or boot scripts is a new key: machines of the old instance template still fetch the old."""
    r = gcp({"storage": {"bucketName": "code-bucket"}})
    kept = [x["options"]["retainOnDelete"] for x in r.of_type(OBJECT)]
    assert kept == [True, True]
