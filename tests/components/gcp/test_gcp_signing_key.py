"""SigningKey (GCP): the Cloud KMS key a build stack signs its image with: the values Cloud KMS documents for an
EC P-256 signing key (its discovery document), its one version, the key ring's name that a destroy frees, and the
Cloud KMS API turned on for it."""

from __future__ import annotations

import json
import re

import pytest
from googleapiclient.discovery_cache import get_static_doc

from tests.components.gcp.helpers import gcp, one

CRYPTO_KEY = "gcp:kms/cryptoKey:CryptoKey"
RING = "gcp:kms/keyRing:KeyRing"
VERSION = "gcp:kms/cryptoKeyVersion:CryptoKeyVersion"


@pytest.fixture(scope="module")
def built():
    return gcp({"image": {"build": True}})


def test_a_build_stack_has_one_ec_p256_signing_key_in_home_and_a_pinned_image_none(built):
    schemas = json.loads(get_static_doc("cloudkms", "v1"))["schemas"]
    key = one(built, CRYPTO_KEY)["inputs"]
    assert key["purpose"] == "ASYMMETRIC_SIGN" in schemas["CryptoKey"]["properties"]["purpose"]["enum"]
    template = schemas["CryptoKeyVersionTemplate"]["properties"]
    assert key["versionTemplate"]["algorithm"] == "EC_SIGN_P256_SHA256" in template["algorithm"]["enum"]
    assert key["versionTemplate"]["protectionLevel"] == "SOFTWARE" in template["protectionLevel"]["enum"]
    assert key["skipInitialVersionCreation"] is True and key["labels"]["trainstack-stack"] == "unit"
    ring = one(built, RING)["inputs"]
    assert (ring["location"], ring["project"]) == ("us-central1", "my-proj-123")
    assert key["keyRing"] == f"projects/my-proj-123/locations/us-central1/keyRings/{ring['name']}"
    assert one(built, VERSION)["inputs"]["cryptoKey"] == f"{key['keyRing']}/cryptoKeys/image-signing"
    plain = gcp()
    assert not [x for x in plain.resources if x["type"].startswith("gcp:kms/")]


def test_the_key_rings_name_fits_cloud_kms_and_ends_in_random_hex_kept_in_state(built):
    from components.gcp.naming import key_ring_name, key_ring_prefix

    name = one(built, RING)["inputs"]["name"]
    (suffix,) = [x for x in built.resources if x["name"] == "trainstack-signing-suffix"]
    assert suffix["type"] == "random:index/randomId:RandomId" and suffix["inputs"]["byteLength"] == 4
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,63}", name) and re.fullmatch(r"trainstack-unit-[0-9a-f]{8}", name)
    longest = key_ring_name(key_ring_prefix(project="p" * 80, stack="s" * 80), "f" * 8)
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,63}", longest)


def test_only_a_build_stack_turns_on_cloud_kms(built):
    def services(r) -> set[str]:
        return {x["inputs"]["service"] for x in r.of_type("gcp:projects/service:Service")}

    assert "cloudkms.googleapis.com" in services(built)
    assert "cloudkms.googleapis.com" not in services(gcp())
