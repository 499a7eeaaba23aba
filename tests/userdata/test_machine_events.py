"""One writer per object: the trainer's events.jsonl and each machine's machine-events/<machine>.jsonl.

The machine's scripts (the watcher, the supervisor, finish) record their events with
`lib.sh`'s `event`; the trainer appends to `events.jsonl` at the same time. Object stores
have no append, so two writers of one object lose lines; here both write at once, as
fast as they can, and every line of both must be there afterwards.
"""

from __future__ import annotations

import io
import json
import subprocess
import threading
import time

import boto3

from devtools.metadata import INSTANCE_ID
from runfolder import layout
from runfolder.storage import open_store
from tests.userdata.helpers import events, machine_events
from trainer.events import EventLog

SCRIPTS, EVENTS_EACH = 3, 4


def _event_writer(box, writer: int) -> subprocess.Popen:
    """One of the machine's scripts writing EVENTS_EACH events through lib.sh's `event`."""
    lib = box.root / "opt/trainstack/bin/lib.sh"
    script = (f'set -euo pipefail; . "{lib}"; load_env; '
              f'for i in $(seq {EVENTS_EACH}); do event {layout.SPOT_NOTICE} writer={writer} n:="$i"; done')
    return subprocess.Popen(["bash", "-c", script], env=box.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_trainer_and_machine_scripts_write_events_at_once_and_none_is_lost(machines, s3_run):
    box = machines(s3_run, "trainstack-x", "")
    log = EventLog(open_store(s3_run.uri), attempt=1, stream=io.StringIO(), tty=False)
    steps: list[int] = []
    scripts = [_event_writer(box, w) for w in range(SCRIPTS)]

    def trainer() -> None:
        # Appends until every script is done, and a few more after.
        tail = 5
        while tail > 0:
            if all(p.poll() is not None for p in scripts):
                tail -= 1
            log.emit(layout.CHECKPOINT, step=len(steps), seconds=0.0, bytes=0)
            steps.append(len(steps))
            time.sleep(0.02)
        log.close()

    t = threading.Thread(target=trainer)
    t.start()
    outputs = [p.communicate(timeout=120)[0].decode() for p in scripts]
    t.join(timeout=120)
    assert all(p.returncode == 0 for p in scripts), outputs
    assert len(steps) > 10  # the trainer really wrote while the scripts did

    trainer_events = events(s3_run)
    assert [e["step"] for e in trainer_events if e["event"] == layout.CHECKPOINT] == steps
    assert {e["event"] for e in trainer_events} == {layout.CHECKPOINT}  # the trainer's object is its own

    mine = machine_events(s3_run, INSTANCE_ID)
    assert len(mine) == SCRIPTS * EVENTS_EACH
    for w in range(SCRIPTS):
        # Each script's events, all there, in the order it wrote them.
        assert [e["n"] for e in mine if e["writer"] == str(w)] == list(range(1, EVENTS_EACH + 1))
    assert {(e["event"], e["instance"]) for e in mine} == {(layout.SPOT_NOTICE, INSTANCE_ID)}
    times = [e[layout.TIME] for e in mine]
    assert times == sorted(times)  # appended under the lock: the file is in time order


def test_a_machine_recreated_under_its_name_keeps_its_earlier_events(machines, s3_run):
    # A GCE managed group recreates a preempted VM under the same name on a new disk: the
    # object is its own, so the new boot continues it instead of starting it over.
    box = machines(s3_run, "trainstack-x", "")
    key = s3_run.uri.removeprefix(f"s3://{s3_run.bucket}/") + "/" + layout.machine_events_key(INSTANCE_ID)
    earlier = {"event": layout.SPOT_NOTICE, "time": "2026-01-01T00:00:00.000Z", "instance": INSTANCE_ID}
    boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"]).put_object(
        Bucket=s3_run.bucket, Key=key, Body=(json.dumps(earlier)).encode())  # no final newline
    proc = _event_writer(box, 7)
    assert proc.wait(timeout=60) == 0, proc.stdout.read().decode()
    mine = machine_events(s3_run, INSTANCE_ID)
    assert mine[0] == earlier
    assert [e["n"] for e in mine[1:]] == list(range(1, EVENTS_EACH + 1))
