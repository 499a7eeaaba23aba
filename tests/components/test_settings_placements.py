"""The placements' own checks (components/settings/placements.py), said as the user reads them:
the home placement against the stack's own keys (`merge_home`), and what `validate` refuses,
each as its whole line."""

from __future__ import annotations

import pytest

from components.settings import ConfigError, load_settings
from components.settings.placements import merge_home

HOME = {"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]}
WEST = {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g5.xlarge"]}
GCP = {"cloud": "gcp", "region": "us-central1", "project": "proj-a"}
GCP_HOME = {**GCP, "instanceTypes": ["g2-standard-8"]}


def _refused(raw) -> str:
    with pytest.raises(ConfigError) as e:
        merge_home(raw)
    return str(e.value)


def test_placements_that_are_no_list_are_refused_with_an_example():
    assert _refused({"region": "us-east-1", "placements": "us-west-2"}) == (
        "trainstack:placements: 'us-west-2': expected a list of placements, e.g. "
        "[{cloud: aws, region: us-east-1, instanceTypes: [g5.xlarge]}]")


@pytest.mark.parametrize(("raw", "line"), [
    # The stack says gcp, home says aws.
    ({**GCP, "placements": [{**HOME}]},
     "trainstack:placements[0].cloud: 'aws': the first placement is home and must be the stack's trainstack:cloud "
     "'gcp'"),
    # No trainstack:cloud is aws.
    ({"region": "us-central1", "placements": [{**GCP_HOME}]},
     "trainstack:placements[0].cloud: 'gcp': the first placement is home and must be the stack's trainstack:cloud "
     "'aws'"),
    ({**GCP, "placements": [{**GCP_HOME, "project": "proj-b"}]},
     "trainstack:placements[0].project: 'proj-b': the first placement is home and must be the stack's "
     "trainstack:project 'proj-a'"),
    # No trainstack:project on a gcp stack is ''.
    ({"cloud": "gcp", "region": "us-central1", "placements": [{**GCP_HOME}]},
     "trainstack:placements[0].project: 'proj-a': the first placement is home and must be the stack's "
     "trainstack:project ''"),
    ({"region": "us-east-1", "compute": {"zones": ["us-east-1a"]}, "placements": [{**HOME, "zones": ["us-east-1b"]}]},
     "trainstack:placements[0].zones: ['us-east-1b'] differs from compute.zones ['us-east-1a']: the first placement "
     "is home; give its zones in one of the two places"),
])
def test_home_must_be_the_stacks_own_place(raw, line):
    assert _refused(raw) == line


def test_home_agrees_with_the_stack_when_keys_are_left_out():
    # No trainstack:cloud (aws) and an aws home; an aws home's project is the schema's to refuse, not this check's.
    out = merge_home({"region": "us-east-1", "placements": [{**HOME, "project": "x"}]})
    assert out["compute"] == {"instanceTypes": ["g5.xlarge"]}
    out = merge_home({"cloud": "aws", "region": "us-east-1", "project": "", "placements": [{**HOME, "project": "x"}]})
    assert out["compute"] == {"instanceTypes": ["g5.xlarge"]}


def test_home_gives_its_zones_alone_and_its_types_and_zones_together():
    out = merge_home({"region": "us-east-1", "placements": [{"cloud": "aws", "region": "us-east-1",
                                                             "zones": ["us-east-1a"]}]})
    assert out["compute"] == {"zones": ["us-east-1a"]}
    out = merge_home({"region": "us-east-1", "compute": {"nodes": 2},
                      "placements": [{**HOME, "zones": ["us-east-1a"]}, WEST]})
    assert out["compute"] == {"nodes": 2, "instanceTypes": ["g5.xlarge"], "zones": ["us-east-1a"]}


def test_a_compute_that_is_no_block_is_left_to_the_schema():
    raw = {"region": "us-east-1", "compute": "big", "placements": [HOME]}
    assert merge_home(raw) == raw


def _validate_line(raw) -> str:
    with pytest.raises(ConfigError) as e:
        load_settings({"run": {"synthetic": True}, **raw}, stack="t")
    return str(e.value)


def test_the_same_gcp_place_twice_names_its_project():
    raw = {**GCP, "compute": {"instanceTypes": ["g2-standard-8"]}, "placements": [GCP_HOME, GCP_HOME]}
    assert _validate_line(raw) == ("trainstack:placements[1]: gcp us-central1 (project proj-a) is placements[0] "
                                   "again; list each place once")


def test_a_type_of_several_gpu_counts_says_them_all():
    # An N1 machine takes 1, 2, 4 or 8 GPUs; home's a2-megagpu-16g has 16.
    raw = {**GCP, "compute": {"instanceTypes": ["a2-megagpu-16g"], "gpusPerNode": 16},
           "placements": [{**GCP, "instanceTypes": ["a2-megagpu-16g"]},
                          {"cloud": "gcp", "region": "us-east4", "project": "proj-a", "instanceTypes": ["n1-standard-8"]}]}
    assert _validate_line(raw) == (
        "trainstack:placements[1].instanceTypes[0]: 'n1-standard-8' has 1 or 2 or 4 or 8 GPU(s), so this placement "
        "would train 1 replicas, not the run's 16 (compute.gpusPerNode 16 x compute.nodes 1); every placement trains "
        "the same replicas: list types with 16 GPU(s)")
