"""The controller's configuration refused in the exact line an operator reads (the key, what was
expected, what was given), the boundaries of each number, and a placement found by what an
operator types after ``ops move --to``."""

from __future__ import annotations

import json

import pytest

from controller.config import ConfigError, parse
from tests.controller.test_config import GCP_HOME, GOOD, _with

AUDIENCE = GOOD["placements"][2]["access"]["gcp_audience"]
ACCOUNT = GOOD["placements"][2]["access"]["service_account"]


@pytest.mark.parametrize(("doc", "says"), [
    ("{", "TRAINSTACK_PLACEMENTS: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ("[1]", "TRAINSTACK_PLACEMENTS: expected a JSON object, got list"),
    (_with("run_uri", 5), "run_uri: expected str, got 5"),
    (_with("run_uri", "http://b/r"), "run_uri: expected s3://, gs:// or file://, got 'http://b/r'"),
    (_with("nodes", True), "nodes: expected int, got True"),
    (_with("nodes", 1.0), "nodes: expected int, got 1.0"),
    (_with("nodes", 0), "nodes: expected 1 or more, got 0"),
    (_with("wait_minutes", 0), "wait_minutes: expected 1 or more, got 0"),
    (_with("max_runtime_s", True), "max_runtime_s: expected a whole number of seconds, 1 or more, got True"),
    (_with("max_runtime_s", "60"), "max_runtime_s: expected a whole number of seconds, 1 or more, got '60'"),
    (_with("max_runtime_s", 0), "max_runtime_s: expected a whole number of seconds, 1 or more, got 0"),
    (_with("placements", {}), "placements: expected list, got {}"),
    (_with("placements", []), "placements: expected at least one placement"),
    (_with("placements", [GOOD["placements"][0], "p"]), "placements[1]: expected an object, got 'p'"),
    (_with("1.cloud", "azure"), "placements[1].cloud: expected one of aws, gcp, got 'azure'"),
    (_with("1.region", None), "placements[1].region: expected str, got None"),
    (_with("1.cloud", None), "placements[1].cloud: expected str, got None"),
    (_with("2.project", ""), "placements[2].project: a gcp placement needs its project id, got ''"),
    (_with("1.project", 7), "placements[1].project: expected a string or null, got 7"),
    (_with("1.group", "ts-gpu", _with("1.region", "us-east-1")),
     "placements[1].group: aws us-east-1 ts-gpu is listed twice"),
    (_with("1.access", {"aws_role_arn": "r"}),
     "placements[1].access: a placement on home's cloud (aws) is reached with the controller's own identity; "
     "expected none, got {'aws_role_arn': 'r'}"),
    (_with("2.access", None),
     "placements[2].access: a gcp placement of a aws stack is reached by federation and needs "
     "{gcp_audience, service_account}, got None"),
    (_with("2.access.scope", "x"),
     "placements[2].access.scope: not a key of a gcp placement's access (expected gcp_audience, service_account)"),
    (_with("2.access.service_account", "Someone@my-proj.iam.gserviceaccount.com"),
     "placements[2].access.service_account: expected a service account email (NAME@PROJECT.iam.gserviceaccount.com), "
     "got 'Someone@my-proj.iam.gserviceaccount.com'"),
    (_with("1.access.audience", None, GCP_HOME),
     "placements[1].access.audience: expected the audience the role's trust policy names (a non-empty string), got None"),
])
def test_a_bad_document_is_refused_in_the_line_an_operator_reads(doc, says):
    with pytest.raises(ConfigError) as e:
        parse(doc if isinstance(doc, str) else json.dumps(doc).encode())

    assert str(e.value) == says


def test_the_smallest_numbers_and_a_role_in_another_partition_are_accepted():
    doc = _with("max_runtime_s", 1, _with("wait_minutes", 1, _with("nodes", 1, GCP_HOME)))
    doc["placements"][1]["access"]["aws_role_arn"] = "arn:aws-us-gov:iam::123456789012:role/path/ts-controller"

    doc["run_uri"] = "gs://b/runs/TEST-X//"
    config = parse(doc)

    assert config.run_uri == "gs://b/runs/TEST-X"  # only the slashes go: the run's own name stays whole
    assert (config.nodes, config.wait_minutes, config.max_runtime_s, config.wait_s) == (1, 1, 1, 60.0)
    assert config.placements[1].label == "aws us-east-1" and config.placements[0].project == "my-proj"


@pytest.mark.parametrize(("where", "index"), [(" 2 ", 2), ("0", 0), ("gcp us-central1", 2), ("aws:us-west-2", 1),
                                               ("us-central1", 2)])
def test_a_placement_is_found_by_what_an_operator_types(where, index):
    config = parse(GOOD)
    assert config.find(where) is config.placements[index]


@pytest.mark.parametrize(("where", "says"), [
    ("3", "no placement is '3'; the placements: 0 (aws us-east-1), 1 (aws us-west-2), 2 (gcp us-central1) "
          "(give the index or cloud:region)"),
    ("gcp:us-east-1", "no placement is 'gcp:us-east-1'; the placements: 0 (aws us-east-1), 1 (aws us-west-2), "
                      "2 (gcp us-central1) (give the index or cloud:region)"),
])
def test_a_placement_not_there_lists_those_that_are(where, says):
    with pytest.raises(ConfigError) as e:
        parse(GOOD).find(where)

    assert str(e.value) == says


def test_a_region_with_two_placements_asks_for_the_cloud():
    doc = _with("1.region", "us-central1", _with("1.group", "ts-other"))
    doc["placements"].pop(2)
    doc["placements"].append({"cloud": "gcp", "region": "us-central1", "project": "p", "group": "g", "access": {
        "gcp_audience": AUDIENCE, "service_account": ACCOUNT}})
    config = parse(doc)

    with pytest.raises(ConfigError, match=r"^more than one placement is 'us-central1'; the placements: "):
        config.find("us-central1")
    assert config.find("gcp:us-central1").index == 2 and config.find("aws us-central1").index == 1
