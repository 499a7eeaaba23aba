"""`ops move` and the placements in `ops status`, against moto_server's S3 and Auto Scaling (two regions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.oauth2 import credentials as google_oauth2

from controller import record as records
from controller.clouds import COMPUTE_ENDPOINT_ENV
from ops import status
from ops.__main__ import main
from runfolder.storage import open_store
from tests.controller.federation import GoogleSide
from tests.controller.helpers import moved_events, sizes, trained
from tests.fixtures.gce_groups import GceGroups
from tests.fixtures.no_capacity import placements  # noqa: F401 - a fixture, found by name
from tests.ops.test_status import fake_pulumi

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _document(config) -> dict:
    return {"run_uri": config.run_uri, "nodes": config.nodes, "wait_minutes": config.wait_minutes,
            "placements": [{"cloud": p.cloud, "region": p.region, "project": p.project, "group": p.group}
                           for p in config.placements]}


def test_move_by_region_moves_the_run_and_status_shows_it(placements, tmp_path, capsys):  # noqa: F811
    store = open_store(placements.run.uri)
    trained(store, step=30, last_beat=time.time() - 5)  # preempted: the lease released
    config_file = tmp_path / "placements.json"
    config_file.write_text(json.dumps(_document(placements.config)))

    rc = main(["move", "--config", str(config_file), "--to", "us-west-2", "--reason", "cheaper there"])

    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.strip() == (f"moved {placements.run.uri} from 0 (aws us-east-1) to 1 (aws us-west-2); "
                           "it resumes from step 30")
    assert sizes(placements.config) == [0, 1]
    [event] = moved_events(store)
    assert event["reason"].endswith("(ops move): cheaper there") and event["step"] == 30

    st = status.read_status(placements.run.uri)
    rows = dict(status.placement_lines(st.placement))
    assert rows["placement"].startswith("1 (aws us-west-2) since ")
    assert "aws us-east-1 -> aws us-west-2 at step 30: asked by" in rows["moved"]
    assert any(e.get("event") == "moved" for e in st.events)  # among the machines' events
    assert main(["status", "--run-uri", placements.run.uri]) == 0
    shown = capsys.readouterr().out
    assert "placement" in shown and "aws us-east-1 -> aws us-west-2" in shown


def test_move_to_the_other_cloud_uses_the_operators_google_credentials(placements, tmp_path, capsys, monkeypatch):  # noqa: F811
    # An AWS-home run moved to its GCP placement by region: the operator's own Google credentials
    # (`gcloud auth application-default login`'s file) size the GCE group, never the function's federation.
    store = open_store(placements.run.uri)
    trained(store, step=30, last_beat=time.time() - 5)
    google = GoogleSide(moto=placements.proxy.url)
    google.refresh_tokens.add("1//operator-refresh")
    gce = GceGroups("ts-proj", "us-central1")
    gce.add("ts-gpu-p2", 0)
    gce.authorize = lambda _group, header: header.removeprefix("Bearer ") in google.operator_tokens
    doc = _document(placements.config)
    doc["placements"].append({"cloud": "gcp", "region": "us-central1", "project": "ts-proj", "group": "ts-gpu-p2",
                              "access": {"gcp_audience": "//iam.googleapis.com/projects/987654321/locations/global/"
                                                         "workloadIdentityPools/ts-pool/providers/aws-controller",
                                         "service_account": "ts-controller@ts-proj.iam.gserviceaccount.com"}})
    config_file = tmp_path / "placements.json"
    config_file.write_text(json.dumps(doc))
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "764086051850-x.apps.googleusercontent.com",
                               "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty", "refresh_token": "1//operator-refresh",
                               "universe_domain": "googleapis.com"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    # google-auth refreshes such a file's token at Google's OAuth endpoint whatever the file says.
    monkeypatch.setattr(google_oauth2, "_GOOGLE_OAUTH2_TOKEN_ENDPOINT", f"{google.url}/token")
    monkeypatch.setenv(COMPUTE_ENDPOINT_ENV, gce.url + "/")
    try:
        rc = main(["move", "--config", str(config_file), "--to", "us-central1"])
    finally:
        google.close()
        gce.close()

    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.strip() == (f"moved {placements.run.uri} from 0 (aws us-east-1) to 2 (gcp us-central1); "
                           "it resumes from step 30")
    assert sizes(placements.config) == [0, 0] and gce.sizes["ts-gpu-p2"] == 1
    assert google.operator_tokens and google.exchanges == [] and google.impersonations == []
    assert ("POST", "/compute/v1/projects/ts-proj/regions/us-central1/instanceGroupManagers/ts-gpu-p2/resize") \
        in gce.requests
    [event] = moved_events(store)
    assert (event["from_placement"], event["to_placement"], event["step"]) == ("aws us-east-1", "gcp us-central1", 30)


def test_move_waits_for_a_live_lease_then_leaves_it_to_the_controller(placements, tmp_path, capsys):  # noqa: F811
    store = open_store(placements.run.uri)
    now = time.time()
    trained(store, step=30, last_beat=now, lease_released=False, lease_until=now + 300)
    config_file = tmp_path / "placements.json"
    config_file.write_text(json.dumps(_document(placements.config)))

    rc = main(["move", "--config", str(config_file), "--to", "1", "--wait", "0.5"])

    out = capsys.readouterr().out
    assert rc == 1, out
    assert "is recorded; the run's lease is held by i-0aaa/1" in out
    assert sizes(placements.config) == [0, 0]
    assert records.read(store)[0].pending is not None and moved_events(store) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--to", "eu-west-1"], "ops move: no placement is 'eu-west-1'; the placements: 0 (aws us-east-1), "
                            "1 (aws us-west-2) (give the index or cloud:region)"),
    (["--to", "us-east-1"], "ops move: the run is already in placement 0 (aws us-east-1)"),
])
def test_move_refuses_in_one_line(placements, tmp_path, capsys, argv, message):  # noqa: F811
    trained(open_store(placements.run.uri), step=30, last_beat=time.time())
    config_file = tmp_path / "placements.json"
    config_file.write_text(json.dumps(_document(placements.config)))

    assert main(["move", "--config", str(config_file), *argv]) == 2

    assert capsys.readouterr().err.strip() == message
    assert sizes(placements.config) == [1, 0]


def test_move_refuses_an_ended_run(placements, tmp_path, capsys):  # noqa: F811
    store = open_store(placements.run.uri)
    trained(store, step=30, last_beat=time.time())
    store.put_bytes("COMPLETE", b'{"step": 30}')
    config_file = tmp_path / "placements.json"
    config_file.write_text(json.dumps(_document(placements.config)))
    assert main(["move", "--config", str(config_file), "--to", "1"]) == 2
    assert capsys.readouterr().err.strip() == "ops move: the run has ended (COMPLETE); nothing to move"


def test_move_resolves_the_stack_with_pulumi(placements, tmp_path):  # noqa: F811
    trained(open_store(placements.run.uri), step=30, last_beat=time.time() - 5)
    bin_dir = tmp_path / "bin"
    args_file = fake_pulumi(bin_dir, {"runUri": placements.run.uri, "placements": _document(placements.config)})
    env = {**os.environ, **placements.run.vars, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}

    proc = subprocess.run([sys.executable, "-m", "ops", "move", "--stack", "dev", "--to", "aws:us-west-2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    assert proc.returncode == 0, proc.stderr
    assert "--stack\ndev" in args_file.read_text()
    assert sizes(placements.config) == [0, 1]
    # `status --stack` reads the group the run is in now (us-west-2: one machine), not the home one.
    proc = subprocess.run([sys.executable, "-m", "ops", "status", "--stack", "dev", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    doc = json.loads(proc.stdout)
    assert (doc["machines_running"], doc["machines_desired"], doc["group_note"]) == (1, 1, ""), proc.stderr
    assert doc["placement"]["active"] == 1


def test_a_stack_without_placements_is_refused_in_one_line(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_pulumi(bin_dir, {"runUri": "s3://b/runs/r"})
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "ops", "move", "--stack", "dev", "--to", "1"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("ops move: stack dev has no placements output: it has one placement, or run "
                                   "`pulumi up` for it first")
