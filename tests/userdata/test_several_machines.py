"""Several machines in one group: who is a peer, and finishing together.

- GCP's peer list is the running machines of exactly this group: a fake `gcloud` answers
  `compute instances list` from a fixed set of machines in several states, with another
  group whose name shares this one's prefix, and applies the filter as GCE does (the
  subset of its filter language the scripts use).
- A worker that ends before the chief has written the end marker (the chief still
  exports the model) waits for it and finishes the same way, with no failure counted.
- Waiting for a peer that is not there is no failure either: the run's deadline bounds it.
"""

from __future__ import annotations

import json
import subprocess
import threading

import boto3
import pytest

from tests.userdata.conftest import group_size, machine_events, make_group, s3_keys, settings_for, wait_for
from tests.userdata.metadata import INSTANCE_ID
from tests.userdata.test_boot_faults import fake_trainer_uri  # noqa: F401 (a fixture)
from trainer import layout


def _gce(name: str, status: str, ip: str, zone: str = "us-central1-a") -> dict:
    return {"name": name, "status": status, "zone": f"https://www.googleapis.com/compute/v1/projects/p/zones/{zone}",
            "networkInterfaces": [{"networkIP": ip}]}


GCE_MACHINES = [
    _gce("trainstack-dev-abcd", "RUNNING", "10.128.0.12"),
    _gce("trainstack-dev-efgh", "RUNNING", "10.128.0.3"),
    _gce("trainstack-dev-ijkl", "STOPPING", "10.128.0.4"),  # taken back: not a peer any more
    _gce("trainstack-dev-mnop", "PROVISIONING", "10.128.0.5"),  # not up yet
    _gce("trainstack-dev-gpu-qrst", "RUNNING", "10.128.0.6"),  # the group trainstack-dev-gpu
    _gce("trainstack-devx-uvwx", "RUNNING", "10.128.0.7"),
    _gce("trainstack-dev-yzab", "RUNNING", "10.132.0.8", zone="europe-west1-b"),  # same name, other region
]


def test_gcp_peers_are_the_running_machines_of_exactly_this_group(machines, gs_run):
    box = machines(gs_run, "trainstack-dev", "", settings=settings_for("gcp"))
    (box.state / "gce-instances.json").write_text(json.dumps(GCE_MACHINES))
    lib = box.root / "opt/trainstack/bin/lib.sh"
    proc = subprocess.run(["bash", "-c", f'set -euo pipefail; . "{lib}"; load_env; group_ips'], env=box.env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # Sorted as addresses (3 before 12), only RUNNING, only trainstack-dev-<4>, only this region.
    assert proc.stdout.split() == ["10.128.0.3", "10.128.0.12"]
    listed = [a for a in box.argvs("gcloud") if a[:3] == ["compute", "instances", "list"]]
    assert len(listed) == 1


def test_the_fake_gcloud_applies_the_filter_it_is_given(machines, gs_run):
    # Without a status or an exact name, GCE lists every state and every prefix match:
    # what the old filter (name~^GROUP-) got.
    box = machines(gs_run, "trainstack-dev", "", settings=settings_for("gcp"))
    (box.state / "gce-instances.json").write_text(json.dumps(GCE_MACHINES))
    proc = subprocess.run(["gcloud", "compute", "instances", "list", "--filter=name~^trainstack-dev-",
                           "--format=value(networkInterfaces[0].networkIP)"], env=box.env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split()) == 6


@pytest.mark.slow
def test_a_worker_that_ends_before_the_chief_waits_for_the_end_marker(
        machines, s3_run, metadata, fake_trainer_uri):  # noqa: F811 (the fixture)
    name = make_group(s3_run, 2)
    ec2 = boto3.client("ec2", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"], region_name="us-east-1")
    found = ec2.describe_instances(Filters=[{"Name": "tag:aws:autoscaling:groupName", "Values": [name]}])
    ips = sorted((i["PrivateIpAddress"] for r in found["Reservations"] for i in r["Instances"]),
                 key=lambda ip: tuple(map(int, ip.split("."))))
    metadata.local_ipv4 = ips[1]  # worker 1: the chief (worker 0) writes the marker
    box = machines(s3_run, name, fake_trainer_uri, env_overrides={
        "TRAINSTACK_NODES": "2", "TRAINSTACK_MAX_FAILURES": "1"})
    box.env.update({"FAKE_TRAINER": "exit0", "TRAINSTACK_CLUSTER_POLL_S": "1"})
    supervisor = box.boot(watcher=False)

    def chief_finishes_later() -> None:
        # The chief exports the model a few seconds after worker 1 has ended.
        wait_for(lambda: "trainer exited with 0" in box.journal(), 120, "worker 1's exit")
        wait_for(lambda: box.journal().count("waiting for the chief") >= 1, 30, "worker 1 to wait")
        s3 = boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"])
        key = s3_run.uri.removeprefix(f"s3://{s3_run.bucket}/")
        s3.put_object(Bucket=s3_run.bucket, Key=f"{key}/{layout.COMPLETE}", Body=b'{"step": 40, "attempts": 1}')

    chief = threading.Thread(target=chief_finishes_later)
    chief.start()
    assert supervisor.wait(timeout=180) == 0, box.journal()
    chief.join()
    objects = s3_keys(s3_run)
    assert layout.COMPLETE in objects and layout.FAILED not in objects, sorted(objects)
    runs = [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]
    assert len(runs) == 1  # not restarted
    assert "failures in a row: 1" not in box.journal()
    assert [(e["event"], e["outcome"]) for e in machine_events(s3_run, INSTANCE_ID)] == [("finish", "COMPLETE")]
    assert group_size(s3_run, name) == (0, 0, 0) and box.argvs("shutdown") == [["-h", "now"]]


@pytest.mark.slow
def test_waiting_for_a_missing_peer_is_no_failure_and_ends_at_the_deadline(machines, s3_run, metadata, code_uri):
    # Two machines asked for, one in the group (its peer was taken, no spot capacity for a
    # replacement): the wait is not counted as failures; the run's deadline ends it.
    name = make_group(s3_run, 1)
    ec2 = boto3.client("ec2", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"], region_name="us-east-1")
    found = ec2.describe_instances(Filters=[{"Name": "tag:aws:autoscaling:groupName", "Values": [name]}])
    metadata.local_ipv4 = found["Reservations"][0]["Instances"][0]["PrivateIpAddress"]
    box = machines(s3_run, name, code_uri, env_overrides={
        "TRAINSTACK_NODES": "2", "TRAINSTACK_MAX_FAILURES": "1", "TRAINSTACK_MAX_RUNTIME_S": "12"})
    box.env.update({"TRAINSTACK_CLUSTER_WAIT_S": "1", "TRAINSTACK_CLUSTER_POLL_S": "1"})
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert layout.FAILED not in objects, objects.get(layout.FAILED)
    assert json.loads(objects[layout.TIMED_OUT])[layout.MARKER_REASON] == "the run's deadline passed"
    # With one failure allowed, a single counted wait would have been FAILED at once.
    assert box.journal().count("waiting for its other machines again") >= 1
    assert [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]] == []
