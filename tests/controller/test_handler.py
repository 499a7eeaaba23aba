"""The function's entry point as a function runs it: a fresh process with only the configuration
variable and the cloud's endpoint, importing neither TensorFlow, Pulumi, Keras nor the operator's
CLI (a Lambda package holds boto3 and this project's controller/ and trainer/ storage modules)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runfolder.storage import open_store
from tests.controller.helpers import make_group, sizes, trained

ROOT = Path(__file__).resolve().parents[2]
# Refuses what an AWS function does not have (TensorFlow, Pulumi, the CLI, Google's libraries), then
# runs one tick as Lambda calls it.
LAMBDA = """
import importlib.abc, json, sys
HEAVY = ("tensorflow", "keras", "pulumi", "pulumi_aws", "pulumi_gcp", "ops", "components", "numpy", "google")
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"a function has no {name}")
        return None
sys.meta_path.insert(0, Refuse())
from controller.handler import handler
print("RESULT " + json.dumps(handler({}, None)))
"""


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LAMBDA], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_the_handler_ticks_with_only_the_variable_and_boto3(s3_run):
    from tests.controller.helpers import aws_config

    groups = [make_group("us-east-1", 1), make_group("us-west-2", 1)]  # the second left up: the tick zeroes it
    config = aws_config(s3_run.uri, groups)
    trained(open_store(s3_run.uri), step=10, last_beat=time.time())
    doc = {"run_uri": s3_run.uri, "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": p.region, "project": None, "group": p.group} for p in config.placements]}
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **s3_run.vars, "TRAINSTACK_PLACEMENTS": json.dumps(doc)}

    proc = _run(env)

    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result["action"] == "stay" and "running" in result["reason"]
    assert result["resized"] == [{"placement": 1, "group": groups[1], "size": 0}]
    assert sizes(config) == [1, 0]


def test_without_the_variable_the_handler_says_which_one_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "controller.handler"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "controller: TRAINSTACK_PLACEMENTS is not set: the stack sets it on the function"
