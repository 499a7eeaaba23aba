"""`ops synth` and the image's digest: offline, the tag's digest is a stand-in, and synth says where
`pulumi up` would get the real one; a digest the stack file gives is used as it is."""

from __future__ import annotations

import hashlib
import shlex

import yaml

from components import registry
from ops import synth

STACK = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}}


def _machine_image(result) -> str:
    (doc,) = result.user_data.values()
    env = next(f["content"] for f in yaml.safe_load(doc)["write_files"] if f["path"].endswith("/env"))
    values = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    return shlex.split(values["TRAINSTACK_IMAGE"])[0]


def test_synth_pins_the_machines_to_a_stand_in_digest_and_says_where_pulumi_up_looks():
    result = synth.synthesize({**STACK, "image": {"tag": "2.21.0-gpu"}})
    stand_in = "sha256:" + hashlib.sha256(b"synth stand-in for tensorflow/tensorflow:2.21.0-gpu").hexdigest()
    assert _machine_image(result) == f"tensorflow/tensorflow@{stand_in}"
    assert result.outputs["imageRef"] == f"tensorflow/tensorflow@{stand_in}"
    url = "https://registry-1.docker.io/v2/tensorflow/tensorflow/manifests/2.21.0-gpu"
    assert result.digest_lookups == [("tensorflow/tensorflow", "2.21.0-gpu", url)]
    lines = synth.image_lines(result, synth.load_source({**STACK, "image": {"tag": "2.21.0-gpu"}}).settings)
    assert lines == [f"image: tensorflow/tensorflow:2.21.0-gpu: `pulumi up` resolves the tag to its digest at {url} "
                     "and every machine runs that digest; synth used a stand-in (pin one with image.digest)"]
    # The stand-in is synth's alone: outside a mock run the registry itself is asked.
    assert registry.DIGEST_SOURCE.get() is registry.manifest_digest


def test_a_digest_in_the_stack_file_is_what_every_machine_runs_and_no_registry_is_named():
    digest = "sha256:" + "7" * 64
    source = synth.load_source({**STACK, "image": {"digest": digest}})
    result = synth.synthesize(source)
    assert _machine_image(result) == f"tensorflow/tensorflow@{digest}"
    assert result.digest_lookups == []
    assert synth.image_lines(result, source.settings) == [f"image: tensorflow/tensorflow@{digest} (image.digest)"]


def test_the_synth_command_prints_where_the_digest_comes_from(tmp_path, capsys):
    import argparse

    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.t.yaml").write_text(yaml.safe_dump({"config": {
        "trainstack:cloud": "aws", "trainstack:region": "us-east-1", "trainstack:run": {"synthetic": True}}}))
    args = argparse.Namespace(stack="t", out=str(tmp_path / "out"), stacks_dir=str(tmp_path / "stacks"), offline=True)
    assert synth.cmd_synth(args) == 0
    out = capsys.readouterr().out
    assert ("image: tensorflow/tensorflow:2.21.0-gpu: `pulumi up` resolves the tag to its digest at "
            "https://registry-1.docker.io/v2/tensorflow/tensorflow/manifests/2.21.0-gpu") in out


def test_the_synth_command_on_a_build_stack_writes_and_names_the_signing_key_and_the_signature(tmp_path, capsys):
    import argparse
    import json

    for cloud, extra, key_type in (
            ("aws", {"trainstack:region": "us-east-1"}, "aws:kms/key:Key"),
            ("gcp", {"trainstack:region": "us-central1", "trainstack:project": "my-proj-123",
                     "trainstack:compute": {"instanceTypes": ["g2-standard-8"]}}, "gcp:kms/cryptoKey:CryptoKey")):
        (tmp_path / cloud / "stacks").mkdir(parents=True)
        (tmp_path / cloud / "stacks" / "Pulumi.t.yaml").write_text(yaml.safe_dump({"config": {
            "trainstack:cloud": cloud, "trainstack:run": {"synthetic": True}, "trainstack:image": {"build": True},
            **extra}}))
        args = argparse.Namespace(stack="t", out=str(tmp_path / cloud / "out"), stacks_dir=str(tmp_path / cloud / "stacks"),
                                  offline=True)
        assert synth.cmd_synth(args) == 0
        out = capsys.readouterr().out
        written = json.loads((tmp_path / cloud / "out" / "resources.json").read_text())
        assert [r["name"] for r in written if r["type"] == key_type] == ["trainstack-signing-key"]
        assert [r["parent"] for r in written if r["name"] == "trainstack-image-signature"] == ["trainstack-image"]
        (line,) = [x for x in out.splitlines() if x.startswith("image.build: then signed by")]
        assert "trainstack-signing-key" in line and "TRAINSTACK_IMAGE_PUBLIC_KEY" in line
        (doc,) = (tmp_path / cloud / "out" / "user-data").glob("*.yaml")
        assert "TRAINSTACK_IMAGE_PUBLIC_KEY='MF" in doc.read_text()  # a P-256 key's DER, in base64
