"""TrainingBucket (GCP): private, versioned, lifecycle, kept on destroy; valid generated names."""

import re

import pytest

from components.gcp.naming import default_bucket_name, group_name, service_account_id
from components.settings import bucket_name_problem
from tests.components.gcp.helpers import (
    gcp,
    one,
)


def test_bucket_is_private_versioned_with_lifecycle_and_kept():
    r = gcp({"storage": {"noncurrentDays": 12}})
    bucket = one(r, "gcp:storage/bucket:Bucket")
    b = bucket["inputs"]
    assert (b["uniformBucketLevelAccess"], b["publicAccessPrevention"], b["versioning"]) == (
        True, "enforced", {"enabled": True})
    assert b["location"] == "US-CENTRAL1"
    rules = [(rule["action"]["type"], rule["condition"]) for rule in b["lifecycleRules"]]
    # Checkpoint objects (Custom-Time set by the trainer) go a day after they are pruned; every
    # other version after noncurrentDays; soft delete would add 7 billed days to both: off.
    assert rules == [
        ("Delete", {"daysSinceNoncurrentTime": 1, "daysSinceCustomTime": 1, "withState": "ARCHIVED"}),
        ("Delete", {"daysSinceNoncurrentTime": 12, "withState": "ARCHIVED"}),
        ("AbortIncompleteMultipartUpload", {"age": 1}),
    ]
    assert b["softDeletePolicy"] == {"retentionDurationSeconds": 0}
    assert bucket["options"]["retainOnDelete"] is True and b["forceDestroy"] is False
    gone = one(gcp({"storage": {"keepOnDestroy": False}}), "gcp:storage/bucket:Bucket")
    assert gone["options"]["retainOnDelete"] is False and gone["inputs"]["forceDestroy"] is True


@pytest.mark.parametrize("stack", ["dev", "Prod_EU.google", "x" * 90])
def test_generated_names_are_valid(stack):
    bucket = default_bucket_name(project="trainstack", stack=stack, gcp_project="my-proj-123", region="us-central1")
    assert bucket_name_problem("gcp", bucket) is None
    sa = service_account_id(project="trainstack", stack=stack)
    assert re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", sa)
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", group_name(project="trainstack", stack=stack))

