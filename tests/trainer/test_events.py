"""Events: JSON lines off a terminal, human lines on one, the run's log in the store, COMPLETE's figures."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from runfolder.events import read_events, seconds_lost
from runfolder.storage import open_store
from trainer.events import EventLog
from trainer.export import complete_record

REPO = Path(__file__).resolve().parents[2]


def test_events_are_json_lines_on_stdout_and_in_the_run(tmp_path):
    store = open_store(f"file://{tmp_path}/run")
    out = io.StringIO()
    log = EventLog(store, attempt=2, stream=out, tty=False)
    log.emit("started", config={"steps": 5})
    log.emit("checkpoint", step=5, seconds=0.1, bytes=10)
    log.emit("upload_retry", local_only=True, key="events.jsonl")
    log.progress(5, 10, 0.5, 100.0)
    log.close()
    printed = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in printed] == ["started", "checkpoint", "upload_retry"]
    assert all(e["attempt"] == 2 and "time" in e for e in printed)
    stored = read_events(store)
    assert [e["event"] for e in stored] == ["started", "checkpoint"]  # local-only events stay local
    progress = json.loads(store.get_bytes("progress.json"))
    assert (progress["step"], progress["total"], progress["examples_per_sec"]) == (5, 10, 100.0)


def test_writes_behind_a_slow_store_are_coalesced(tmp_path):
    """While the writer thread is held up, the events waiting go up in one append, only the
    newest progress.json is written, and a background task queued twice runs once."""
    import threading

    store = open_store(f"file://{tmp_path}/run")
    release, calls, synced = threading.Event(), [], []
    real_append, real_put = store.append_lines, store.put_bytes

    def append_lines(key, lines):
        calls.append(("append", list(lines)))
        release.wait(10)
        real_append(key, lines)

    def put_bytes(key, data):
        calls.append(("put", key))
        real_put(key, data)

    store.append_lines, store.put_bytes = append_lines, put_bytes
    def sync():
        synced.append(1)

    log = EventLog(store, stream=io.StringIO(), tty=False)
    log.emit("started")  # taken by the writer at once, which then waits on the store
    for _ in range(100):
        if calls:
            break
        threading.Event().wait(0.01)
    for step in range(1, 51):
        log.emit("checkpoint", step=step)
        log.progress(step, 50, 0.5, 10.0)
        log.background(sync)
    release.set()
    log.close()
    appends = [c[1] for c in calls if c[0] == "append"]
    puts = [c[1] for c in calls if c[0] == "put"]
    assert [len(a) for a in appends] == [1, 50]
    assert puts == ["progress.json"] and synced == [1]
    assert [e.get("step") for e in read_events(store)] == [None, *range(1, 51)]
    assert json.loads(store.get_bytes("progress.json"))["step"] == 50


def test_on_a_terminal_events_are_readable_lines_and_a_bar():
    out = io.StringIO()
    log = EventLog(None, stream=out, tty=True)
    log.start_bar(100, 0)
    log.update_bar(40, 0.25, 1234.0)
    log.emit("checkpoint", step=40, seconds=0.1, bytes=10)
    log.close()
    text = out.getvalue()
    assert "checkpoint step=40" in text and '{"event"' not in text


def test_seconds_lost_and_complete_record():
    def ev(kind, t):
        return {"event": kind, "time": f"2026-01-01T00:00:{t:02d}.000+00:00"}

    events = [ev("started", 0), ev("preempted", 10), ev("started", 14), ev("resumed", 15),
              ev("preempted", 20), ev("started", 30), ev("resumed", 31)]
    assert seconds_lost(events) == 5 + 11
    rec = complete_record(step=7, metrics={"loss": 1.0}, examples_seen=70, events=events,
                          finished_at=1767225640.0)  # 2026-01-01T00:00:40Z
    assert rec["attempts"] == 3 and rec["seconds_lost_to_preemption"] == 16 and rec["total_seconds"] == 40
    assert rec["examples_seen"] == 70 and rec["step"] == 7


def _at(kind, t, attempt, **fields):
    return {"event": kind, "time": f"2026-01-01T00:{t // 60:02d}:{t % 60:02d}.000+00:00", "attempt": attempt, **fields}


@pytest.mark.parametrize("events, lost", [
    # Killed without a word (SIGKILL): from the attempt's last event to the next `resumed`.
    ([_at("started", 0, 1), _at("checkpoint", 10, 1), _at("started", 40, 2), _at("resumed", 45, 2)], 35),
    # The same after a notice: from `preempted`.
    ([_at("started", 0, 1), _at("preempted", 10, 1), _at("started", 40, 2), _at("resumed", 45, 2)], 35),
    # A peer lost (76) counts from the failure; this machine's own failure does not count.
    ([_at("started", 0, 1), _at("failed", 10, 1, exit_code=76), _at("started", 20, 2), _at("resumed", 21, 2),
      _at("failed", 30, 2, exit_code=1), _at("started", 50, 3), _at("resumed", 51, 3)], 11),
    # A killed attempt, then a start-up that found no cluster (75, before its `started`): from the kill.
    ([_at("started", 0, 1), _at("checkpoint", 5, 1), _at("failed", 100, 2, exit_code=75),
      _at("started", 110, 2), _at("resumed", 115, 2)], 110),
    # A killed attempt that had not resumed yet counts from its `started`; the last attempt still runs.
    ([_at("started", 0, 1), _at("preempted", 10, 1), _at("started", 20, 2), _at("started", 60, 3),
      _at("resumed", 61, 3), _at("checkpoint", 90, 3)], 51),
    ([_at("started", 0, 1), _at("checkpoint", 10, 1), _at("finished", 20, 1)], 0),
])
def test_seconds_lost_counts_attempts_ended_without_a_word(events, lost):
    assert seconds_lost(events) == lost


def test_dockerfile_builds_on_the_pinned_image_and_runs_the_trainer():
    text = (REPO / "trainer" / "Dockerfile").read_text()
    froms = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert froms == ["${BASE_IMAGE}"]
    # The stack passes its pinned image as BASE_IMAGE; the default is the same pin, never latest.
    args = [line.split()[1] for line in text.splitlines() if line.startswith("ARG BASE_IMAGE")]
    assert args == ["BASE_IMAGE=tensorflow/tensorflow:2.21.0-gpu"]
    assert "latest" not in text
    assert "-r /opt/trainstack/code/trainer/requirements.txt" in text
    # The context (trainer/ and the stack's usercode/) is copied whole; the user's pinned
    # requirements install on top of the image's packages (constrained by them).
    assert "COPY . /opt/trainstack/code/" in text
    assert "-c /tmp/image.txt -r usercode/requirements.txt" in text
    # TF 2.21's CUDA/cuDNN come as NVIDIA's wheels (the stock image's cuDNN 8.9 gives TF no GPU),
    # installed into a fixed folder whose lib/ folders the library path names, one per wheel.
    assert "--target /opt/trainstack/cuda -r /opt/trainstack/code/trainer/requirements-gpu.txt" in text
    env_line = next(line for line in text.splitlines() if line.startswith("ENV LD_LIBRARY_PATH="))
    lib_path = env_line.split("=", 1)[1].split()[0].split(":")
    wheels = [line.split("==")[0] for line in (REPO / "trainer" / "requirements-gpu.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert "nvidia-cudnn-cu12" in wheels and len(wheels) == 12
    expected = [f"/opt/trainstack/cuda/nvidia/{w.removeprefix('nvidia-').removesuffix('-cu12').replace('-', '_')}/lib"
                for w in wheels if w != "nvidia-cuda-nvcc-cu12"]  # nvcc brings ptxas (on PATH), no libraries
    assert sorted(lib_path[: len(expected)]) == sorted(expected)
    # The machines' supervisor passes `python -m trainer` itself: no ENTRYPOINT to double it.
    assert "ENTRYPOINT" not in text and 'CMD ["python", "-m", "trainer"]' in text
