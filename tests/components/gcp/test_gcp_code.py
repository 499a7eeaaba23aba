"""TrainerCode (GCP): the same content-addressed trainer archive as on AWS, in the GCS bucket.

The archive itself (members, determinism) is tested once, in tests/components/aws/test_aws_code.py:
both clouds pack it with components/code.py.
"""

import hashlib
import re
from pathlib import Path

from components.code import archive_key, pack
from tests.components.gcp.helpers import gcp, one

OBJECT = "gcp:storage/bucketObject:BucketObject"


def test_stack_uploads_the_archive_under_its_hash():
    r = gcp({"storage": {"bucketName": "code-bucket"}})
    obj = one(r, OBJECT)["inputs"]
    asset = Path(obj["source"]["fileAsset"])
    digest = hashlib.sha256(asset.read_bytes()).hexdigest()[:16]
    assert obj["name"] == f"code/trainer-{digest}.tar.gz" == archive_key(pack())
    assert (obj["bucket"], obj["contentType"]) == ("code-bucket", "application/gzip")
    assert r.outputs["codeUri"] == f"gs://code-bucket/code/trainer-{digest}.tar.gz"


def test_image_build_uploads_nothing():
    r = gcp({"image": {"build": True}})
    assert r.of_type(OBJECT) == []
    assert r.outputs["codeUri"] == ""
    (text,) = r.user_data.values()
    assert re.findall(r"^\s*TRAINSTACK_CODE_URI='([^']*)'$", text, re.M) == [""]
