"""The controller's configuration document: read as the stack writes it, refused in one line naming the key."""

from __future__ import annotations

import json

import pytest

from controller.config import ConfigError, parse

GOOD = {"run_uri": "s3://b/runs/r/", "nodes": 2, "wait_minutes": 15, "placements": [
    {"cloud": "aws", "region": "us-east-1", "project": None, "group": "ts-gpu"},
    {"cloud": "aws", "region": "us-west-2", "project": None, "group": "ts-gpu-1"},
    {"cloud": "gcp", "region": "us-central1", "project": "my-proj", "group": "ts-gpu-2"},
]}


def test_the_stacks_document_reads_as_placements_in_order():
    config = parse(json.dumps(GOOD))
    assert config.run_uri == "s3://b/runs/r" and config.nodes == 2 and config.wait_s == 900
    assert [(p.index, p.cloud, p.region, p.group, p.project) for p in config.placements] == [
        (0, "aws", "us-east-1", "ts-gpu", None), (1, "aws", "us-west-2", "ts-gpu-1", None),
        (2, "gcp", "us-central1", "ts-gpu-2", "my-proj")]


def _with(path: str, value):
    doc = json.loads(json.dumps(GOOD))
    target, *rest = path.split(".")
    if rest:
        doc["placements"][int(target)][rest[0]] = value
    else:
        doc[target] = value
    return doc


@pytest.mark.parametrize(("path", "value", "named"), [
    ("run_uri", "b/runs/r", "run_uri"),
    ("nodes", 0, "nodes"),
    ("nodes", True, "nodes"),
    ("wait_minutes", "15", "wait_minutes"),
    ("placements", [], "placements"),
    ("2.project", None, "placements[2].project"),
    ("1.cloud", "azure", "placements[1].cloud"),
    ("1.group", None, "placements[1].group"),
    ("1.region", "us-east-1", None),  # a duplicate needs both fields: checked below
])
def test_bad_input_is_one_line_naming_the_key(path, value, named):
    doc = _with(path, value)
    if named is None:
        doc["placements"][1]["group"] = "ts-gpu"
        named = "placements[1].group"
    with pytest.raises(ConfigError) as e:
        parse(doc)
    assert str(e.value).startswith(named + ":") and "\n" not in str(e.value)


@pytest.mark.parametrize(("where", "index"), [("1", 1), ("us-west-2", 1), ("gcp:us-central1", 2),
                                               ("aws us-east-1", 0)])
def test_a_placement_is_found_by_index_region_or_cloud_and_region(where, index):
    assert parse(GOOD).find(where).index == index


def test_an_unknown_placement_lists_the_placements():
    with pytest.raises(ConfigError, match=r"no placement is 'eu-west-1'.*0 \(aws us-east-1\)"):
        parse(GOOD).find("eu-west-1")
