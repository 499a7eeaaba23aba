"""ImageRepository (GCP): immutable tags, scanning, keep the newest N versions."""



from tests.components.gcp.helpers import (
    gcp,
    one,
)


def test_repository_has_immutable_tags_scanning_and_keeps_n():
    repo = one(gcp({"image": {"keepImages": 4}}), "gcp:artifactregistry/repository:Repository")["inputs"]
    assert (repo["format"], repo["dockerConfig"]) == ("DOCKER", {"immutableTags": True})
    # The provider's only values are INHERITED and DISABLED (AUTOMATIC failed the first real up).
    assert repo["vulnerabilityScanningConfig"] == {"enablementConfig": "INHERITED"}
    policies = {p["id"]: p for p in repo["cleanupPolicies"]}
    assert policies["keep-newest"]["action"] == "KEEP"
    assert policies["keep-newest"]["mostRecentVersions"] == {"keepCount": 4}
    assert policies["delete-older"]["action"] == "DELETE"
    assert repo["cleanupPolicyDryRun"] is False

