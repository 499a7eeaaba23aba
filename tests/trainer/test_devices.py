"""The GPU check: a machine whose TensorFlow sees other GPUs than asked for fails at once with exit 78."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from runfolder import exits, layout
from trainer.config import load_config
from trainer.devices import DeviceMismatch, check_gpus


def _lister(n: int):
    calls = []

    def list_devices(kind: str):
        calls.append(kind)
        return [SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(n)] if kind == "GPU" else []

    return list_devices, calls


@pytest.mark.parametrize(("expected", "seen"), [(1, 0), (8, 4), (0, 1)])
def test_a_different_gpu_count_is_refused_with_what_was_seen(expected, seen):
    fake, calls = _lister(seen)
    with pytest.raises(DeviceMismatch) as info:
        check_gpus(expected, fake)
    assert calls == ["GPU"]
    msg = str(info.value)
    assert f"asks for {expected} GPU(s)" in msg and f"TensorFlow sees {seen}" in msg
    assert "NVIDIA driver" in msg and ("CUDA" in msg or "CPU-only" in msg)
    details = info.value.details
    assert details["expected_gpus"] == expected and len(details["devices"]) == seen
    assert "is_cuda_build" in details["build"]


def test_the_asked_count_passes_and_unset_checks_nothing():
    fake, calls = _lister(4)
    check_gpus(4, fake)
    check_gpus(None, fake)
    assert calls == ["GPU"]  # only the first call looked


def test_gpus_per_node_comes_from_the_machine_environment(tmp_path):
    base = ["--run-uri", f"file://{tmp_path}/r", "--synthetic"]
    assert load_config(base, env={}).gpus_per_node is None
    assert load_config(base, env={"TRAINSTACK_GPUS_PER_NODE": "8"}).gpus_per_node == 8
    assert load_config([*base, "--gpus-per-node", "2"], env={"TRAINSTACK_GPUS_PER_NODE": "8"}).gpus_per_node == 2


def test_the_trainer_fails_once_with_exit_78_before_training(tmp_path, monkeypatch):
    import tensorflow as tf

    from runfolder.storage import open_store
    from trainer.loop_attempt import train

    fake, _ = _lister(0)
    monkeypatch.setattr(tf.config, "list_physical_devices", fake)
    uri = f"file://{tmp_path}/run"
    out = io.StringIO()
    rc = train(load_config(["--run-uri", uri, "--synthetic", "--gpus-per-node", "1"], env={}), stream=out)
    assert rc == exits.UNUSABLE == 78
    printed = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e[layout.EVENT] for e in printed] == [layout.FAILED_EVENT]
    assert "asks for 1 GPU(s) per machine but TensorFlow sees 0" in printed[0]["reason"]
    assert printed[0]["devices"] == [] and printed[0]["expected_gpus"] == 1
    store = open_store(uri)
    stored = [json.loads(line) for line in store.get_bytes(layout.EVENTS_KEY).decode().splitlines()]
    assert stored == printed
    assert store.list(layout.CHECKPOINTS_PREFIX) == []
