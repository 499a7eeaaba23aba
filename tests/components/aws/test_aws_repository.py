"""ImageRepository: immutable tags, scan on push, encryption, keep the last N images."""

import json

from components.aws.repository import lifecycle_policy
from tests.components.aws.helpers import one, synth_raw


def test_repository_is_immutable_scanned_and_encrypted():
    r = synth_raw(stack="repo")
    repo = one(r, "aws:ecr/repository:Repository")["inputs"]
    assert repo["name"] == "trainstack/repo"
    assert repo["imageTagMutability"] == "IMMUTABLE"
    assert repo["imageScanningConfiguration"] == {"scanOnPush": True}
    assert [e["encryptionType"] for e in repo["encryptionConfigurations"]] == ["AES256"]


def test_lifecycle_keeps_the_configured_number_of_images():
    r = synth_raw({"image": {"keepImages": 4}})
    lifecycle = one(r, "aws:ecr/lifecyclePolicy:LifecyclePolicy")
    rules = json.loads(lifecycle["inputs"]["policy"])["rules"]
    assert len(rules) == 1
    assert rules[0]["selection"] == {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": 4}
    assert rules[0]["action"] == {"type": "expire"}
    assert lifecycle["inputs"]["repository"] == "trainstack/unit"
    assert json.loads(lifecycle_policy(10))["rules"][0]["selection"]["countNumber"] == 10
