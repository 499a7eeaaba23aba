"""`ops` against a Job stack's cluster (ops/kube.py), with the official Kubernetes client talking to a fake API
server on 127.0.0.1 (tests/ops/fake_kube_api.py) whose Job is run by the fake Job controller: stop suspends the
Job, or deletes it once the trainer has committed; logs are read through the API; status shows the Job's
conditions, its counted failures and the pods a disruption ended (not counted)."""

from __future__ import annotations

import pytest
import yaml

from components.kubernetes import manifests
from ops import kube
from tests.components.kubernetes.fake_controller import SIGTERM_EXIT, FakeJob, disrupted, failed_pod
from tests.ops.fake_kube_api import FakeKubeAPI

NS = "trainstack-r1"


def _job() -> FakeJob:
    return FakeJob(manifests.job(NS, "r1", name=kube.JOB_NAME, image="repo@sha256:" + "a" * 64, args=[], env={},
                                 nodes=1, gpus=1, cpu="4", memory="16Gi", spot_nodes="gke", node_affinity={},
                                 grace_seconds=15, deadline_seconds=3600, backoff_limit=3, ttl_seconds=60,
                                 service=None))


def _kubeconfig(api: FakeKubeAPI) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "other",
            "clusters": [{"name": "c", "cluster": {"server": api.url}}],
            "users": [{"name": "u", "user": {"token": api.token}}],
            "contexts": [{"name": "gpu", "context": {"cluster": "c", "user": "u"}},
                         {"name": "other", "context": {"cluster": "c", "user": "nobody"}}]}


@pytest.fixture
def api():
    with FakeKubeAPI(NS, _job()) as a:
        yield a


def _evict_twice_and_crash_once(api: FakeKubeAPI) -> list[str]:
    """Two spot terminations (the kubelet's and the eviction API's conditions) and one real crash."""
    job, names = api.job, []
    for reason in ("TerminationByKubelet", "EvictionByEvictionAPI"):
        pod = disrupted(job.pods[0], reason, {manifests.TRAINER_CONTAINER: SIGTERM_EXIT})
        assert job.pod_failed(pod) == "Ignore"
        api.ended.append(pod)
        names.append(pod.name)
    crash = failed_pod(job.pods[0].name, 0, {manifests.TRAINER_CONTAINER: 1})
    assert job.pod_failed(crash) == "Count"
    api.ended.append(crash)
    return [*names, crash.name, job.pods[0].name]


def test_status_shows_the_conditions_the_counted_failures_and_the_disruptions(api):
    pods = _evict_twice_and_crash_once(api)
    client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
    view = kube.job_view(client, NS)
    assert (view.active, view.failed, view.succeeded, view.suspended) == (1, 1, 0, False)
    assert view.disrupted == [(pods[0], "TerminationByKubelet"), (pods[1], "EvictionByEvictionAPI")]
    api.job.pod_succeeded(0)
    view = kube.job_view(client, NS)
    assert view.conditions == [("Complete", "", "")]
    lines = view.lines()
    assert lines[0] == ("job train: 0 active, 1 succeeded, 1 failed (counted), 2 ended by a disruption "
                        "(not counted)")
    assert f"  pod {pods[0]}: TerminationByKubelet" in lines
    # The pods were asked for by the label the Job controller sets, with a bound on every call.
    listed = [r for r in api.requests if r["path"].endswith("/pods")]
    assert listed and all(r["query"]["labelSelector"] == ["job-name=train"] for r in listed)


def test_stop_suspends_the_job_before_the_commit_and_deletes_it_after(api):
    client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
    assert kube.stop(client, NS, committed=False) == "suspended"
    patch = next(r for r in api.requests if r["method"] == "PATCH")
    assert patch["body"] == {"spec": {"suspend": True}}
    assert patch["path"] == f"/apis/batch/v1/namespaces/{NS}/jobs/train"
    view = kube.job_view(client, NS)
    assert view.suspended and view.active == 0 and api.deleted is None

    assert kube.stop(client, NS, committed=True) == "deleted"
    delete = next(r for r in api.requests if r["method"] == "DELETE")
    assert api.deleted is not None and delete["query"]["propagationPolicy"] == ["Background"]  # pods go too


def test_logs_are_each_pods_trainer_log_through_the_api_oldest_first(api):
    pods = _evict_twice_and_crash_once(api)
    for i, name in enumerate(pods):
        api.logs[(name, manifests.TRAINER_CONTAINER)] = f'{{"event": "attempt", "n": {i}}}\n'
    client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
    got = kube.logs(client, NS, tail_lines=50)
    assert got == [(name, f'{{"event": "attempt", "n": {i}}}\n') for i, name in enumerate(pods)]
    reads = [r for r in api.requests if r["path"].endswith("/log")]
    assert len(reads) == 4 and all(r["query"]["container"] == ["trainer"] and r["query"]["tailLines"] == ["50"]
                                   for r in reads)


def test_the_cluster_is_the_named_context_never_the_current_one(api, tmp_path, monkeypatch):
    """The kubeconfig's current context names a user the server refuses: only the named context gets in."""
    from kubernetes.client.exceptions import ApiException

    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(_kubeconfig(api)))
    with pytest.raises(ApiException) as e:
        kube.job_view(kube.api_client(kubeconfig=_kubeconfig(api)), NS)
    assert e.value.status == 401
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert kube.job_view(kube.api_client(context="gpu"), NS).active == 1
    with pytest.raises(ValueError):
        kube.api_client()


def test_serving_is_created_then_replaced_by_a_later_apply(api):
    from components.kubernetes import serving

    objects = [serving.deployment(NS, "r1", image="tensorflow/serving@sha256:" + "b" * 64,
                                  base_path="gs://b/runs/r1/serving", replicas=1, cpu="1", memory="2Gi"),
               serving.service(NS, "r1"), serving.network_policy(NS, "r1")]
    client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
    assert kube.apply(client, objects) == [("Deployment", "serving", "created"), ("Service", "serving", "created"),
                                           ("NetworkPolicy", "serving", "created")]
    objects[0]["spec"]["replicas"] = 3
    assert [d for _k, _n, d in kube.apply(client, objects)] == ["replaced"] * 3
    deployment = api.applied[(f"/apis/apps/v1/namespaces/{NS}/deployments", "serving")]
    assert deployment["spec"]["replicas"] == 3 and deployment == objects[0]


def test_serve_publishes_the_complete_runs_model_and_applies_the_pinned_image(tmp_path):
    from components import registry
    from components.kubernetes.stack import namespace_name
    from components.settings import ServeSettings
    from ops import synth
    from runfolder.storage import open_store
    from tests.components.kubernetes.test_serving import _pb

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    settings = settings.model_copy(update={"serve": ServeSettings(enabled=True, replicas=2)})
    uri = f"file://{tmp_path}/run"
    store = open_store(uri)
    store.put_bytes("COMPLETE", b"{}")
    store.put_bytes("model/saved_model.pb", _pb("2.21.0"))
    token = registry.DIGEST_SOURCE.set(lambda repo, tag: "sha256:" + "c" * 64)
    try:
        with FakeKubeAPI(namespace_name(settings), _job()) as fake:
            client = kube.api_client(kubeconfig=_kubeconfig(fake) | {"current-context": "gpu"})
            trained, version, done = kube.serve(settings, store, client, run_uri=uri)
    finally:
        registry.DIGEST_SOURCE.reset(token)
    assert (trained, version, [d for _k, _n, d in done]) == ("2.21.0", 1, ["created"] * 3)
    deployment = fake.applied[(f"/apis/apps/v1/namespaces/{namespace_name(settings)}/deployments", "serving")]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "tensorflow/serving@sha256:" + "c" * 64
    assert f"--model_base_path={uri}/serving" in pod["containers"][0]["args"]
    assert deployment["spec"]["replicas"] == 2
    assert store.list("serving/") == ["serving/1/saved_model.pb"]


@pytest.mark.parametrize("reach", ["context", "kubeconfigSecret"])
def test_ops_serve_serves_the_stacks_run_through_its_cluster(reach, tmp_path, monkeypatch, capsys):
    from components import registry
    from components.kubernetes.stack import namespace_name
    from ops import synth
    from ops.__main__ import main
    from runfolder.storage import open_store
    from tests.components.kubernetes.test_serving import _pb

    doc = yaml.safe_load((synth.STACKS_DIR / "Pulumi.eks.yaml").read_text())
    doc["config"]["trainstack:serve"] = {"enabled": True}
    if reach == "kubeconfigSecret":  # the kubeconfig as the pulumi CLI decrypts it; the file has no such context
        del doc["config"]["trainstack:kubernetes"]["context"]
        doc["config"]["trainstack:kubernetes"]["kubeconfigSecret"] = True
    (tmp_path / "Pulumi.eks.yaml").write_text(yaml.safe_dump(doc))
    settings = synth.load_source(tmp_path / "Pulumi.eks.yaml").settings
    uri = f"file://{tmp_path}/run"
    store = open_store(uri)
    store.put_bytes("COMPLETE", b"{}")
    store.put_bytes("model/saved_model.pb", _pb("2.21.0"))
    token = registry.DIGEST_SOURCE.set(lambda repo, tag: "sha256:" + "d" * 64)
    argv = ["serve", "--stack", "eks", "--run-uri", uri, "--stacks-dir", str(tmp_path)]
    try:
        with FakeKubeAPI(namespace_name(settings), _job()) as fake:
            config = _kubeconfig(fake)
            if reach == "context":
                config["contexts"][0]["name"] = settings.kubernetes.context
            else:
                from tests.ops.test_status import fake_pulumi

                fake_pulumi(tmp_path / "bin", config | {"current-context": "gpu"})
                monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
            (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
            monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
            assert main(argv) == 0
            store.delete_prefix("model/")
            store.put_bytes("model/model.keras", b"zip")
            assert main(argv) == 2
    finally:
        registry.DIGEST_SOURCE.reset(token)
    out, err = capsys.readouterr()
    assert out.strip() == (f"published {uri}/serving/1/ (TensorFlow 2.21.0); created Deployment/serving, "
                           "created Service/serving, created NetworkPolicy/serving")
    assert err.strip().startswith("ops serve: trainstack:serve: the run's model/: model.keras is a Keras file")
    assert len(fake.applied) == 3


def test_ops_stop_on_a_job_stack_suspends_before_the_commit_and_deletes_after(tmp_path):
    from components.kubernetes.stack import namespace_name
    from ops import synth
    from runfolder.storage import open_store

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    store = open_store(f"file://{tmp_path}/run")
    with FakeKubeAPI(namespace_name(settings), _job()) as fake:
        client = kube.api_client(kubeconfig=_kubeconfig(fake) | {"current-context": "gpu"})
        assert kube.stop_for_stack("eks", store, client=client) == "suspended"
        assert fake.job.manifest["spec"]["suspend"] is True and fake.deleted is None
        store.put_bytes("COMPLETE", b"{}")
        assert kube.stop_for_stack("eks", store, client=client) == "deleted"
        assert fake.deleted is not None
    # Another scheduler's stack, or the run folder alone, names no Job.
    assert kube.stop_for_stack("dev", store, client=object()) is None
    assert kube.stop_for_stack(None, store, client=object()) is None


def test_ops_status_on_a_job_stack_adds_the_jobs_lines_and_says_when_it_cannot_read_them():
    from components.kubernetes.stack import namespace_name
    from ops import synth

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    with FakeKubeAPI(namespace_name(settings), _job()) as fake:
        pods = _evict_twice_and_crash_once(fake)
        client = kube.api_client(kubeconfig=_kubeconfig(fake) | {"current-context": "gpu"})
        lines = kube.status_lines_for_stack("eks", client=client)
        refused = kube.status_lines_for_stack("eks", client=kube.api_client(kubeconfig=_kubeconfig(fake)))
    assert lines == ["job train: 1 active, 0 succeeded, 1 failed (counted), 2 ended by a disruption (not counted)",
                     f"  pod {pods[0]}: TerminationByKubelet", f"  pod {pods[1]}: EvictionByEvictionAPI"]
    assert len(refused) == 1 and refused[0].startswith("job train: not read: ApiException: (401)")
    assert kube.status_lines_for_stack("dev", client=object()) == []


def test_ops_logs_on_a_job_stack_reads_the_pods_through_the_api():
    from components.kubernetes.stack import namespace_name
    from ops import synth

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    with FakeKubeAPI(namespace_name(settings), _job()) as fake:
        name = fake.job.pods[0].name
        fake.logs[(name, "trainer")] = '{"event": "step", "step": 7}\n'
        client = kube.api_client(kubeconfig=_kubeconfig(fake) | {"current-context": "gpu"})
        assert kube.logs_for_stack("eks", tail_lines=10, client=client) == [(name, '{"event": "step", "step": 7}\n')]
    assert kube.logs_for_stack("dev", client=object()) is None


def _eks_cluster(fake: FakeKubeAPI, tmp_path, monkeypatch) -> None:
    """KUBECONFIG names the fake server under the eks stack's context; `pulumi stack output` gives a file run."""
    from ops import synth
    from tests.ops.test_status import fake_pulumi

    config = _kubeconfig(fake)
    config["contexts"][0]["name"] = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings.kubernetes.context
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    fake_pulumi(tmp_path / "bin", {"runUri": f"file://{tmp_path}/run", "groupName": ""})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")


@pytest.mark.parametrize("watch", [False, True], ids=["once", "watch"])
def test_ops_status_json_and_watch_on_a_job_stack_carry_the_job_and_no_group(watch, tmp_path, monkeypatch, capsys):
    import json

    from components.kubernetes.stack import namespace_name
    from ops import synth
    from ops.__main__ import main
    from runfolder.storage import open_store

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    open_store(f"file://{tmp_path}/run").put_bytes("COMPLETE", json.dumps({"step": 10}).encode())
    with FakeKubeAPI(namespace_name(settings), _job()) as fake:
        pods = _evict_twice_and_crash_once(fake)
        fake.job.pod_succeeded(0)
        _eks_cluster(fake, tmp_path, monkeypatch)
        assert main(["status", "--stack", "eks", "--json", *(["--watch", "--interval", "0.01"] if watch else [])]) == 0
        docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        monkeypatch.setenv("COLUMNS", "200")  # rich's table, unwrapped
        assert main(["status", "--stack", "eks"]) == 0
        text = capsys.readouterr().out
    assert len(docs) == 1 and docs[0]["state"] == "COMPLETE"
    assert docs[0]["kube_job"] == {
        "name": "train", "suspended": False, "active": 0, "succeeded": 1, "failed": 1,
        "conditions": [{"type": "Complete", "reason": "", "message": ""}],
        "disrupted": [{"pod": pods[0], "reason": "TerminationByKubelet"},
                      {"pod": pods[1], "reason": "EvictionByEvictionAPI"}]}
    assert docs[0]["group_note"] == "" and docs[0]["kube_note"] == ""  # a Job stack has no group to read
    assert "train: 0 active, 1 succeeded, 1 failed (counted), 2 ended by a disruption" in text
    assert f"pod {pods[0]}: TerminationByKubelet" in text and "group not read" not in text


def test_ops_status_json_says_in_one_field_why_the_job_was_not_read(tmp_path, monkeypatch, capsys):
    import json

    from ops.__main__ import main
    from runfolder.storage import open_store

    open_store(f"file://{tmp_path}/run").put_bytes("COMPLETE", b"{}")
    with FakeKubeAPI(NS, _job()) as fake:
        _eks_cluster(fake, tmp_path, monkeypatch)
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(_kubeconfig(fake)))  # the stack's context is gone
        assert main(["status", "--stack", "eks", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kube_job"] is None and doc["kube_note"].startswith("job train: not read: ConfigException")


def test_logs_follow_reconnects_a_dropped_stream_without_repeating_a_line_and_ends_with_the_pod(api):
    """Each followed read is served as the log stands and then closed, as a dropped stream is: the next connection
    skips what was written (a line cut in two comes whole, once); the pod's end ends the follow."""
    import io

    pod = api.job.pods[0].name
    key = (pod, manifests.TRAINER_CONTAINER)
    api.logs[key] = "a\nb\n"
    reads: list[bool] = []

    def on_log(name: str, container: str, follow: bool) -> None:
        reads.append(follow)
        n = sum(reads)
        if follow and n == 2:
            api.logs[key] += "c\npart"
        if follow and n == 3:
            api.logs[key] += "ial\n"
            ended = disrupted(api.job.pods[0], "TerminationByKubelet", {manifests.TRAINER_CONTAINER: SIGTERM_EXIT})
            api.job.pod_failed(ended)
            api.ended.append(ended)

    api.on_log = on_log
    out, sleeps = io.BytesIO(), []
    client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
    assert kube.follow(client, NS, out, sleep=sleeps.append) == "Failed (TerminationByKubelet)"
    assert out.getvalue() == b"a\nb\nc\npartial\n"
    assert reads == [True, True, True, False] and len(sleeps) == 2  # two reconnects, then the end read once
    follows = [r for r in api.requests
               if r["path"].endswith("/log") and r["query"].get("follow", [""])[0].lower() == "true"]
    assert all(r["query"]["container"] == ["trainer"] for r in follows)


def test_logs_follow_gives_up_on_a_stream_that_keeps_dropping_with_nothing_new(api):
    import io

    api.logs[(api.job.pods[0].name, manifests.TRAINER_CONTAINER)] = "a\n"
    out, sleeps = io.BytesIO(), []
    client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
    with pytest.raises(kube.FollowError, match=r"ended 3 times in a row with nothing new while the pod is Running"):
        kube.follow(client, NS, out, sleep=sleeps.append, reconnects=2)
    assert out.getvalue() == b"a\n" and len(sleeps) == 3  # after the first read, and after 2 with nothing new


def test_logs_follow_starts_at_the_last_lines_asked_for(api):
    import io

    pod = api.job.pods[0].name
    api.logs[(pod, manifests.TRAINER_CONTAINER)] = "1\n2\n3\n4\n"
    api.on_log = lambda name, container, follow: api.job.pod_succeeded(0) if follow else None
    out = io.BytesIO()
    client = kube.api_client(kubeconfig=_kubeconfig(api) | {"current-context": "gpu"})
    assert kube.follow(client, NS, out, tail_lines=2, pod=pod, sleep=lambda s: None) == "deleted"
    assert out.getvalue() == b"3\n4\n"


def test_ops_logs_follow_on_a_job_stack_streams_the_newest_pod_until_it_ends(tmp_path, monkeypatch, capsysbinary):
    from components.kubernetes.stack import namespace_name
    from ops import synth
    from ops.__main__ import main

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    with FakeKubeAPI(namespace_name(settings), _job()) as fake:
        _evict_twice_and_crash_once(fake)
        pod = fake.job.pods[0]
        fake.logs[(pod.name, "trainer")] = '{"event": "resumed", "step": 500}\n'

        def end(name: str, container: str, follow: bool) -> None:
            if follow and name == pod.name and fake.job.pods:
                fake.job.pod_succeeded(0)
                pod.phase = "Succeeded"
                fake.ended.append(pod)

        fake.on_log = end
        _eks_cluster(fake, tmp_path, monkeypatch)
        assert main(["logs", "--stack", "eks", "--follow"]) == 0
    out, err = capsysbinary.readouterr()
    assert out == b'{"event": "resumed", "step": 500}\n'
    assert err.decode().strip() == ("ops logs: the pod ended: Succeeded; a replacement's log: python -m ops logs "
                                    "--stack eks --follow")


def test_serve_of_a_run_on_s3_has_the_trainers_image_copy_it_for_the_server(tmp_path):
    """tensorflow/serving since 2.7 cannot read s3://: the stack's own trainer image, pinned, copies it."""
    from components import registry
    from components.kubernetes.stack import namespace_name
    from components.settings import ServeSettings
    from ops import synth
    from runfolder.storage import open_store
    from tests.components.kubernetes.test_serving import _pb

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    settings = settings.model_copy(update={"serve": ServeSettings(enabled=True)})
    store = open_store(f"file://{tmp_path}/run")  # stands in for the bucket
    store.put_bytes("COMPLETE", b"{}")
    store.put_bytes("model/saved_model.pb", _pb("2.21.0"))
    token = registry.DIGEST_SOURCE.set(lambda repo, tag: "sha256:" + "c" * 64)
    try:
        with FakeKubeAPI(namespace_name(settings), _job()) as fake:
            client = kube.api_client(kubeconfig=_kubeconfig(fake) | {"current-context": "gpu"})
            kube.serve(settings, store, client, run_uri="s3://b/runs/eks")
    finally:
        registry.DIGEST_SOURCE.reset(token)
    pod = fake.applied[(f"/apis/apps/v1/namespaces/{namespace_name(settings)}/deployments", "serving")]["spec"][
        "template"]["spec"]
    assert pod["initContainers"][0]["image"] == settings.image.reference and "@sha256:" in settings.image.reference
    assert pod["initContainers"][0]["command"][-2:] == ["s3://b/runs/eks/serving", "/models/model"]
    assert "--model_base_path=/models/model" in pod["containers"][0]["args"]
    # The version published is the template's annotation: the next `ops serve` rolls the pods, which copy it.
    template = fake.applied[(f"/apis/apps/v1/namespaces/{namespace_name(settings)}/deployments", "serving")][
        "spec"]["template"]
    assert template["metadata"]["annotations"] == {"trainstack.dev/serving-version": "1"}


@pytest.mark.parametrize("cluster", ["secret unread", "unreachable"])
def test_ops_stop_says_in_one_line_when_the_jobs_cluster_cannot_be_reached(cluster, tmp_path, monkeypatch, capsys):
    """The STOP request is written either way; the Job's side is one line (exit 2), never a traceback."""
    from ops import synth
    from ops.__main__ import main
    from runfolder.storage import open_store

    doc = yaml.safe_load((synth.STACKS_DIR / "Pulumi.eks.yaml").read_text())
    if cluster == "secret unread":
        del doc["config"]["trainstack:kubernetes"]["context"]
        doc["config"]["trainstack:kubernetes"]["kubeconfigSecret"] = True
    (tmp_path / "Pulumi.eks.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setattr("ops.synth.STACKS_DIR", tmp_path)
    uri = f"file://{tmp_path}/run"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `pulumi stack output` answers; `pulumi config get` fails as it does without the passphrase.
    (bin_dir / "pulumi").write_text('#!/bin/sh\nif [ "$1" = config ]; then echo "error: passphrase must be set" >&2; '
                                    f"exit 255; fi\necho '{{\"runUri\": \"{uri}\"}}'\n")
    (bin_dir / "pulumi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    with FakeKubeAPI(NS, _job()) as fake:
        config = _kubeconfig(fake)
        config["contexts"][0]["name"] = doc["config"]["trainstack:kubernetes"].get("context", "gpu")
        config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # nothing listens there
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    open_store(uri).put_bytes("events.jsonl", b"")
    assert main(["stop", "--stack", "eks"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ops stop: the STOP request is written, but the Job was not suspended: ")
    if cluster == "secret unread":
        assert "pulumi config get kubernetes:kubeconfig --stack eks failed: error: passphrase must be set" in err[0]


def test_ops_serve_says_in_one_line_when_the_cluster_does_not_answer(tmp_path, monkeypatch, capsys):
    from ops import synth
    from ops.__main__ import main

    doc = yaml.safe_load((synth.STACKS_DIR / "Pulumi.eks.yaml").read_text())
    doc["config"]["trainstack:serve"] = {"enabled": True}
    (tmp_path / "Pulumi.eks.yaml").write_text(yaml.safe_dump(doc))
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [{"name": "c", "cluster": {
        "server": "http://127.0.0.1:9"}}], "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": doc["config"]["trainstack:kubernetes"]["context"], "context": {"cluster": "c",
                                                                                            "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setattr(kube, "serve",  # what serve does last: apply, here to a port nothing listens on
                        lambda settings, store, client, run_uri: kube.apply(client, [{
                            "kind": "Service", "metadata": {"name": "serving", "namespace": "ns"}}]))
    assert main(["serve", "--stack", "eks", "--run-uri", f"file://{tmp_path}/run", "--stacks-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ops serve: the cluster did not answer: MaxRetryError")


def test_logs_follow_takes_the_chiefs_pod_of_several_workers():
    import io

    job = FakeJob(manifests.job(NS, "r1", name=kube.JOB_NAME, image="repo@sha256:" + "a" * 64, args=[], env={},
                                nodes=2, gpus=1, cpu="4", memory="16Gi", spot_nodes="gke", node_affinity={},
                                grace_seconds=15, deadline_seconds=3600, backoff_limit=3, ttl_seconds=60,
                                service="workers"))
    with FakeKubeAPI(NS, job) as fake:
        # The chief was evicted and replaced: its replacement is older than no one, yet it is the one followed.
        ended = disrupted(job.pods[0], "EvictionByEvictionAPI", {manifests.TRAINER_CONTAINER: SIGTERM_EXIT})
        job.pod_failed(ended)
        fake.ended.append(ended)
        chief, worker = job.pods[0].name, job.pods[1].name
        fake._order[worker], fake._order[chief] = 5, 1  # the worker's pod is the newest
        fake.logs[(chief, "trainer")], fake.logs[(worker, "trainer")] = "chief\n", "worker\n"
        fake.on_log = lambda name, container, follow: job.pod_succeeded(0) if follow and 0 in job.pods else None
        out = io.BytesIO()
        client = kube.api_client(kubeconfig=_kubeconfig(fake) | {"current-context": "gpu"})
        assert kube.follow(client, NS, out, sleep=lambda s: None) == "deleted"
    assert out.getvalue() == b"chief\n"


@pytest.mark.parametrize("trainer_marker", [False, True], ids=["none", "the trainer's"])
def test_ops_status_ends_the_run_timed_out_when_the_jobs_deadline_killed_its_pods(trainer_marker, tmp_path,
                                                                                 monkeypatch, capsys):
    """activeDeadlineSeconds kills the pods before the trainer can write a marker: `ops status` writes the
    run's TIMED_OUT from the Job's condition, as the groups' finish does; a marker already there stays."""
    import json

    from components.kubernetes.stack import namespace_name
    from ops import synth
    from ops.__main__ import main
    from runfolder.storage import open_store

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes("events.jsonl", (json.dumps({"event": "started", "time": "2026-12-01T00:00:00.000+00:00",
                                                 "attempt": 1, "config": {"steps": 100}}) + "\n").encode())
    if trainer_marker:
        store.put_bytes("FAILED", json.dumps({"reason": "the trainer's own"}).encode())
    with FakeKubeAPI(namespace_name(settings), _job()) as fake:
        fake.job.advance(3600)
        _eks_cluster(fake, tmp_path, monkeypatch)
        assert main(["status", "--stack", "eks", "--json", "--watch", "--interval", "0.01"]) == 1
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(docs) == 1  # the watch ended at once
    if trainer_marker:
        assert docs[0]["state"] == "FAILED" and not store.exists("TIMED_OUT")
    else:
        assert docs[0]["state"] == "TIMED_OUT" and docs[0]["kube_job"]["conditions"][0]["reason"] == "DeadlineExceeded"
        marker = json.loads(store.get_bytes("TIMED_OUT"))
        assert marker["reason"] == "the Job failed: DeadlineExceeded" and marker["job"]["name"] == "train"


def test_a_job_that_failed_otherwise_ends_the_run_failed_and_a_running_one_no_end():
    from runfolder import layout

    view = kube.JobView(conditions=[("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")])
    assert kube.end_of(view) == (layout.FAILED, "the Job failed: BackoffLimitExceeded - Job has reached the "
                                                "specified backoff limit")
    assert kube.end_of(kube.JobView(conditions=[("Suspended", "JobSuspended", "")])) is None
