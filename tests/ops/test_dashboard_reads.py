"""What a dashboard's refresh reads from the bucket: a growing TensorBoard event file only by its new
tail, counted on the wire in front of moto_server and the GCS emulator; what it keeps, within a bound.

Event files are written as the trainer's ``tf.summary`` writes them (TFRecord framing, a float tensor
per scalar), with an image-sized record among the scalars as TensorBoard files that grow to tens of
MiB hold; the CRCs are real (``google_crc32c``, masked as TFRecord does).
"""

from __future__ import annotations

import json
import struct
import time

import pytest

from ops.dashboard import CURVES_MAX_BYTES, Dashboard, data
from ops.dashboard.cache import Kept
from runfolder import layout
from runfolder.storage import open_store

TB = layout.TENSORBOARD_PREFIX + "events.out.tfevents.1.chief"


def _masked(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(payload: bytes) -> bytes:
    head = struct.pack("<Q", len(payload))
    return head + struct.pack("<I", _masked(head)) + payload + struct.pack("<I", _masked(payload))


def scalars(step: int, **values: float) -> bytes:
    """One event's record: each value as ``tf.summary.scalar`` writes it."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

    vals = [summary_pb2.Summary.Value(tag=tag.replace("__", "/"), tensor=tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, float_val=[v])) for tag, v in values.items()]
    return record(event_pb2.Event(step=step, wall_time=1.7e9 + step,
                                  summary=summary_pb2.Summary(value=vals)).SerializeToString())


def image(step: int, size: int) -> bytes:
    """An image summary's record of about ``size`` bytes (what makes event files large)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    img = summary_pb2.Summary.Image(height=1, width=1, colorspace=3, encoded_image_string=b"\x89PNG" * (size // 4))
    value = summary_pb2.Summary.Value(tag="samples", image=img)
    return record(event_pb2.Event(step=step, wall_time=1.7e9 + step,
                                  summary=summary_pb2.Summary(value=[value])).SerializeToString())


def steps(first: int, last: int) -> bytes:
    return b"".join(scalars(s, train__loss=1.0 / s, train__accuracy=1 - 1.0 / s) for s in range(first, last + 1))


def _run(uri: str) -> None:
    store = open_store(uri)
    store.put_bytes(layout.EVENTS_KEY, json.dumps({"event": "started", "time": "2026-12-04T10:00:00+00:00",
                                                   "attempt": 1, "config": {"steps": 100000}}).encode() + b"\n")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["s3", "gs"])
def test_refreshes_of_a_growing_50_mib_event_file_read_its_growth_not_the_file_again(request, backend):
    run = request.getfixturevalue(f"faulty_{backend}")
    bucket = run.uri.rsplit("/runs/", 1)[0]
    run_id = run.uri.rsplit("/", 1)[1]
    _run(run.uri)
    store = open_store(run.uri)
    content = b"".join(image(s, 1 << 20) + steps(100 * s + 1, 100 * s + 100) for s in range(50))
    store.put_bytes(TB, content)
    assert len(content) > 50 << 20
    dash = Dashboard(bucket, open_store(bucket))
    run.proxy.answered.clear()
    sizes, refreshes = [len(content)], 4
    for i in range(refreshes + 1):
        if i:
            first = 5000 + 100 * i + 1
            content += image(first, 200 << 10) + steps(first, first + 99)
            store.put_bytes(TB, content)
            sizes.append(len(content))
            run.proxy.answered.clear() if i == 1 else None
        code, body = dash.respond(f"/run/{run_id}")
        assert code == 200 and f'data-metric="train/loss" data-points="{5000 + 100 * i}"' in body, i
        if i == 0:
            # The first page reads the file once, whole.
            read = sum(n for method, _p, n in run.proxy.answered if method == "GET")
            assert len(content) <= read < len(content) + (256 << 10), read
            run.proxy.answered.clear()
    read = sum(n for method, _path, n in run.proxy.answered if method == "GET")
    growth = sizes[-1] - sizes[0]
    # Each refresh: the listing and a few bytes before the new tail, besides the growth itself.
    assert growth <= read <= growth + refreshes * (16 << 10), (read, growth)
    assert len(dash.curves) == 1 and dash.curves.bytes <= CURVES_MAX_BYTES


def test_a_file_replaced_by_another_is_read_again_whole(tmp_path):
    uri = f"file://{tmp_path}/runs/r"
    store = open_store(uri)
    store.put_bytes(TB, steps(1, 50))
    kept = Kept(1 << 20, weigh=lambda f: f.weight())
    curves, _notes = data.tensorboard_scalars(store, kept)
    assert [s for s, _v in curves["train/loss"]] == list(range(1, 51))
    # Not a longer file: another one, longer (a run folder written again from its start).
    time.sleep(0.01)
    store.put_bytes(TB, b"".join(scalars(s, train__loss=7.0) for s in range(1, 80)))
    curves, notes = data.tensorboard_scalars(store, kept)
    assert curves["train/loss"] == [(s, 7.0) for s in range(1, 80)] and notes == []


def test_a_record_cut_at_the_end_is_read_once_it_is_whole(tmp_path):
    uri = f"file://{tmp_path}/runs/r"
    store = open_store(uri)
    whole = steps(1, 10) + scalars(11, train__loss=0.5)
    kept = Kept(1 << 20, weigh=lambda f: f.weight())
    fetched = []
    real = store.get_range
    store.get_range = lambda key, start, end=None: fetched.append(start) or real(key, start, end)
    for cut, seen in ((len(whole) - 3, 10), (len(whole) - 3, 10), (len(whole), 11)):
        store.put_bytes(TB, whole[:cut])
        time.sleep(0.01)
        curves, notes = data.tensorboard_scalars(store, kept)
        assert len(curves["train/loss"]) == seen and notes == [], (cut, curves)
    # The cut record was asked for again from its start, after the few bytes that check the file only grew.
    assert fetched[0] == 0 and fetched[1] == fetched[2] == len(steps(1, 10)) - data.TAIL_CHECK


def test_what_a_dashboard_keeps_stays_within_its_bound(tmp_path):
    uri = f"file://{tmp_path}"
    for r in range(6):
        store = open_store(f"{uri}/runs/r{r}")
        _run(f"{uri}/runs/r{r}")
        store.put_bytes(TB, steps(1, 400))
    dash = Dashboard(uri, open_store(uri))
    probe = Kept(1 << 30, weigh=lambda f: f.weight())
    data.tensorboard_scalars(open_store(f"{uri}/runs/r0"), probe)
    [one] = [probe.get(f"{uri}/runs/r0/{TB}").weight()]
    dash.curves = Kept(3 * one, weigh=lambda f: f.weight())
    ev = len(open_store(f"{uri}/runs/r0").get_bytes(layout.EVENTS_KEY))
    dash.objects = Kept(ev + ev // 2, weigh=lambda kept: len(kept[1]))
    for r in range(6):
        code, body = dash.respond(f"/run/r{r}")
        assert code == 200 and 'data-metric="train/loss" data-points="400"' in body
        assert dash.curves.bytes <= 3 * one and dash.objects.bytes <= ev + ev // 2
    assert len(dash.curves) == 3 and f"{uri}/runs/r5/{TB}" in dash.curves
    assert len(dash.objects) == 1  # one run's events.jsonl: two do not fit


def test_kept_drops_the_least_recently_used_first_and_what_is_larger_than_itself():
    kept = Kept(10, weigh=len)
    kept["a"], kept["b"] = "xxxx", "yyyy"
    assert kept.get("a") == "xxxx"  # a is now the newer
    kept["c"] = "zzzz"
    assert "b" not in kept and kept.get("a") == "xxxx" and kept.bytes == 8
    kept["huge"] = "w" * 11
    assert "huge" not in kept and kept.bytes == 8
    kept["a"] = "x"
    assert kept.bytes == 5 and kept.pop("a") == "x" and kept.bytes == 4 and kept.pop("a", 0) == 0
    with pytest.raises(ValueError, match="max_bytes >= 0"):
        Kept(-1, weigh=len)
