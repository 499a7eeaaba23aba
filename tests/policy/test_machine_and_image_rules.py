"""The machine rules and the image and secret rules (policy/rules/machines.py, images.py) line by
line: IMDSv2, GCE metadata hardening, encrypted volumes; a pinned image in every machine's user
data however it is encoded; no credential in any input. Unknown values are not judged."""

from __future__ import annotations

import base64
import gzip

import pytest

from policy import rules
from policy.rules import UNKNOWN, Context, images, machines
from tests.policy import resources as R

CTX = Context(stack=R.STACK, run_id=R.RUN)
LT, TPL = "dev-group-lt", "dev-group-tpl"


def _lines(rule, res: list[dict]) -> list[str]:
    out = rule(res, CTX)
    rule_id = next(r.id for r in rules.RULES if r.check is rule)
    assert all(v.rule == rule_id for v in out), [str(v) for v in out]
    return [f"{v.resource}: {v.message}" for v in out]


def _inputs(res: list[dict], name: str) -> dict:
    return R.by_name(res, name)["inputs"]


def _resource(type_: str, rname: str, **inputs) -> dict:
    return {"type": type_, "name": rname, "parent": None, "inputs": inputs, "options": {}}


def test_the_clean_stacks_pass():
    for rule in (machines.imdsv2_required, machines.gce_metadata_hardened, machines.root_volume_encrypted,
                 images.image_pinned, images.no_secrets):
        assert _lines(rule, R.aws_stack()) == [] and _lines(rule, R.gcp_stack()) == [], rule.__name__


# -- imdsv2-required --


@pytest.mark.parametrize(("options", "want"), [
    ({"httpTokens": "required", "httpPutResponseHopLimit": "1"}, []),
    ({"httpTokens": UNKNOWN, "httpPutResponseHopLimit": UNKNOWN}, []),
    ({"httpTokens": "optional", "httpPutResponseHopLimit": 1},
     ["x: metadataOptions.httpTokens is 'optional'; set 'required'"]),
    ({"httpTokens": "required", "httpPutResponseHopLimit": 2},
     ["x: metadataOptions.httpPutResponseHopLimit is 2; set 1"]),
    ({}, ["x: metadataOptions.httpTokens is None; set 'required'",
          "x: metadataOptions.httpPutResponseHopLimit is None; set 1"]),
])
@pytest.mark.parametrize("type_", ["aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/instance:Instance"])
def test_imdsv2_with_one_hop_on_templates_and_instances(type_, options, want):
    assert _lines(machines.imdsv2_required, [_resource(type_, "x", metadataOptions=options)]) == want


# -- gce-metadata-hardened --


@pytest.mark.parametrize("type_", machines.GCE_TEMPLATES)
def test_gce_templates_keep_legacy_metadata_off_and_shielded_vm_on(type_):
    bad = _resource(type_, "t", metadata={"disable-legacy-endpoints": "FALSE"},
                    shieldedInstanceConfig={"enableVtpm": False, "enableIntegrityMonitoring": "false"})
    assert _lines(machines.gce_metadata_hardened, [bad]) == [
        "t: metadata disable-legacy-endpoints is false; remove it",
        "t: shieldedInstanceConfig.enableVtpm is false; set true",
        "t: shieldedInstanceConfig.enableIntegrityMonitoring is false; set true"]
    ok = _resource(type_, "t", metadata={"disable-legacy-endpoints": "true"},
                   shieldedInstanceConfig={"enableVtpm": UNKNOWN})
    assert _lines(machines.gce_metadata_hardened, [ok]) == []


# -- root-volume-encrypted --


def test_every_ebs_volume_of_a_template_is_encrypted():
    lt = "aws:ec2/launchTemplate:LaunchTemplate"
    mappings = [{"deviceName": "/dev/sda1", "ebs": {"encrypted": "true"}},
                {"deviceName": "/dev/sdb", "ebs": {"encrypted": False}},
                {"deviceName": "/dev/sdc", "virtualName": "ephemeral0"},  # instance store: no ebs
                {"deviceName": "/dev/sdd", "ebs": {"encrypted": UNKNOWN}},
                {"deviceName": "/dev/sde", "ebs": {}}]
    assert _lines(machines.root_volume_encrypted, [_resource(lt, "x", blockDeviceMappings=mappings)]) == [
        "x: blockDeviceMappings[1].ebs.encrypted is not true; set it",
        "x: blockDeviceMappings[4].ebs.encrypted is not true; set it"]
    assert _lines(machines.root_volume_encrypted, [_resource(lt, "x")]) == [
        "x: no blockDeviceMappings; define the root volume with ebs.encrypted true"]
    assert _lines(machines.root_volume_encrypted, [_resource(lt, "x", blockDeviceMappings=UNKNOWN),
                                                   _resource(lt, "y", blockDeviceMappings=[])]) == [
        "y: no blockDeviceMappings; define the root volume with ebs.encrypted true"]


@pytest.mark.parametrize(("root", "want"), [
    ({"encrypted": True}, []), ({"encrypted": UNKNOWN}, []),
    ({"encrypted": False}, ["i: rootBlockDevice.encrypted is not true; set it"]),
    (None, ["i: rootBlockDevice.encrypted is not true; set it"]),
])
def test_an_instances_root_device_is_encrypted(root, want):
    inst = _resource("aws:ec2/instance:Instance", "i", **({"rootBlockDevice": root} if root is not None else {}))
    assert _lines(machines.root_volume_encrypted, [inst]) == want


# -- image-pinned --


@pytest.mark.parametrize(("ref", "problem"), [
    ("tensorflow/tensorflow:2.21.0-gpu", None),
    ("reg.example:5000/team/tf:1.0", None),
    ("tf@sha256:" + "0" * 64, None),
    ("reg.example:5000/tf@sha256:" + "0" * 64, None),
    ("tf:" + "a" * 128, None),
    ("tf@sha256:abc", "digest 'sha256:abc' is not sha256:<64 hex>"),
    ("tf:1@sha256:" + "G" * 64, "digest 'sha256:" + "G" * 64 + "' is not sha256:<64 hex>"),
    ("reg.example:5000/tf", "no tag or digest (docker would pull latest); pin a tag such as 2.21.0-gpu"),
    ("tf:-rc", "tag '-rc' is not a docker tag"),
    ("tf:" + "a" * 129, f"tag {'a' * 129!r} is not a docker tag"),
    ("tf:LATEST", "tag 'LATEST' moves under a running job; pin a version tag or a digest"),
    ("tf:2.21-latest-gpu", "tag '2.21-latest-gpu' moves under a running job; pin a version tag or a digest"),
    # What follows the last "@" is the digest, and the last ":" of the name the tag.
    ("tf@sha256:" + "0" * 64 + "@sha256:abc", "digest 'sha256:abc' is not sha256:<64 hex>"),
    ("tf:2.21.0:latest", "tag 'latest' moves under a running job; pin a version tag or a digest"),
])
def test_what_pins_an_image(ref, problem):
    assert images.image_problem(ref) == problem


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_the_image_line_is_read_from_user_data_however_it_is_encoded():
    text = R.user_data("tf:latest")
    want = "TRAINSTACK_IMAGE=tf:latest: tag 'latest' moves under a running job; pin a version tag or a digest"
    lt, inst = "aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/instance:Instance"
    res = [
        _resource(lt, "plain", userData=_b64(text.encode())),
        _resource(lt, "gzipped", userData=_b64(gzip.compress(text.encode(), mtime=0))),
        # Wrapped at 76 columns, as MIME and `base64` without -w0 write it.
        _resource(lt, "wrapped", userData=base64.encodebytes(gzip.compress(text.encode(), mtime=0)).decode()),
        _resource(inst, "not-base64", userData=text),  # a tool that passes the text as it is
        # Text whose first line happens to be base64 (a blob a script echoes) is still text: read
        # leniently, it would decode to b"hi" and hide the image line.
        _resource(inst, "text-with-blob", userData="aGk=\n" + text),
        _resource(lt, "unknown", userData=UNKNOWN),
        _resource("gcp:compute/instanceTemplate:InstanceTemplate", "gce-meta", metadata={"startup-script": text}),
        _resource("gcp:compute/regionInstanceTemplate:RegionInstanceTemplate", "gce-script",
                  metadataStartupScript=text),
        _resource("gcp:compute/instanceTemplate:InstanceTemplate", "gce-unknown",
                  metadata={"user-data": UNKNOWN}, metadataStartupScript=UNKNOWN),
    ]
    assert _lines(images.image_pinned, res) == [
        f"{n}: {want}" for n in ("plain", "gzipped", "wrapped", "not-base64", "text-with-blob", "gce-meta",
                                    "gce-script")]


@pytest.mark.parametrize(("line", "want"), [
    ("TRAINSTACK_IMAGE=tf@sha256:" + "0" * 64, []),
    ('TRAINSTACK_IMAGE="tf@sha256:' + "0" * 64 + '"', []),
    ("  TRAINSTACK_IMAGE='tf@sha256:" + "0" * 64 + "'  ", []),
    ("TRAINSTACK_IMAGE=tf:2.21.0-gpu", ["t: TRAINSTACK_IMAGE=tf:2.21.0-gpu: pinned by tag only; a machine runs its image by "
                                        "digest (pulumi up resolves the tag: docs/images.md)"]),
    ("TRAINSTACK_IMAGE=''", ["t: TRAINSTACK_IMAGE=: empty image reference"]),
    ("TRAINSTACK_IMAGE=tf", ["t: TRAINSTACK_IMAGE=tf: no tag or digest (docker would pull latest); pin a tag such as "
                             "2.21.0-gpu"]),
    ("# TRAINSTACK_IMAGE=tf:1", ["t: user data sets no TRAINSTACK_IMAGE; render it with components.userdata"]),
])
def test_the_image_line_in_its_spellings(line, want):
    res = [_resource("gcp:compute/instanceTemplate:InstanceTemplate", "t", metadata={"user-data": f"#!\n{line}\n"})]
    assert _lines(images.image_pinned, res) == want


def test_every_image_line_is_judged():
    text = "TRAINSTACK_IMAGE=tf@sha256:" + "0" * 64 + "\nTRAINSTACK_IMAGE=tf\n"
    res = [_resource("gcp:compute/instanceTemplate:InstanceTemplate", "t", metadata={"user-data": text})]
    assert _lines(images.image_pinned, res) == [
        "t: TRAINSTACK_IMAGE=tf: no tag or digest (docker would pull latest); pin a tag such as 2.21.0-gpu"]


@pytest.mark.parametrize(("mutability", "want"), [
    ("IMMUTABLE", []), (UNKNOWN, []),
    ("MUTABLE", ["r: imageTagMutability is not IMMUTABLE; a pushed tag could be replaced"]),
    (None, ["r: imageTagMutability is not IMMUTABLE; a pushed tag could be replaced"]),
])
def test_an_ecr_repository_keeps_its_tags(mutability, want):
    res = [_resource("aws:ecr/repository:Repository", "r", imageTagMutability=mutability)]
    assert _lines(images.image_pinned, res) == want


# -- no-secrets --

KEY_ID = "AKIAIOSFODNN7EXAMPLE"


def test_a_credential_is_named_where_it_is():
    res = R.aws_stack()
    _inputs(res, LT)["userData"] = _b64(gzip.compress(R.user_data(extra=f"AWS_ACCESS_KEY_ID='{KEY_ID}'\n").encode()))
    res.append(_resource("aws:sns/topic:Topic", "t", tags={"note": f"key {KEY_ID}"},
                         policy={"Statement": [{"Sid": KEY_ID}]}, name=KEY_ID))
    assert _lines(images.no_secrets, res) == [
        "dev-group-lt: user data holds an AWS access key id; the machine's role gives it credentials",
        "t: input tags.note holds an AWS access key id; remove it",
        "t: input policy.Statement[0].Sid holds an AWS access key id; remove it",
        "t: input name holds an AWS access key id; remove it"]


def test_user_data_is_judged_decoded_once_not_as_its_base64():
    # A launch template's userData input is read decoded (above), never reported a second time as an input.
    res = [_resource("aws:ec2/launchTemplate:LaunchTemplate", "lt",
                     userData=f"TRAINSTACK_IMAGE=tf:1\nAWS_ACCESS_KEY_ID={KEY_ID}\n", description=f"key {KEY_ID}")]
    assert _lines(images.no_secrets, res) == [
        "lt: user data holds an AWS access key id; the machine's role gives it credentials",
        "lt: input description holds an AWS access key id; remove it"]
