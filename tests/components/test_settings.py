"""Stack config validation: every bad stack file is refused with one line naming the key and the fix.

Each case is the dev stack file with one thing broken, written to a temp folder as a real
stack file. It must fail in `load_stack_file` with a `ConfigError` on the expected key,
and `python -m ops synth` (the same entry point, called in-process; a few also as a real
process) must exit 2 with exactly that line on stderr, write nothing and run nothing.
"""

from __future__ import annotations

import base64
import copy
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import settings as st
from components.settings import ConfigError, load_settings, load_stack_file

ROOT = Path(__file__).resolve().parents[2]
DEV = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
DEL = object()  # remove this key


def _ed25519_public_key() -> str:
    """A well-formed OpenSSH ed25519 public key (32 bytes of key data)."""
    blob = struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + bytes(range(32))
    return "ssh-ed25519 " + base64.b64encode(blob).decode() + " me@laptop"


KEY = _ed25519_public_key()
RSA_HEADER_ED_BLOB = "ssh-rsa " + KEY.split()[1]


class Whole:
    """Replace a block entirely instead of merging into it."""

    def __init__(self, value: Any):
        self.value = value


def _apply(doc: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    cfg = doc["config"]
    for name, change in changes.items():
        key = name.replace("__", ":").replace("trainstack_", "trainstack:")
        if change is DEL:
            cfg.pop(key, None)
        elif isinstance(change, Whole):
            cfg[key] = change.value
        elif isinstance(change, dict) and isinstance(cfg.get(key), dict):
            for k, v in change.items():
                if v is DEL:
                    cfg[key].pop(k, None)
                else:
                    cfg[key][k] = v
        else:
            cfg[key] = change
    return doc


def stack(**changes: Any) -> dict[str, Any]:
    """The dev stack file with changes: trainstack_run={...} merges into trainstack:run
    (DEL removes a key), Whole(value) or a non-dict value replaces the key, DEL removes it."""
    return _apply(copy.deepcopy(DEV), changes)


def gcp(**changes: Any) -> dict[str, Any]:
    """A valid GCP stack file with changes (same rules as `stack`)."""
    doc = stack(
        trainstack_cloud="gcp", trainstack_region="us-central1", trainstack_project="my-project-123",
        trainstack_compute=Whole({"instanceTypes": ["g2-standard-8"], "gpusPerNode": 1, "nodes": 1, "spot": True,
                                  "maxRuntimeHours": 10, "rootDiskGb": 200}),
    )
    return _apply(doc, changes)


R, C, IMG, S, A = "trainstack_run", "trainstack_compute", "trainstack_image", "trainstack_storage", "trainstack_access"
WITH_KEY = {"sshPublicKey": KEY}

# (case id, stack document or raw YAML text, key named, message fragment)
INVALID: list[tuple[str, dict[str, Any] | str, str, str]] = [
    # the file and its top-level keys
    ("not-yaml", "config:\n  trainstack:run: [unclosed\n", "config", "not valid YAML"),
    ("yaml-error-names-the-line", "config:\n  trainstack:cloud: aws\n  trainstack:region: us-east-1\n"
     "  trainstack:run:\n    steps: 10\n   synthetic: true\n", "config", "not valid YAML at line 6"),
    ("yaml-unclosed-names-where-it-opened", "config:\n  trainstack:cloud: aws\n  trainstack:run: [unclosed\n",
     "config", "flow sequence opened at line 3"),
    ("config-not-mapping", "config: [a, b]\n", "config", "expected a mapping"),
    ("unknown-top-key", stack(trainstack__regoin="us-east-1"), "regoin", "did you mean trainstack:region"),
    ("cloud-azure", stack(trainstack_cloud="azure"), "cloud", "expected aws or gcp"),
    ("region-missing", stack(trainstack_region=DEL), "region", "is required"),
    ("region-malformed", stack(trainstack_region="us-east"), "region", "not an AWS region"),
    ("region-of-gcp-on-aws", stack(trainstack_region="us-central1"), "region", "not an AWS region"),
    ("run-missing", stack(trainstack_run=DEL), "run", "is required"),
    ("run-not-a-block", stack(trainstack_run="synthetic"), "run", "expected a block of keys"),
    ("project-on-aws", stack(trainstack_project="my-project"), "project", "remove it on an AWS stack"),
    ("secure-block", stack(trainstack_run=Whole({"secure": "v1:abcdef"})), "run", "pulumi config set --secret"),
    ("provider-region-differs", stack(aws__region="eu-west-1"), "aws:region", "differs from trainstack:region"),
    ("plain-aws-secret-key", stack(aws__secretKey="wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"), "aws:secretKey", "plain text"),
    # run
    ("run-unknown-key", stack(**{R: {"stpes": 10}}), "run.stpes", "did you mean 'steps'"),
    ("steps-zero", stack(**{R: {"steps": 0}}), "run.steps", "greater than 0"),
    ("command-without-code", stack(**{R: {"synthetic": DEL, "command": ["python", "train.py"]}}), "run.command",
     "needs run.code"),
    ("command-with-data", stack(**{R: {"code": "examples/keras-fit", "command": ["python", "train.py"]}}),
     "run.command", "cannot be combined with run.synthetic or run.dataUri"),
    ("command-with-steps", stack(**{R: {"synthetic": DEL, "code": "examples/keras-fit", "batchSize": DEL,
                                        "checkpointEverySteps": DEL, "command": ["python", "train.py"]}}),
     "run.steps", "does not apply to run.command"),
    ("command-with-batch-size", stack(**{R: {"synthetic": DEL, "code": "examples/keras-fit", "steps": DEL,
                                             "checkpointEverySteps": DEL, "command": ["python", "train.py"]}}),
     "run.batchSize", "does not apply to run.command"),
    ("command-on-several-machines", stack(**{R: {"synthetic": DEL, "code": "examples/keras-fit", "steps": DEL,
                                                 "batchSize": DEL, "checkpointEverySteps": DEL,
                                                 "command": ["python", "train.py"]},
                                             C: {"nodes": 2, "instanceTypes": ["g5.xlarge"]}}),
     "run.keras", "needs run.keras: 2 (Keras 3's fit fails under MultiWorkerMirroredStrategy, keras-team/keras#20585)"),
    ("keras-three-on-several-machines", stack(**{R: {"synthetic": DEL, "code": "examples/keras-fit", "steps": DEL,
                                                     "batchSize": DEL, "checkpointEverySteps": DEL, "keras": 3,
                                                     "command": ["python", "train.py"]},
                                                 C: {"nodes": 2, "instanceTypes": ["g5.xlarge"]}}),
     "run.keras", "3: run.command on compute.nodes 2 needs run.keras: 2"),
    ("keras-not-two-or-three", stack(**{R: {"synthetic": DEL, "code": "examples/keras-fit", "steps": DEL,
                                            "batchSize": DEL, "checkpointEverySteps": DEL, "keras": 1,
                                            "command": ["python", "train.py"]}}),
     "run.keras", "expected 2 (tf_keras"),
    ("keras-without-command", stack(**{R: {"keras": 2}}), "run.keras", "applies to run.command only"),
    # The checkpoint interval may be as long as the run, not longer.
    ("checkpoint-past-cap-by-a-second", stack(**{R: {"checkpointEverySeconds": 3601}, C: {"maxRuntimeHours": 1}}),
     "run.checkpointEverySeconds", "3601: longer than compute.maxRuntimeHours (1.0 h)"),
    ("steps-negative", stack(**{R: {"steps": -5}}), "run.steps", "greater than 0"),
    ("steps-text", stack(**{R: {"steps": "many"}}), "run.steps", "expected a whole number"),
    ("steps-fraction", stack(**{R: {"steps": 1.5}}), "run.steps", "expected a whole number"),
    ("steps-bool", stack(**{R: {"steps": True}}), "run.steps", "not true/false"),
    ("batch-too-big", stack(**{R: {"batchSize": 100_000}}), "run.batchSize", "65536 or less"),
    ("synthetic-not-bool", stack(**{R: {"synthetic": "maybe"}}), "run.synthetic", "expected true or false"),
    ("synthetic-and-data", stack(**{R: {"dataUri": "s3://my-data/x/"}}), "run.dataUri", "not both"),
    ("no-data-source", stack(**{R: {"synthetic": DEL}}), "run.dataUri", "synthetic: true"),
    ("data-of-other-cloud", stack(**{R: {"synthetic": DEL, "dataUri": "gs://my-data/x/"}}), "run.dataUri", "expected s3://"),
    ("validation-of-other-cloud", stack(**{R: {"validationDataUri": "gs://my-data/val/"}}), "run.validationDataUri",
     "expected s3://"),
    ("eval-every-zero", stack(**{R: {"evalEverySteps": 0}}), "run.evalEverySteps", "greater than 0"),
    ("keep-best-not-validation", stack(**{R: {"keepBest": "accuracy"}}), "run.keepBest", "val_<name>"),
    ("keep-best-bad-direction", stack(**{R: {"keepBest": "val_loss:down"}}), "run.keepBest", ":min or :max"),
    ("keep-best-no-validation-set", stack(**{R: {"synthetic": DEL, "dataUri": "s3://my-data/x/",
                                                 "keepBest": "val_accuracy"}}), "run.keepBest",
     "needs a validation set: set validationDataUri"),
    ("eval-every-with-command", stack(**{R: {"synthetic": DEL, "code": "examples/keras-fit",
                                             "command": ["python", "train.py"], "evalEverySteps": 100}}),
     "run.evalEverySteps", "cannot be combined with run.command"),
    ("run-id-uppercase", stack(**{R: {"id": "My Run"}}), "run.id", "lowercase"),
    ("model-unknown", stack(**{R: {"model": "resnet"}}), "run.model", "package.module:function"),
    ("user-model-without-code", stack(**{R: {"model": "shapes.model:build"}}), "run.model", "set run.code"),
    ("code-missing-folder", stack(**{R: {"model": "shapes.model:build", "code": "examples/nope"}}), "run.code",
     "no such folder"),
    ("extra-args-not-list", stack(**{R: {"extraArgs": "--xla"}}), "run.extraArgs", "expected a list"),
    ("extra-args-override", stack(**{R: {"extraArgs": ["--steps=5"]}}), "run.extraArgs", "set by the stack itself"),
    ("checkpoint-past-cap", stack(**{R: {"checkpointEverySeconds": 40_000}}), "run.checkpointEverySeconds",
     "longer than compute.maxRuntimeHours"),
    ("no-checkpoint-interval", stack(**{R: {"checkpointEverySteps": None, "checkpointEverySeconds": None}}),
     "run.checkpointEverySteps", "or both"),
    ("keep-zero-checkpoints", stack(**{R: {"keepCheckpoints": 0}}), "run.keepCheckpoints", "1 or more"),
    ("seed-negative", stack(**{R: {"seed": -1}}), "run.seed", "0 or more"),
    ("aws-key-in-args", stack(**{R: {"extraArgs": ["--key=AKIAIOSFODNN7EXAMPLE"]}}), "run.extraArgs[0]",
     "AWS access key id"),
    # compute
    ("types-empty", stack(**{C: {"instanceTypes": []}}), "compute.instanceTypes", "at least 1 entry"),
    ("types-not-list", stack(**{C: {"instanceTypes": "g5.xlarge"}}), "compute.instanceTypes", "expected a list"),
    ("type-of-gcp-shape-on-aws", stack(**{C: {"instanceTypes": ["e2-standard-4"]}}), "compute.instanceTypes[0]",
     "is a GCE machine type"),
    ("type-like-nothing", stack(**{C: {"instanceTypes": ["quantum"]}}), "compute.instanceTypes[0]",
     "is not a known AWS GPU machine type"),
    ("type-of-gcp-on-aws", stack(**{C: {"instanceTypes": ["n1-standard-8"]}}), "compute.instanceTypes[0]",
     "is a GCE machine type; this stack's cloud is aws"),
    ("type-typo", stack(**{C: {"instanceTypes": ["g5.xlarge", "g5.xlarg"]}}), "compute.instanceTypes[1]",
     "did you mean 'g5.xlarge'"),
    ("type-without-gpu", stack(**{C: {"instanceTypes": ["t3.large"]}}), "compute.instanceTypes[0]",
     "not a known AWS GPU machine type"),
    ("types-duplicate", stack(**{C: {"instanceTypes": ["g5.xlarge", "g5.xlarge"]}}), "compute.instanceTypes",
     "each type once"),
    ("gpus-machine-lacks", stack(**{C: {"gpusPerNode": 4}}), "compute.gpusPerNode", "g5.xlarge has 1 GPU"),
    ("gpus-zero", stack(**{C: {"gpusPerNode": 0}}), "compute.gpusPerNode", "1 or more"),
    ("nodes-zero", stack(**{C: {"nodes": 0}}), "compute.nodes", "1 or more"),
    ("nodes-too-many", stack(**{C: {"nodes": 100}}), "compute.nodes", "64 or less"),
    ("spot-not-bool", stack(**{C: {"spot": "sometimes"}}), "compute.spot", "expected true or false"),
    ("price-negative", stack(**{C: {"maxPricePerHour": -1}}), "compute.maxPricePerHour", "greater than 0"),
    ("price-infinite", stack(**{C: {"maxPricePerHour": float("inf")}}), "compute.maxPricePerHour", "finite"),
    ("runtime-nan", stack(**{C: {"maxRuntimeHours": float("nan")}}), "compute.maxRuntimeHours", "finite"),
    ("price-on-demand", stack(**{C: {"spot": False, "maxPricePerHour": 2.5}}), "compute.maxPricePerHour",
     "only applies to spot"),
    ("runtime-zero", stack(**{C: {"maxRuntimeHours": 0}}), "compute.maxRuntimeHours", "greater than 0"),
    ("runtime-month-plus", stack(**{C: {"maxRuntimeHours": 1000}}), "compute.maxRuntimeHours", "720 or less"),
    ("disk-too-small", stack(**{C: {"rootDiskGb": 10}}), "compute.rootDiskGb", "30 or more"),
    ("ami-malformed", stack(**{C: {"imageId": "ubuntu-22.04"}}), "compute.imageId", "expected an AMI id"),
    ("subnet-malformed", stack(**{C: {"subnets": ["sn-1"]}}), "compute.subnets[0]", "expected an AWS subnet id"),
    ("zone-of-other-region", stack(**{C: {"zones": ["us-east-1a", "us-west-2a"]}}), "compute.zones[1]",
     "not a zone of region us-east-1"),
    ("accelerator-on-aws", stack(**{C: {"accelerator": "nvidia-tesla-t4"}}), "compute.accelerator",
     "only GCP N1 machine types"),
    ("compute-unknown-key", stack(**{C: {"instanceType": "g5.xlarge"}}), "compute.instanceType",
     "did you mean 'instanceTypes'"),
    # image
    ("tag-latest", stack(**{IMG: {"tag": "latest"}}), "image.tag", "'latest' moves under a running job"),
    ("tag-latest-gpu", stack(**{IMG: {"tag": "latest-gpu"}}), "image.tag", "pinned tag"),
    ("tag-number", stack(**{IMG: {"tag": 2.21}}), "image.tag", "quote the value"),
    ("tag-empty", stack(**{IMG: {"tag": ""}}), "image.tag", "expected a docker tag"),
    ("repository-with-tag", stack(**{IMG: {"repository": "tensorflow/tensorflow:2.21.0-gpu"}}), "image.repository",
     "put them in image.tag"),
    ("repository-uppercase", stack(**{IMG: {"repository": "TensorFlow/TF"}}), "image.repository", "expected a repository"),
    ("digest-short", stack(**{IMG: {"digest": "sha256:abc"}}), "image.digest", "64 lowercase hex"),
    ("digest-other-algorithm", stack(**{IMG: {"digest": "md5:" + "a" * 32}}), "image.digest", "sha256:"),
    ("build-not-bool", stack(**{IMG: {"build": "sometimes"}}), "image.build", "expected true or false"),
    ("keep-no-images", stack(**{IMG: {"keepImages": 0}}), "image.keepImages", "1 or more"),
    ("max-severity-unknown", stack(**{IMG: {"build": True, "maxSeverity": "SEVERE"}}), "image.maxSeverity",
     "expected INFORMATIONAL, LOW, MEDIUM, HIGH or CRITICAL"),
    ("allow-finding-no-reason", stack(**{IMG: {"build": True, "allowFindings": [
        {"id": "CVE-2024-3094", "reason": "", "expires": "2026-01-01"}]}}), "image.allowFindings[0].reason", "a reason"),
    ("scan-wait-zero", stack(**{IMG: {"build": True, "scanWaitMinutes": 0}}), "image.scanWaitMinutes", "1 or more"),
    # storage
    ("bucket-uppercase", stack(**{S: {"bucketName": "My_Bucket"}}), "storage.bucketName", "lowercase"),
    ("bucket-short", stack(**{S: {"bucketName": "ab"}}), "storage.bucketName", "3-63 characters"),
    ("bucket-ip", stack(**{S: {"bucketName": "192.168.1.1"}}), "storage.bucketName", "not an IP address"),
    ("bucket-reserved-prefix", stack(**{S: {"bucketName": "xn--bucket"}}), "storage.bucketName", "AWS reserves"),
    ("bucket-dash-start", stack(**{S: {"bucketName": "-bucket"}}), "storage.bucketName", "start and end"),
    ("keep-not-bool", stack(**{S: {"keepOnDestroy": "yes please"}}), "storage.keepOnDestroy", "expected true or false"),
    ("noncurrent-zero", stack(**{S: {"noncurrentDays": 0}}), "storage.noncurrentDays", "1 or more"),
    ("adopt-not-bool", stack(**{S: {"adopt": "please"}}), "storage.adopt", "expected true or false"),
    # access
    ("cidr-prefix-33", stack(**{A: {**WITH_KEY, "allowedCidrs": ["10.0.0.0/33"]}}), "access.allowedCidrs",
     "is not a CIDR"),
    ("cidr-word", stack(**{A: {**WITH_KEY, "allowedCidrs": ["my-office"]}}), "access.allowedCidrs", "is not a CIDR"),
    ("cidr-host-bits", stack(**{A: {**WITH_KEY, "allowedCidrs": ["10.0.0.1/24"]}}), "access.allowedCidrs",
     "host bits set"),
    ("cidr-bare-address", stack(**{A: {**WITH_KEY, "allowedCidrs": ["203.0.113.7"]}}), "access.allowedCidrs",
     "203.0.113.7/32"),
    ("cidrs-not-list", stack(**{A: {**WITH_KEY, "allowedCidrs": "203.0.113.0/24"}}), "access.allowedCidrs",
     "expected a list"),
    ("ssh-world-v4", stack(**{A: {**WITH_KEY, "allowedCidrs": ["203.0.113.0/24", "0.0.0.0/0"]}}),
     "access.allowedCidrs[1]", "allowWorld: true"),
    ("ssh-world-v6", stack(**{A: {**WITH_KEY, "allowedCidrs": ["::/0"]}}), "access.allowedCidrs[0]", "whole internet"),
    ("cidrs-without-key", stack(**{A: {"allowedCidrs": ["203.0.113.0/24"]}}), "access.sshPublicKey", "is required"),
    ("key-garbage", stack(**{A: {"sshPublicKey": "not-a-key"}}), "access.sshPublicKey", "TYPE BASE64"),
    ("key-not-base64", stack(**{A: {"sshPublicKey": "ssh-ed25519 !!!notbase64"}}), "access.sshPublicKey",
     "does not decode"),
    ("key-type-mismatch", stack(**{A: {"sshPublicKey": RSA_HEADER_ED_BLOB}}), "access.sshPublicKey",
     "not a ssh-rsa key"),
    ("key-truncated", stack(**{A: {"sshPublicKey": "ssh-ed25519 " + base64.b64encode(
        struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + b"short").decode()}}),
     "access.sshPublicKey", "does not parse"),
    # A stray character pasted into the key: a lenient decoder would skip it and accept a key sshd refuses.
    ("key-stray-character", stack(**{A: {"sshPublicKey": KEY[:40] + "*" + KEY[40:]}}), "access.sshPublicKey",
     "does not decode"),
    ("key-too-short", stack(**{A: {"sshPublicKey": "ssh-ed25519 AAA="}}), "access.sshPublicKey", "too short"),
    ("key-length-only", stack(**{A: {"sshPublicKey": "ssh-ed25519 " + base64.b64encode(
        struct.pack(">I", 11)).decode()}}), "access.sshPublicKey", "not a ssh-ed25519 key"),
    ("key-type-not-ascii", stack(**{A: {"sshPublicKey": "ssh-ed25519 " + base64.b64encode(
        struct.pack(">I", 11) + "ssh-ed2551é".encode("latin-1") + struct.pack(">I", 32) + bytes(range(32))).decode()}}),
     "access.sshPublicKey", "not a ssh-ed25519 key"),
    ("private-key", stack(**{A: {"sshPublicKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n"
                                                  "-----END OPENSSH PRIVATE KEY-----\n"}}),
     "access.sshPublicKey", "ssh-keygen -y -f KEY"),
    ("key-as-secret", stack(**{A: {"sshPublicKey": {"secure": "v1:Zm9v"}}}), "access.sshPublicKey",
     "pulumi config set --secret"),
    ("jupyter-without-ssh", stack(**{A: {"jupyter": True}}), "access.jupyter",
     "needs access.sshPublicKey and access.allowedCidrs set"),
    ("jupyter-without-cidrs", stack(**{A: {**WITH_KEY, "jupyter": True}}), "access.jupyter",
     "needs access.allowedCidrs set: Jupyter is reached only through `ops tunnel --jupyter`"),
    ("jupyter-not-bool", stack(**{A: {"jupyter": "please"}}), "access.jupyter", "expected true or false"),
    ("allow-world-not-bool", stack(**{A: {"allowWorld": "if needed"}}), "access.allowWorld", "expected true or false"),
    ("access-unknown-key", stack(**{A: {"allowedCidr": ["203.0.113.0/24"]}}), "access.allowedCidr",
     "did you mean 'allowedCidrs'"),
    ("aws-secret-in-args", stack(**{R: {"extraArgs": ["--aws_secret_access_key=abc"]}}), "run.extraArgs[0]",
     "AWS secret access key"),
    ("gcp-bad-region", gcp(trainstack_region="us-east-1"), "region", "not a GCP region"),
    ("sa-json-in-config", stack(**{R: {"extraArgs": ['--creds={"type": "service_account", "private_key": "x"}']}}),
     "run.extraArgs[0]", "GCP service account key"),
    # GCP stacks
    ("gcp-no-project", gcp(trainstack_project=DEL), "project", "expected the GCP project id"),
    ("gcp-aws-type", gcp(**{C: {"instanceTypes": ["g5.xlarge"]}}), "compute.instanceTypes[0]",
     "is an AWS instance type; this stack's cloud is gcp"),
    ("gcp-aws-shape", gcp(**{C: {"instanceTypes": ["t3.large"]}}), "compute.instanceTypes[0]", "is an AWS instance type"),
    ("gcp-type-typo", gcp(**{C: {"instanceTypes": ["g2-standard-9"]}}), "compute.instanceTypes[0]", "did you mean"),
    ("gcp-subnets", gcp(**{C: {"subnets": ["subnet-0123456789abcdef0"]}}), "compute.subnets[0]", "choose zones"),
    ("gcp-max-price", gcp(**{C: {"maxPricePerHour": 0.5}}), "compute.maxPricePerHour", "no maximum price"),
    ("gcp-accelerator-on-g2", gcp(**{C: {"instanceTypes": ["g2-standard-8"], "accelerator": "nvidia-tesla-t4"}}),
     "compute.accelerator", "only GCP N1 machine types take an accelerator"),
    ("gcp-image-malformed", gcp(**{C: {"imageId": "projects/p/images/Ubuntu_22.04"}}), "compute.imageId",
     "expected a GCE image"),
    ("gcp-n1-no-accelerator", gcp(**{C: {"instanceTypes": ["n1-standard-8"]}}), "compute.accelerator", "is required"),
    ("gcp-n1-gpu-count", gcp(**{C: {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4",
                                    "gpusPerNode": 3}}), "compute.gpusPerNode", "1 or 2 or 4 or 8"),
    ("gcp-bucket-google", gcp(**{S: {"bucketName": "my-google-data"}}), "storage.bucketName", "google"),
    ("gcp-zone-mismatch", gcp(**{C: {"zones": ["europe-west4-a"]}}), "compute.zones[0]", "not a zone of region"),
    ("gcp-data-on-s3", gcp(**{R: {"synthetic": DEL, "dataUri": "s3://my-data/x/"}}), "run.dataUri", "expected gs://"),
    # types the default image's driver, or TensorFlow itself, cannot use (the reason is in the line)
    ("p3-on-open-driver-ami", stack(**{C: {"instanceTypes": ["g5.xlarge", "p3.2xlarge"]}}), "compute.instanceTypes[1]",
     "open kernel modules, which support Turing and newer GPUs, not the V100"),
    ("p3dn-on-open-driver-ami", stack(**{C: {"instanceTypes": ["p3dn.24xlarge"], "gpusPerNode": 8}}),
     "compute.instanceTypes[0]", "not the V100 of P3dn"),
    ("p2-k80", stack(**{C: {"instanceTypes": ["p2.xlarge"]}}), "compute.instanceTypes[0]", "the K80 of P2 is 3.7"),
    ("p2-k80-even-with-own-ami", stack(**{C: {"instanceTypes": ["p2.8xlarge"], "gpusPerNode": 8,
                                              "imageId": "ami-0123456789abcdef0"}}), "compute.instanceTypes[0]",
     "compute capability 6.0 or newer"),
    ("g3-m60", stack(**{C: {"instanceTypes": ["g3.4xlarge"]}}), "compute.instanceTypes[0]", "the M60 of G3 is 5.2"),
    ("g3s-m60", stack(**{C: {"instanceTypes": ["g3s.xlarge"]}}), "compute.instanceTypes[0]", "the M60 of G3 is 5.2"),
    ("gcp-a3-on-driver-550", gcp(**{C: {"instanceTypes": ["a3-highgpu-8g"], "gpusPerNode": 8}}),
     "compute.instanceTypes[0]", "driver 555 or newer"),
    ("gcp-a3-mega-on-driver-550", gcp(**{C: {"instanceTypes": ["a2-highgpu-8g", "a3-megagpu-8g"], "gpusPerNode": 8}}),
     "compute.instanceTypes[1]", "H100"),
    ("gcp-n1-k80", gcp(**{C: {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-k80"}}),
     "compute.accelerator", "the K80 is 3.7"),
    # run.extraArgs: parsed by the trainer's own parser, as the machine parses them
    ("extra-args-unknown-flag", stack(**{R: {"extraArgs": ["--no-such-flag"]}}), "run.extraArgs[0]",
     "'--no-such-flag' is not a flag of the trainer"),
    ("extra-args-typo", stack(**{R: {"extraArgs": ["--xla", "--grad-acum=2"]}}), "run.extraArgs[1]",
     "did you mean '--grad-accum'?"),
    ("extra-args-bad-value", stack(**{R: {"extraArgs": ["--precision=fp8"]}}), "run.extraArgs[0]",
     "invalid choice: 'fp8'"),
    ("extra-args-value-on-switch", stack(**{R: {"extraArgs": ["--xla=1"]}}), "run.extraArgs[0]",
     "the trainer refuses it"),
    ("extra-args-stray-word", stack(**{R: {"extraArgs": ["xla"]}}), "run.extraArgs[0]", "write flags as --name=value"),
    # The refused entry is named by its own index, found by the flag's whole name.
    ("extra-args-bad-value-later", stack(**{R: {"extraArgs": ["--xla", "--grad-accum=2", "--precision=fp8"]}}),
     "run.extraArgs[2]", "the trainer refuses it"),
    ("extra-args-value-with-equals", stack(**{R: {"extraArgs": ["--xla", "--precision=fp8=x"]}}), "run.extraArgs[1]",
     "invalid choice: 'fp8=x'"),
    ("extra-args-abbreviated", stack(**{R: {"extraArgs": ["--prec=fp8"]}}), "run.extraArgs[0]", "argument --precision"),
    ("extra-args-abbreviated-later", stack(**{R: {"extraArgs": ["--xla", "--prec=fp8"]}}), "run.extraArgs[1]",
     "argument --precision"),
    ("extra-args-whole-name-first", stack(**{R: {"extraArgs": ["--steps-per=2", "--steps-per-call=x"]}}),
     "run.extraArgs[1]", "argument --steps-per-call"),
    ("extra-args-ambiguous-later", stack(**{R: {"extraArgs": ["--xla", "--step=5"]}}), "run.extraArgs[1]",
     "ambiguous option"),
    ("extra-args-typo-with-equals", stack(**{R: {"extraArgs": ["--xla", "--grad-acum=2=3"]}}), "run.extraArgs[1]",
     "'--grad-acum' is not a flag of the trainer"),
    # several machines train in lockstep: one GPU model per cluster
    ("cluster-mixes-gpu-models", stack(**{C: {"instanceTypes": ["g5.12xlarge", "g6.12xlarge"], "gpusPerNode": 4,
                                              "nodes": 2}}), "compute.instanceTypes[1]",
     "'g6.12xlarge' has L4 GPUs but 'g5.12xlarge' has A10G: the 2 machines (compute.nodes) train in lockstep"),
    ("gcp-cluster-mixes-gpu-models", gcp(**{C: {"instanceTypes": ["a2-highgpu-2g", "g2-standard-24"], "gpusPerNode": 2,
                                                "nodes": 3}}), "compute.instanceTypes[1]",
     "'g2-standard-24' has L4 GPUs but 'a2-highgpu-2g' has A100 40GB"),
    ("data-grant-not-bool", gcp(**{R: {"synthetic": DEL, "dataUri": "gs://my-data/x/", "dataGrant": "maybe"}}),
     "run.dataGrant", "expected true or false"),
    ("aws-data-grant", stack(**{R: {"synthetic": DEL, "dataUri": "s3://my-data/x/", "dataGrant": False}}), "run.dataGrant",
     "only GCP stacks grant on the data bucket itself"),
    ("gcp-n1-unknown-accelerator", gcp(**{C: {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-a100"}}),
     "compute.accelerator", "expected one of nvidia-tesla-t4"),
    ("scheduler-unknown", stack(trainstack_scheduler="slurm"), "scheduler", "expected groups, sagemaker, vertex or kubernetes"),
    ("scheduler-sagemaker-on-gcp", gcp(trainstack_scheduler="sagemaker", **{IMG: {"build": True}}), "scheduler",
     "'sagemaker' runs on AWS and this stack's cloud is gcp"),
    ("scheduler-sagemaker-public-image", stack(trainstack_scheduler="sagemaker"), "image.build",
     "scheduler sagemaker runs the stack's own image"),
]

# placements: the home (the dev stack's own cloud, region and types) and other places of the same run
PL = "trainstack_placements"
HOME = {"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"]}
WEST = {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g5.xlarge", "g6.xlarge"]}
GCP_HOME = {"cloud": "gcp", "region": "us-central1", "project": "my-project-123", "instanceTypes": ["g2-standard-8"]}
INVALID += [
    ("placements-not-list", stack(**{PL: "us-west-2"}), "placements", "expected a list of blocks"),
    ("placements-empty", stack(**{PL: []}), "placements", "remove the key for the default"),
    ("placement-entry-not-block", stack(**{PL: [HOME, "us-west-2"]}), "placements[1]", "expected a block of keys"),
    ("placement-unknown-key", stack(**{PL: [HOME, {**WEST, "instanceType": ["g5.xlarge"]}]}),
     "placements[1].instanceType", "did you mean 'instanceTypes'"),
    ("placement-cloud-azure", stack(**{PL: [HOME, {**WEST, "cloud": "azure"}]}), "placements[1].cloud",
     "expected aws or gcp"),
    ("placement-home-elsewhere", stack(**{PL: [WEST, HOME]}), "placements[0].region",
     "the first placement is home and must be the stack's trainstack:region 'us-east-1'"),
    ("placement-home-other-types", stack(**{PL: [{**HOME, "instanceTypes": ["g6.xlarge"]}, WEST]}),
     "placements[0].instanceTypes", "differs from compute.instanceTypes"),
    ("placement-region-malformed", stack(**{PL: [HOME, {**WEST, "region": "us-west"}]}), "placements[1].region",
     "not an AWS region name"),
    ("placement-types-missing", stack(**{PL: [HOME, {"cloud": "aws", "region": "us-west-2"}]}),
     "placements[1].instanceTypes", "is required"),
    ("placement-types-duplicate", stack(**{PL: [HOME, {**WEST, "instanceTypes": ["g5.xlarge", "g5.xlarge"]}]}),
     "placements[1].instanceTypes", "each type once"),
    ("placement-type-typo", stack(**{PL: [HOME, {**WEST, "instanceTypes": ["g6.xlarg"]}]}),
     "placements[1].instanceTypes[0]", "did you mean 'g6.xlarge'"),
    ("placement-zone-of-home", stack(**{PL: [HOME, {**WEST, "zones": ["us-west-2a", "us-east-1a"]}]}),
     "placements[1].zones[1]", "not a zone of region us-west-2"),
    ("placement-other-replicas", stack(**{PL: [HOME, {**WEST, "instanceTypes": ["g5.xlarge", "g5.12xlarge"]}]}),
     "placements[1].instanceTypes[1]", "not the run's 1 (compute.gpusPerNode 1 x compute.nodes 1)"),
    ("placement-duplicate", stack(**{PL: [HOME, WEST, {**WEST, "instanceTypes": ["g6.xlarge"]}]}), "placements[2]",
     "is placements[1] again"),
    ("placement-aws-with-project", stack(**{PL: [HOME, {**WEST, "project": "my-project-123"}]}),
     "placements[1].project", "remove it from an aws placement"),
    ("placement-gcp-without-project", gcp(**{PL: [GCP_HOME, {k: v for k, v in GCP_HOME.items() if k != "project"}
                                                       | {"region": "europe-west4"}]}),
     "placements[1].project", "is required for a gcp placement"),
    ("placement-gcp-bad-project", gcp(**{PL: [GCP_HOME, {**GCP_HOME, "region": "europe-west4", "project": "P"}]}),
     "placements[1].project", "expected the GCP project id"),
    # A GCP home's AWS placement: no maximum price (GCE has none, and one key cannot bind some placements only),
    # no image of home's cloud, the same replicas.
    ("gcp-home-aws-placement-max-price", gcp(**{PL: [GCP_HOME, {**WEST, "region": "us-east-1"}]},
                                             **{C: {"maxPricePerHour": 0.5}}), "compute.maxPricePerHour",
     "placements[1] (us-east-1) on AWS then pays EC2's current spot price, capped at the on-demand price"),
    ("gcp-home-aws-placement-image", gcp(**{PL: [GCP_HOME, {**WEST, "region": "us-east-1"}]},
                                         **{C: {"imageId": "projects/my-project-123/global/images/tf-driver-570"}}),
     "compute.imageId", "an image of home's cloud (gcp), and placements[1] is on aws"),
    ("gcp-home-aws-placement-other-replicas", gcp(**{PL: [GCP_HOME, {**WEST, "region": "us-east-1",
                                                                     "instanceTypes": ["g5.xlarge", "g5.12xlarge"]}]}),
     "placements[1].instanceTypes[1]", "'g5.12xlarge' has 4 GPU(s)"),
    ("gcp-home-aws-placement-built-image", gcp(**{PL: [GCP_HOME, {**WEST, "region": "us-east-1"}]},
                                               **{IMG: {"build": True}}), "image.build",
     "placements[1] (us-east-1) is on aws"),
    ("placement-ami-other-cloud", stack(**{PL: [HOME, {**GCP_HOME, "region": "us-east4", "project": "my-gpus-42"}]},
                                        **{C: {"imageId": "ami-0123456789abcdef0"}}),
     "compute.imageId", "an image of home's cloud (aws), and placements[1] is on gcp"),
    ("placement-other-cloud-n1-without-accelerator",
     stack(**{PL: [HOME, {**GCP_HOME, "region": "us-east4", "project": "my-gpus-42", "instanceTypes": ["n1-standard-8"]}]}),
     "compute.accelerator", "is required for n1-standard-8 (e.g. nvidia-tesla-t4) (in placements[1], us-east4)"),
    ("placement-other-cloud-zone", stack(**{PL: [HOME, {**GCP_HOME, "region": "us-east4", "project": "my-gpus-42",
                                                         "zones": ["us-east-1a"]}]}),
     "placements[1].zones[0]", "not a zone of region us-east4"),
    # A built image goes to a repository of home's cloud and project in each placement's region: no further.
    ("placement-built-image-other-cloud", stack(**{PL: [HOME, {**GCP_HOME, "region": "us-east4"}]},
                                                **{IMG: {"build": True}}), "image.build",
     "placements[1] (us-east4) is on gcp"),
    ("placement-built-image-other-project", gcp(**{PL: [GCP_HOME, {**GCP_HOME, "region": "us-east4",
                                                                   "project": "my-other-1"}]},
                                                **{IMG: {"build": True}}), "image.build",
     "placements[1] (us-east4) is in project my-other-1"),
    ("placement-ami-of-one-region", stack(**{PL: [HOME, WEST]}, **{C: {"imageId": "ami-0123456789abcdef0"}}),
     "compute.imageId", "an AMI belongs to one region"),
    ("placement-n1-without-accelerator", gcp(**{PL: [GCP_HOME, {**GCP_HOME, "region": "europe-west4",
                                                               "instanceTypes": ["n1-standard-8"]}]}),
     "compute.accelerator", "is required for n1-standard-8 (e.g. nvidia-tesla-t4) (in placements[1], europe-west4)"),
    ("placements-too-many", stack(**{PL: [HOME] + [{**WEST, "region": f"us-west-{i}"} for i in range(1, 9)]}),
     "placements", "at most 8 entries"),
    ("wait-minutes-zero", stack(trainstack_placement={"waitMinutes": 0}), "placement.waitMinutes", "1 or more"),
    ("wait-minutes-fraction", stack(trainstack_placement={"waitMinutes": 7.5}), "placement.waitMinutes",
     "expected a whole number"),
    ("wait-minutes-bool", stack(trainstack_placement={"waitMinutes": True}), "placement.waitMinutes",
     "not true/false"),
    ("placement-not-block", stack(trainstack_placement=[15]), "placement", "expected a block of keys"),
    ("reserve-concurrency-on-gcp", gcp(trainstack_placement={"reserveConcurrency": True}),
     "placement.reserveConcurrency", "true: reserves concurrency for an AWS home's Lambda function only; a GCP "
     "home's function runs one instance at most already: remove it"),
    ("reserve-concurrency-not-bool", stack(trainstack_placement={"reserveConcurrency": "maybe"}),
     "placement.reserveConcurrency", "expected true or false"),
    ("placement-choose-unknown", stack(trainstack_placement={"choose": "cheap"}), "placement.choose",
     "'cheap': expected cheapest or inOrder"),
    ("placement-rebalance-not-bool", stack(trainstack_placement={"rebalance": "sometimes"}), "placement.rebalance",
     "expected true or false"),
    ("placement-move-floor-negative", stack(trainstack_placement={"moveFloorUsd": -1}), "placement.moveFloorUsd",
     "-1: expected 0 or more"),
    ("placement-move-fraction-above-one", stack(trainstack_placement={"moveFraction": 1.5}), "placement.moveFraction",
     "1.5: expected 1 or less"),
    ("placement-move-fraction-bool", stack(trainstack_placement={"moveFraction": True}), "placement.moveFraction",
     "not true/false"),
]

VALID: list[tuple[str, dict[str, Any]]] = [
    ("dev", stack()),
    ("world-explicitly-allowed", stack(**{A: {**WITH_KEY, "allowedCidrs": ["0.0.0.0/0"], "allowWorld": True}})),
    ("jupyter-over-ssh", stack(**{A: {**WITH_KEY, "allowedCidrs": ["203.0.113.7/32"], "jupyter": True}})),
    ("ipv6-and-v4-cidrs", stack(**{A: {**WITH_KEY, "allowedCidrs": ["203.0.113.0/24", "2001:db8::/48"]}})),
    ("pinned-by-digest", stack(**{IMG: {"digest": "sha256:" + "0123456789abcdef" * 4}})),
    ("on-demand", stack(**{C: {"spot": False}})),
    ("seconds-only-checkpoints", stack(**{R: {"checkpointEverySteps": None}})),
    ("short-cap", stack(**{C: {"maxRuntimeHours": 0.5}}, **{R: {"checkpointEverySeconds": 600}})),
    ("bucket-with-dots", stack(**{S: {"bucketName": "my.training.bucket", "keepOnDestroy": False}})),
    ("zones-and-subnets", stack(**{C: {"zones": ["us-east-1a", "us-east-1b"], "subnets": ["subnet-0123456789abcdef0"]}})),
    ("module-function-model", stack(**{R: {"model": "shapes.model:build", "code": "examples/image-cnn", "id": "exp-7"}})),
    ("four-gpu-types", stack(**{C: {"instanceTypes": ["g5.12xlarge", "g5.24xlarge"], "gpusPerNode": 4, "nodes": 2}})),
    # One machine may fall back to another GPU model; only a cluster must not mix them.
    ("one-machine-any-gpu-model", stack(**{C: {"instanceTypes": ["g5.12xlarge", "g6.12xlarge"], "gpusPerNode": 4}})),
    ("gcp-cluster-of-one-model", gcp(**{C: {"instanceTypes": ["g2-standard-8", "g2-standard-12"], "nodes": 2}})),
    ("secure-other-namespace", stack(aws__secretKey={"secure": "v1:Zm9v"})),
    ("gcp", gcp()),
    ("gcp-n1", gcp(**{C: {"instanceTypes": ["n1-standard-16"], "accelerator": "nvidia-tesla-t4", "gpusPerNode": 4}})),
    # Several machines of N1 types: the accelerator is their GPU model.
    ("checkpoint-every-whole-run", stack(**{R: {"checkpointEverySeconds": 3600}, C: {"maxRuntimeHours": 1}})),
    ("gcp-n1-cluster", gcp(**{C: {"nodes": 2, "instanceTypes": ["n1-standard-8", "n1-standard-16"],
                                  "accelerator": "nvidia-tesla-t4", "gpusPerNode": 1}})),
    # an image of the user's own choosing brings its own driver: V100 and H100 are theirs to run
    ("p3-with-own-ami", stack(**{C: {"instanceTypes": ["p3.2xlarge"], "imageId": "ami-0123456789abcdef0"}})),
    ("gcp-a3-with-own-image", gcp(**{C: {"instanceTypes": ["a3-highgpu-8g"], "gpusPerNode": 8,
                                         "imageId": "projects/my-project-123/global/images/tf-driver-570"}})),
    ("p5-and-a100", stack(**{C: {"instanceTypes": ["p5.48xlarge", "p4d.24xlarge"], "gpusPerNode": 8}})),
    ("gcp-a2-and-v100", gcp(**{C: {"instanceTypes": ["a2-highgpu-1g"]}})),
    ("evaluated-mlp-keeps-its-best", stack(**{R: {"evalEverySteps": 500, "keepBest": "val_accuracy"}})),
    ("validation-records", stack(**{R: {"synthetic": DEL, "dataUri": "s3://my-data/train/",
                                        "validationDataUri": "s3://my-data/validation/", "keepBest": "val_loss:min"}})),
    ("extra-args-flag-and-value", stack(**{R: {"extraArgs": ["--grad-accum", "4", "--lm-tied", "--log-every=50"]}})),
    ("two-aws-regions", stack(**{PL: [HOME, WEST]}, trainstack_placement={"waitMinutes": 30})),
    ("two-aws-regions-built-image", stack(**{PL: [HOME, WEST]}, **{IMG: {"build": True}})),
    ("two-gcp-regions-built-image", gcp(**{PL: [GCP_HOME, {**GCP_HOME, "region": "europe-west4"}]},
                                        **{IMG: {"build": True}})),
    ("home-types-from-placements", stack(**{C: {"instanceTypes": DEL}}, **{PL: [HOME, WEST]})),
    # An AWS home and a GCP placement of another project: its machines reach the S3 bucket and data by federation.
    ("aws-home-gcp-placement", stack(**{PL: [HOME, {**GCP_HOME, "region": "us-east4", "project": "my-gpus-42"}]},
                                     **{R: {"synthetic": DEL, "dataUri": "s3://my-data/train/"}},
                                     **{S: {"bucketName": "my.training.bucket", "keepOnDestroy": False}})),
    # A GCP home and an AWS placement: its machines reach the GCS bucket and data by federation. Home's N1
    # accelerator and run.dataGrant are home's (an AWS type has its GPUs; home grants the data bucket).
    ("gcp-home-aws-placement", gcp(**{PL: [GCP_HOME, {**WEST, "region": "us-east-1"}]})),
    ("gcp-n1-home-aws-placement-own-data", gcp(**{
        PL: [{**GCP_HOME, "instanceTypes": ["n1-standard-8"]}, {**WEST, "region": "us-east-1", "zones": ["us-east-1a"]}],
        C: {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4"},
        R: {"synthetic": DEL, "dataUri": "gs://my-data/train/", "dataGrant": False}})),
    # A GCP home and a placement in another project (GPU quota there): its machines' account is that project's.
    ("gcp-placement-other-project", gcp(**{PL: [GCP_HOME, {**GCP_HOME, "region": "us-east4", "project": "my-other-1"}]})),
    ("three-gcp-regions", gcp(**{PL: [GCP_HOME, {**GCP_HOME, "region": "europe-west4", "zones": ["europe-west4-a"]},
                                      {**GCP_HOME, "region": "us-east4"}]})),
]


# scheduler kubernetes: the run as a Job on the user's cluster (components/settings/kubernetes.py).
KUBE, KI = "trainstack_kubernetes", "trainstack_image"
EKS_BLOCK = {"context": "gpu-cluster", "spotNodes": "eks",
             "oidcIssuer": "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE"}
OWN_IMAGE = {"repository": "111122223333.dkr.ecr.us-east-1.amazonaws.com/trainer", "digest": "sha256:" + "ab" * 32}


def eks(**changes: Any) -> dict[str, Any]:
    """The dev stack as a Job on an EKS cluster, with changes (same rules as `stack`)."""
    return _apply(stack(trainstack_scheduler="kubernetes", **{KUBE: dict(EKS_BLOCK), KI: dict(OWN_IMAGE)}), changes)


INVALID += [
    ("kubernetes-without-scheduler", stack(**{KUBE: dict(EKS_BLOCK)}), "kubernetes", "scheduler is not kubernetes"),
    ("kubernetes-block-missing", eks(**{KUBE: DEL}), "kubernetes", "is required with scheduler kubernetes"),
    ("kubernetes-no-way-in", eks(**{KUBE: {"context": DEL}}), "kubernetes.context",
     "never takes the kubeconfig's current context"),
    ("kubernetes-two-ways-in", eks(**{KUBE: {"kubeconfigSecret": True}}), "kubernetes.context",
     "is set together with kubeconfigSecret: true"),
    ("kubernetes-kubeconfig-secret-not-bool", eks(**{KUBE: {"context": DEL, "kubeconfigSecret": "yes please"}}),
     "kubernetes.kubeconfigSecret", "expected true or false"),
    ("kubernetes-namespace-system", eks(**{KUBE: {"namespace": "kube-system"}}), "kubernetes.namespace",
     "is the cluster's own"),
    ("kubernetes-namespace-not-dns", eks(**{KUBE: {"namespace": "My_Run"}}), "kubernetes.namespace", "DNS label"),
    ("kubernetes-spot-nodes-azure", eks(**{KUBE: {"spotNodes": "aks"}}), "kubernetes.spotNodes", "gke"),
    ("kubernetes-gke-nodes-on-aws", eks(**{KUBE: {"spotNodes": "gke"}}), "kubernetes.spotNodes",
     "this stack's cloud is aws"),
    ("kubernetes-oidc-issuer-missing", eks(**{KUBE: {"oidcIssuer": DEL}}), "kubernetes.oidcIssuer",
     "is required on EKS"),
    ("kubernetes-oidc-issuer-url", eks(**{KUBE: {"oidcIssuer": "https://oidc.eks.us-east-1.amazonaws.com/id/AB"}}),
     "kubernetes.oidcIssuer", "without https://"),
    ("kubernetes-cpu-not-quantity", eks(**{KUBE: {"cpu": "four"}}), "kubernetes.cpu", "Kubernetes quantity"),
    ("kubernetes-memory-not-quantity", eks(**{KUBE: {"memory": "16GB"}}), "kubernetes.memory", "Kubernetes quantity"),
    ("kubernetes-grace-zero", eks(**{KUBE: {"terminationGraceSeconds": 0}}), "kubernetes.terminationGraceSeconds",
     "expected 1 or more"),
    ("kubernetes-backoff-negative", eks(**{KUBE: {"backoffLimit": -1}}), "kubernetes.backoffLimit",
     "expected 0 or more"),
    ("kubernetes-ttl-negative", eks(**{KUBE: {"ttlSecondsAfterFinished": -5}}), "kubernetes.ttlSecondsAfterFinished",
     "expected 0 or more"),
    ("kubernetes-image-by-tag", eks(**{KI: {"digest": DEL}}), "image.digest", "pinned by digest"),
    ("kubernetes-image-without-trainer", eks(**{KI: {"repository": "tensorflow/tensorflow"}}), "image.repository",
     "has no trainer in it"),
    ("kubernetes-image-build", eks(**{KI: {"build": True}}), "image.build", "does not build the image yet"),
    ("kubernetes-ssh", eks(**{A: {"sshPublicKey": KEY}}), "access.sshPublicKey", "nobody logs in to a pod"),
    ("kubernetes-kubeconfig-plain", eks(kubernetes__kubeconfig="apiVersion: v1"), "kubernetes:kubeconfig",
     "name a context instead"),
    # trainstack:serve: tensorflow/serving on the run's cluster (components/settings/serve.py).
    ("serve-without-cluster", stack(trainstack_serve={"enabled": True}), "serve.enabled",
     "serving runs on the run's cluster"),
    ("serve-replicas-zero", eks(trainstack_serve={"enabled": True, "replicas": 0}), "serve.replicas",
     "expected 1 or more"),
    ("serve-resources-cpu", eks(trainstack_serve={"resources": {"cpu": "lots"}}), "serve.resources.cpu",
     "'lots'"),
    ("serve-resources-not-a-block", eks(trainstack_serve={"resources": "big"}), "serve.resources", "'big'"),
]


def _write(tmp_path: Path, name: str, doc: dict[str, Any] | str) -> Path:
    p = tmp_path / f"Pulumi.{name}.yaml"
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return p


def test_enough_cases_covering_every_key():
    assert len(INVALID) >= 40
    assert len({c[0] for c in INVALID}) == len(INVALID)
    named = {c[2] for c in INVALID}
    for block in st.BLOCKS:
        model = st.Settings.model_fields[block].annotation
        # An optional block (kubernetes): its model.
        model = next(a for a in getattr(model, "__args__", (model,)) if a is not type(None))
        for key in st.known_keys(model):
            assert any(n == f"{block}.{key}" or n.startswith(f"{block}.{key}[") for n in named), f"{block}.{key} untested"
    for block in st.LISTS:
        model = st.Settings.model_fields[block].annotation.__args__[0]
        for key in st.known_keys(model):
            assert any(re.match(rf"{block}\[\d+\]\.{key}\b", n) for n in named), f"{block}[].{key} untested"
    for key in st.SCALARS:
        assert key in named


@pytest.mark.parametrize(("case", "doc", "key", "fragment"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_stack_file_is_refused_with_one_line(tmp_path, case, doc, key, fragment):
    path = _write(tmp_path, "bad", doc)
    with pytest.raises(ConfigError) as info:
        load_stack_file(path)
    err = info.value
    msg = str(err)
    assert err.key == key, msg
    prefix = f"{key}: " if ":" in key else f"trainstack:{key}: "
    assert msg.startswith(prefix), msg
    assert fragment in msg, msg
    assert "\n" not in msg and len(msg) < 400, msg
    assert "Input should" not in msg and "Value error" not in msg, msg


@pytest.mark.parametrize(("case", "doc", "key", "fragment"), INVALID, ids=[c[0] for c in INVALID])
def test_ops_synth_exits_2_and_writes_nothing(tmp_path, capsys, monkeypatch, case, doc, key, fragment):
    from ops import mockrun
    from ops.__main__ import main

    ran = []
    monkeypatch.setattr(mockrun, "_run", lambda *a, **k: ran.append(a))
    _write(tmp_path, "bad", doc)
    out = tmp_path / "out"
    code = main(["synth", "--stack", "bad", "--out", str(out), "--stacks-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.splitlines()
    assert len(lines) == 1 and fragment in lines[0], captured.err
    assert lines[0].startswith(f"{key}: " if ":" in key else f"trainstack:{key}: ")
    assert captured.out == ""
    assert not out.exists()
    assert ran == []


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ssh-world-v4", "tag-latest", "gpus-machine-lacks"])
def test_ops_synth_process_exits_2(tmp_path, case):
    _, doc, key, fragment = next(c for c in INVALID if c[0] == case)
    _write(tmp_path, "bad", doc)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "ops", "synth", "--stack", "bad", "--out", str(out),
                           "--stacks-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"trainstack:{key}: ") and fragment in proc.stderr
    assert proc.stdout == ""
    assert not out.exists()


@pytest.mark.parametrize(("case", "doc"), VALID, ids=[c[0] for c in VALID])
def test_valid_stack_files_load(tmp_path, case, doc):
    s = load_stack_file(_write(tmp_path, "ok", doc))
    assert s.stack == "ok"
    assert s.region == doc["config"]["trainstack:region"]
    assert s.run_id == (doc["config"]["trainstack:run"].get("id") or "ok")


@pytest.mark.parametrize("path", sorted((ROOT / "stacks").glob("Pulumi.*.yaml")), ids=lambda p: p.name)
def test_project_stacks_load(path):
    s = load_stack_file(path)
    assert s.image.reference.endswith(":2.21.0-gpu") or "@sha256:" in s.image.reference
    assert s.storage.keep_on_destroy is True
    assert s.access.allowed_cidrs == []


def test_defaults_are_careful():
    s = load_settings({"region": "us-east-1", "run": {"synthetic": True}}, stack="t")
    assert s.cloud == "aws" and s.compute.spot and s.storage.keep_on_destroy
    assert s.access.allowed_cidrs == [] and s.access.ssh_public_key is None and not s.access.allow_world
    assert s.image.tag != "latest" and s.run_id == "t"
    assert s.compute.max_runtime_hours * 3600 >= s.run.checkpoint_every_seconds


def test_settings_and_policy_context_agree():
    """The policy pack reads the raw config; it must reach the same context as the validated settings."""
    from policy import rules

    for _, doc in VALID:
        raw = {k.partition(":")[2]: v for k, v in doc["config"].items() if k.startswith("trainstack:")}
        s = load_settings(raw, stack="ok")
        assert rules.context_from_config(raw, "ok") == rules.context_from_settings(s)


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_real_ssh_keys_accepted_and_their_private_halves_refused(tmp_path, kind):
    """Keys made by ssh-keygen load; pasting the private key file instead is refused, naming the fix."""
    key_file = tmp_path / "id"
    extra = ["-b", "2048"] if kind == "rsa" else []
    subprocess.run(["ssh-keygen", "-q", "-t", kind, *extra, "-N", "", "-C", "me@laptop", "-f", str(key_file)],
                   check=True, capture_output=True, timeout=60)
    public = key_file.with_suffix(".pub").read_text().strip()
    ok = load_stack_file(_write(tmp_path, "ok", stack(**{A: {"sshPublicKey": public, "allowedCidrs": ["203.0.113.0/24"]}})))
    assert ok.access.ssh_public_key == public
    with pytest.raises(ConfigError) as info:
        load_stack_file(_write(tmp_path, "bad", stack(**{A: {"sshPublicKey": key_file.read_text()}})))
    assert info.value.key == "access.sshPublicKey" and "ssh-keygen -y" in str(info.value)
    assert "\n" not in str(info.value) and "PRIVATE KEY-----" not in str(info.value)


def _from_sdk(config: dict[str, Any], secret_keys: list[str]) -> st.Settings:
    """from_pulumi_config() with the SDK's config set as the engine sets it, in a throwaway context."""
    import contextvars
    import json

    import pulumi
    from pulumi.runtime.config import set_all_config

    def run() -> st.Settings:
        pulumi.runtime.settings.reset_options(project="trainstack", stack="sdk", preview=True)
        set_all_config({k: json.dumps(v) if isinstance(v, dict | list) else str(v) for k, v in config.items()},
                       secret_keys)
        return st.from_pulumi_config()

    return contextvars.copy_context().run(run)


def test_program_config_is_validated_like_the_stack_file():
    """What `pulumi up` hands the program: the same checks, plus secrets the SDK marks as such."""
    cfg = dict(DEV["config"])
    s = _from_sdk(cfg, [])
    assert s.stack == "sdk" and s.compute.instance_types == ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"]
    with pytest.raises(ConfigError) as info:
        _from_sdk({**cfg, "trainstack:regoin": "us-east-1"}, [])
    assert info.value.key == "regoin" and "did you mean trainstack:region" in str(info.value)
    with pytest.raises(ConfigError) as info:
        _from_sdk(cfg, ["trainstack:access"] if "trainstack:access" in cfg else ["trainstack:run"])
    assert "pulumi config set --secret" in str(info.value)
    with pytest.raises(ConfigError) as info:
        _from_sdk({**cfg, "trainstack:compute": {**cfg["trainstack:compute"], "nodes": 0}}, [])
    assert str(info.value) == "trainstack:compute.nodes: 0: expected 1 or more"
    # The list of placements and the placement block reach the program as the stack file gives them.
    s = _from_sdk({**cfg, "trainstack:placements": [HOME, WEST], "trainstack:placement": {"waitMinutes": 9}}, [])
    assert [p.region for p in s.placement_list] == ["us-east-1", "us-west-2"] and s.placement.wait_minutes == 9
    # The cost keys: the defaults (cheapest, no rebalance, the controller's move threshold), or as given.
    assert (s.placement.choose, s.placement.rebalance, s.placement.move_floor_usd, s.placement.move_fraction) == (
        "cheapest", False, 1.0, 0.1)
    s = _from_sdk({**cfg, "trainstack:placements": [HOME, WEST], "trainstack:placement": {
        "choose": "inOrder", "rebalance": True, "moveFloorUsd": 5, "moveFraction": 0.25}}, [])
    assert (s.placement.choose, s.placement.rebalance, s.placement.move_floor_usd, s.placement.move_fraction) == (
        "inOrder", True, 5.0, 0.25)
    with pytest.raises(ConfigError) as info:
        _from_sdk({**cfg, "trainstack:placements": [HOME, {**WEST, "region": "us-west"}]}, [])
    assert info.value.key == "placements[1].region"


def test_trainer_flags_are_read_without_tensorflow():
    """The extraArgs check reads the trainer's own parser; loading a stack must not import TensorFlow."""
    code = ("import sys; from components.settings import load_stack_file, common; "
            "s = load_stack_file('stacks/Pulumi.large.yaml'); assert s.run.extra_args; "
            "assert '--grad-accum' in common.trainer_flags(); "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_every_known_machine_type_names_its_gpu_model(cloud):
    # The one-model rule for clusters compares these: a type without one could never join a cluster.
    from components import catalog

    types = catalog.AWS_GPU_INSTANCES if cloud == "aws" else catalog.GCP_GPU_MACHINES
    models = {t: catalog.gpu_model(cloud, t) for t in types}
    assert len(models) >= 19 and all(models.values()), [t for t, m in models.items() if not m]
    assert catalog.gpu_model("gcp", "n1-standard-8", "nvidia-tesla-t4") == "nvidia-tesla-t4"


@pytest.mark.parametrize("nodes, expected", [(1, ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"]), (3, ["g5.xlarge"])])
def test_default_types_are_one_gpu_model_for_several_machines(nodes, expected):
    # One machine takes whichever default model has capacity; a cluster trains in lockstep,
    # so without a list it gets the first model alone instead of a refusal.
    s = load_settings({"region": "us-east-1", "run": {"synthetic": True}, "compute": {"nodes": nodes}}, stack="t")
    assert s.compute.instance_types == expected and s.compute.nodes == nodes


LOWERCASE = "expected lowercase letters, digits, '.' and '-'"


@pytest.mark.parametrize(("cloud", "name", "problem"), [
    ("aws", "abc", None), ("gcp", "abc", None), ("aws", "a" * 63, None), ("gcp", "a" * 63, None),
    ("aws", "ab", "expected 3-63 characters"), ("gcp", "a" * 64, "expected 3-63 characters"),
    ("aws", "a" * 64, "expected 3-63 characters"),
    ("gcp", "my_bucket", None), ("aws", "my_bucket", LOWERCASE), ("gcp", "My-bucket", LOWERCASE + " or '_'"),
    ("aws", "My-bucket", LOWERCASE),
    ("aws", "bucket-", "expected to start and end with a letter or digit"),
    ("gcp", "_bucket", "expected to start and end with a letter or digit"),
    ("aws", "my..bucket", "expected no '..' and not an IP address"),
    ("gcp", "10.0.0.1", "expected no '..' and not an IP address"), ("aws", "10.0.0.1a", None),
    ("aws", "xn--bucket", "uses a prefix or suffix AWS reserves"),
    ("aws", "sthree-bucket", "uses a prefix or suffix AWS reserves"),
    ("aws", "bucket-s3alias", "uses a prefix or suffix AWS reserves"),
    ("aws", "bucket--ol-s3", "uses a prefix or suffix AWS reserves"), ("gcp", "xn--bucket", None),
    ("gcp", "goog-bucket", "GCS refuses names starting with 'goog' or containing 'google'"),
    ("gcp", "my-google-bucket", "GCS refuses names starting with 'goog' or containing 'google'"),
    ("aws", "goog-bucket", None), ("gcp", "my-goog-bucket", None),
])
def test_bucket_names_as_each_cloud_reads_them(cloud, name, problem):
    from components.settings.common import bucket_name_problem

    assert bucket_name_problem(cloud, name) == problem
