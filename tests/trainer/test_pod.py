"""trainer/pod.py: a Job's pod makes its TF_CONFIG from its completion index and the stack's worker list."""

import json
import os

import pytest

from runfolder import environment
from trainer import pod

WORKERS = "train-0.workers.ns.svc:2222,train-1.workers.ns.svc:2222,train-2.workers.ns.svc:2222"


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_index_is_its_own_worker_of_the_same_cluster(index):
    config = json.loads(pod.tf_config({environment.WORKERS: WORKERS, pod.COMPLETION_INDEX: str(index)}))
    assert config == {"cluster": {"worker": WORKERS.split(",")}, "task": {"type": "worker", "index": index}}


@pytest.mark.parametrize("env", [{}, {environment.WORKERS: "train-0.workers.ns.svc:2222", pod.COMPLETION_INDEX: "0"},
                                 {environment.WORKERS: WORKERS, "TF_CONFIG": '{"given": 1}'}])
def test_one_worker_or_a_given_tf_config_needs_none(env):
    assert pod.tf_config(env) is None


@pytest.mark.parametrize("index", ["", "3", "-1", "x"])
def test_an_index_outside_the_cluster_is_a_bad_configuration(index, monkeypatch, capsys):
    with pytest.raises(pod.PodError, match="JOB_COMPLETION_INDEX"):
        pod.tf_config({environment.WORKERS: WORKERS, pod.COMPLETION_INDEX: index})
    monkeypatch.setenv(environment.WORKERS, WORKERS)
    monkeypatch.setenv(pod.COMPLETION_INDEX, index)
    monkeypatch.setenv("TF_CONFIG", "")  # undone after the test: main sets it
    # Exit 2: the Job's podFailurePolicy fails the Job at once (components/kubernetes/manifests.py).
    assert pod.main(["--run-uri", "file:///nowhere"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_main_hands_the_trainer_its_tf_config(monkeypatch):
    import trainer.__main__ as trainer_main

    seen = []
    monkeypatch.setattr(trainer_main, "main", lambda argv: seen.append((argv, json.loads(os.environ["TF_CONFIG"]))) or 0)
    monkeypatch.setenv(environment.WORKERS, WORKERS)
    monkeypatch.setenv(pod.COMPLETION_INDEX, "1")
    monkeypatch.setenv("TF_CONFIG", "")  # undone after the test: main sets it
    assert pod.main(["--steps", "3"]) == 0
    assert seen == [(["--steps", "3"], {"cluster": {"worker": WORKERS.split(",")}, "task": {"type": "worker",
                                                                                            "index": 1}})]


def test_main_records_the_pod_in_its_own_event_object_before_the_trainer_runs(tmp_path, monkeypatch, capsys):
    import trainer.__main__ as trainer_main
    from runfolder import layout
    from runfolder.storage import open_store

    uri = f"file://{tmp_path}/run"
    key = layout.machine_events_key("train-0-00002")
    seen = []
    monkeypatch.setattr(trainer_main, "main", lambda argv: seen.append(open_store(uri).get_bytes(key)) or 0)
    for name, value in {environment.MACHINE_ID: "train-0-00002", environment.NODE_NAME: "ip-10-0-1-7",
                        environment.POD_NAMESPACE: "trainstack-eks", pod.COMPLETION_INDEX: "0",
                        environment.RUN_URI: uri}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(environment.WORKERS, raising=False)
    assert pod.main([]) == 0
    (line,) = seen[0].decode().splitlines()
    ev = json.loads(line)
    assert {k: v for k, v in ev.items() if k != "time"} == {
        "event": "pod", "instance": "train-0-00002", "node": "ip-10-0-1-7", "namespace": "trainstack-eks", "index": 0}
    # The flag names the run folder where it is given; a store that cannot be written is one line, and the
    # training goes on.
    seen.clear()
    assert pod.main(["--run-uri", "nowhere://x"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(seen) == 1  # the trainer ran
    assert len(err) == 1 and err[0].startswith("trainer: the pod's event was not written (")
