"""Labels: every labellable GCP resource carries project, stack and run (lowercased, filtered).

The label function itself is tested with the AWS tags (tests/components/aws/test_aws_tags.py).
"""

from tests.components.gcp.helpers import SSH_KEY, gcp

EXPECTED = {"trainstack-project": "trainstack", "trainstack-stack": "tagged", "trainstack-run": "exp-7"}
LABELLED = {
    "gcp:storage/bucket:Bucket", "gcp:artifactregistry/repository:Repository",
    "gcp:compute/instanceTemplate:InstanceTemplate",
}


def test_every_labellable_resource_is_labelled_with_project_stack_and_run():
    r = gcp({"access": {"sshPublicKey": SSH_KEY}, "compute": {"nodes": 2}}, stack="tagged")
    labelled = [x for x in r.resources if "labels" in x["inputs"]]
    assert sorted({x["type"] for x in labelled}) == sorted(LABELLED)
    missing = [x["name"] for x in labelled if not EXPECTED.items() <= x["inputs"]["labels"].items()]
    assert missing == []
    # Labels GCE refuses never reach it: lowercase keys and values only.
    assert all(k == k.lower() and v == v.lower() for x in labelled for k, v in x["inputs"]["labels"].items())
