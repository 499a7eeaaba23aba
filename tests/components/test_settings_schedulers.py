"""`trainstack:scheduler`: each scheduler on its own cloud, and what a SageMaker job or a Vertex AI job cannot
take refused in one line naming the key (components/settings/schedulers.py)."""

from __future__ import annotations

import pytest

from components.settings import ConfigError, load_settings

AWS = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}}
GCP = {"cloud": "gcp", "region": "us-central1", "project": "my-project-123", "run": {"synthetic": True},
       "compute": {"instanceTypes": ["g2-standard-8"]}}
SAGEMAKER = {**AWS, "scheduler": "sagemaker", "image": {"build": True}}
VERTEX = {**GCP, "scheduler": "vertex", "image": {"build": True}}


def _refused(raw: dict) -> str:
    with pytest.raises(ConfigError) as e:
        load_settings(raw, stack="dev")
    line = str(e.value)
    assert "\n" not in line
    return line


def test_groups_is_the_default_on_both_clouds():
    assert load_settings(AWS, stack="dev").scheduler == "groups"
    assert load_settings(GCP, stack="dev").scheduler == "groups"


def test_a_sagemaker_stack_with_its_own_image_loads():
    s = load_settings(SAGEMAKER, stack="dev")
    assert (s.scheduler, s.image.build, s.compute.instance_types[0]) == ("sagemaker", True, "g5.xlarge")


@pytest.mark.parametrize(("raw", "line"), [
    ({**GCP, "scheduler": "sagemaker", "image": {"build": True}},
     "trainstack:scheduler: 'sagemaker' runs on AWS and this stack's cloud is gcp; use groups or vertex on gcp"),
    ({**AWS, "scheduler": "vertex"},
     "trainstack:scheduler: 'vertex' runs on GCP and this stack's cloud is aws; use groups or sagemaker on aws"),
    ({**AWS, "scheduler": "SageMaker"}, "trainstack:scheduler: 'SageMaker': expected groups, sagemaker, vertex or kubernetes"),
])
def test_a_scheduler_on_the_wrong_cloud_is_refused_naming_the_key(raw, line):
    assert _refused(raw) == line


def test_sagemaker_needs_the_stacks_own_image():
    assert _refused({**SAGEMAKER, "image": {}}) == (
        "trainstack:image.build: false: scheduler sagemaker runs the stack's own image (its entry takes `train`; "
        "SageMaker cannot mount the trainer's code into a public image); set image.build: true")


@pytest.mark.parametrize(("change", "key", "fragment"), [
    ({"compute": {"instanceTypes": ["g5.xlarge", "g6.xlarge"]}}, "compute.instanceTypes", "runs one instance type"),
    ({"compute": {"instanceTypes": ["ml.g5.xlarge"]}}, "compute.instanceTypes[0]", "write the EC2 name 'g5.xlarge'"),
    # An EC2 GPU type SageMaker does not train on.
    ({"compute": {"instanceTypes": ["g4dn.metal"]}}, "compute.instanceTypes[0]", "SageMaker has no training instance"),
    ({"compute": {"maxRuntimeHours": 700}}, "compute.maxRuntimeHours", "after 672 h (28 days)"),
    ({"compute": {"maxPricePerHour": 1.0}}, "compute.maxPricePerHour", "managed spot training has no maximum price"),
    ({"compute": {"zones": ["us-east-1a"]}}, "compute.zones", "places the job's machines itself"),
    ({"compute": {"subnets": ["subnet-0123456789abcdef0"]}}, "compute.subnets", "places the job's machines itself"),
    ({"compute": {"imageId": "ami-0123456789abcdef0"}}, "compute.imageId", "boots its own machine image"),
    ({"placement": {"reserveConcurrency": True}}, "placement.reserveConcurrency", "has no controller"),
    ({"placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]},
                     {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g5.xlarge"]}]},
     "placements", "runs in the stack's region alone"),
])
def test_what_a_sagemaker_job_cannot_take_is_refused(change, key, fragment):
    with pytest.raises(ConfigError) as e:
        load_settings({**SAGEMAKER, **change}, stack="dev")
    assert e.value.key == key, str(e.value)
    assert fragment in str(e.value)


def test_the_same_keys_load_on_a_groups_stack():
    # Each refusal above is the scheduler's: the groups take the same values.
    for change in ({"compute": {"instanceTypes": ["g5.xlarge", "g6.xlarge"]}},
                   {"compute": {"maxPricePerHour": 1.0}}, {"image": {}}):
        assert load_settings({**AWS, **change}, stack="dev").scheduler == "groups"


def test_nobody_logs_in_to_a_sagemaker_job():
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f me@laptop"
    with pytest.raises(ConfigError) as e:
        load_settings({**SAGEMAKER, "access": {"sshPublicKey": key}}, stack="dev")
    assert e.value.key == "access.sshPublicKey"


def test_a_vertex_stack_with_its_own_image_loads():
    s = load_settings(VERTEX, stack="dev")
    assert (s.scheduler, s.image.build, s.compute.instance_types[0]) == ("vertex", True, "g2-standard-8")
    n1 = load_settings({**VERTEX, "compute": {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-v100",
                                              "gpusPerNode": 8}}, stack="dev")
    assert n1.compute.gpus_per_node == 8  # Vertex AI attaches 8 V100s to an N1 machine


def test_vertex_needs_the_stacks_own_image():
    assert _refused({**VERTEX, "image": {}}) == (
        "trainstack:image.build: false: scheduler vertex runs the stack's own image (its entry takes `train`; "
        "Vertex AI cannot mount the trainer's code into a public image); set image.build: true")


@pytest.mark.parametrize(("change", "key", "fragment"), [
    ({"region": "us-north9"}, "region", "Vertex AI runs no custom training there"),
    ({"compute": {"instanceTypes": ["g2-standard-8", "g2-standard-4"]}}, "compute.instanceTypes",
     "runs one machine type"),
    # Deprecated in aiplatform v1's AcceleratorType enumeration (enumDeprecated).
    ({"compute": {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-k80", "gpusPerNode": 1}},
     "compute.accelerator", "Vertex AI trains on no NVIDIA_TESLA_K80"),
    ({"compute": {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4", "gpusPerNode": 8}},
     "compute.gpusPerNode", "attaches 1 or 2 or 4 NVIDIA_TESLA_T4"),
    ({"compute": {"instanceTypes": ["g2-standard-8"], "maxPricePerHour": 1.0}}, "compute.maxPricePerHour",
     "takes no maximum price"),
    ({"compute": {"instanceTypes": ["g2-standard-8"], "zones": ["us-central1-a"]}}, "compute.zones",
     "places the job's machines itself"),
    ({"compute": {"instanceTypes": ["g2-standard-8"], "imageId": "projects/p/global/images/x"}}, "compute.imageId",
     "boots its own machine image"),
    ({"access": {"sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f "
                            "me@laptop"}}, "access.sshPublicKey", "nobody logs in to a Vertex AI job's machines"),
    ({"placement": {"reserveConcurrency": True}}, "placement.reserveConcurrency", "has no controller"),
    ({"placements": [{"cloud": "gcp", "region": "us-central1", "project": "my-project-123",
                      "instanceTypes": ["g2-standard-8"]},
                     {"cloud": "gcp", "region": "us-east4", "project": "my-project-123",
                      "instanceTypes": ["g2-standard-8"]}]},
     "placements", "runs in the stack's region alone"),
])
def test_what_a_vertex_job_cannot_take_is_refused(change, key, fragment):
    with pytest.raises(ConfigError) as e:
        load_settings({**VERTEX, **change}, stack="dev")
    assert e.value.key == key, str(e.value)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_the_same_keys_load_on_a_gcp_groups_stack():
    # Each Vertex refusal is the scheduler's: the groups take the same values (K80 aside, which TF refuses).
    for change in ({"compute": {"instanceTypes": ["g2-standard-8", "g2-standard-4"]}},
                   {"compute": {"instanceTypes": ["g2-standard-8"], "zones": ["us-central1-a"]}},
                   {"compute": {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4", "gpusPerNode": 8}},
                   {"region": "us-north9", "compute": {"instanceTypes": ["g2-standard-8"]}}, {"image": {}}):
        assert load_settings({**GCP, **change}, stack="dev").scheduler == "groups"


def test_the_vertex_accelerator_types_are_the_documents_less_its_deprecated():
    from schedulers import vertex

    kinds = vertex.accelerator_types()
    assert "NVIDIA_L4" in kinds and "NVIDIA_H100_MEGA_80GB" in kinds
    assert not {"NVIDIA_TESLA_K80", "ACCELERATOR_TYPE_UNSPECIFIED", "TPU_V3"} & set(kinds)


def test_a_vertex_job_takes_the_h100s_the_groups_default_image_cannot_drive():
    # Vertex AI boots its own image and driver; on the groups the default image's driver 550 refuses an H100.
    a3 = {"compute": {"instanceTypes": ["a3-highgpu-8g"], "gpusPerNode": 8}}
    assert load_settings({**VERTEX, **a3}, stack="dev").compute.instance_types == ["a3-highgpu-8g"]
    assert "driver 550" in _refused({**GCP, **a3})
