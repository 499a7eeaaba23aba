"""Serving a COMPLETE run's model (components/kubernetes/serving.py, components/settings/serve.py): the
Deployment, Service and NetworkPolicy pass the API's schemas strict at every supported version; a `.keras`
model and a SavedModel of another TensorFlow minor version are refused in one line; the versioned copy is what
TF Serving loads; the documented REST request fits the signature of a SavedModel the trainer's export writes."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from components.kubernetes import manifests, serving
from components.settings import ConfigError, load_settings

NS, RUN = "trainstack-r1", "r1"


def _objects():
    return [serving.deployment(NS, RUN, image="tensorflow/serving@sha256:" + "a" * 64,
                               base_path="gs://bucket/runs/r1/serving", replicas=2, cpu="1", memory="2Gi"),
            serving.service(NS, RUN), serving.network_policy(NS, RUN),
            serving.deployment(NS, RUN, image="tensorflow/serving@sha256:" + "a" * 64,
                               base_path="s3://bucket/runs/r1/serving", replicas=1, cpu="1", memory="2Gi",
                               fetch_image="trainer@sha256:" + "c" * 64, version=3)]


def test_the_serving_objects_pass_the_api_schemas_strict_at_every_supported_version():
    checked = []
    for version in manifests.SUPPORTED_VERSIONS:
        for o in _objects():
            kubernetes_validate.validate(o, version, strict=True)
            checked.append((version, o["kind"]))
    assert len(checked) == 4 * len(manifests.SUPPORTED_VERSIONS)
    bad = _objects()[0]
    bad["spec"]["template"]["spec"]["containers"][0]["port"] = 8501  # misspelt: strict says no
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, manifests.SUPPORTED_VERSIONS[0], strict=True)


def test_serving_takes_requests_from_its_own_namespace_only_and_selects_no_trainer():
    deployment, service, policy, _ = _objects()
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {}}], "ports": [
        {"protocol": "TCP", "port": serving.REST_PORT}, {"protocol": "TCP", "port": serving.GRPC_PORT}]}]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "serving"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"] != manifests.labels(RUN)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--model_base_path=gs://bucket/runs/r1/serving" in args


def test_a_run_on_s3_is_copied_by_the_trainers_image_for_the_server_to_load_from_its_own_volume():
    """tensorflow/serving has had no s3:// since 2.7: an init container of the trainer's image copies the
    versions into an emptyDir, which the server reads, read only."""
    plain, fetched = _objects()[0]["spec"]["template"]["spec"], _objects()[3]["spec"]["template"]["spec"]
    assert "initContainers" not in plain
    (init,) = fetched["initContainers"]
    assert init["image"] == "trainer@sha256:" + "c" * 64
    assert init["command"] == ["python", "-m", "trainer.serving_fetch", "s3://bucket/runs/r1/serving", "/models/model"]
    server = fetched["containers"][0]
    assert "--model_base_path=/models/model" in server["args"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in server["volumeMounts"]
    assert {"name": "models", "mountPath": "/models"} in init["volumeMounts"]
    assert init["securityContext"] == server["securityContext"] and init["resources"] == server["resources"]


def _pb(tf_version: str) -> bytes:
    saved = serving._SAVED_MODEL()
    saved.meta_graphs.add().meta_info_def.tensorflow_version = tf_version
    return saved.SerializeToString()


def test_a_keras_file_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        serving.check_model(["model.keras"], None, "2.21.0")
    assert str(e.value) == ("trainstack:serve: the run's model/: model.keras is a Keras file, not a SavedModel; "
                            "tensorflow/serving loads a SavedModel only: export it with model.export(fit.model_dir())")


def test_another_minor_version_is_refused_naming_both_and_a_patch_release_is_served():
    with pytest.raises(ConfigError) as e:
        serving.check_model(["saved_model.pb"], _pb("2.20.0"), "2.21.0")
    line = str(e.value)
    assert "\n" not in line and "TensorFlow 2.20.0" in line and "tensorflow/serving 2.21.0" in line
    assert serving.check_model(["saved_model.pb"], _pb("2.21.0"), "2.21.1") == "2.21.0"


def test_the_serving_image_is_the_training_version_pinned_by_digest():
    from components import registry

    asked = []

    def source(repository, tag):
        asked.append((repository, tag))
        return "sha256:" + "b" * 64 if tag == "2.21.0" else "latest"

    token = registry.DIGEST_SOURCE.set(source)
    try:
        assert serving.serving_image("2.21.0") == "tensorflow/serving@sha256:" + "b" * 64
        with pytest.raises(ConfigError) as e:
            serving.serving_image("2.20.1")
    finally:
        registry.DIGEST_SOURCE.reset(token)
    assert asked == [("tensorflow/serving", "2.21.0"), ("tensorflow/serving", "2.20.1")]
    assert "not a sha256 digest" in str(e.value) and "\n" not in str(e.value)


def test_the_versioned_copy_is_what_tf_serving_loads(tmp_path):
    from runfolder.storage import open_store

    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes("model/saved_model.pb", b"pb")
    store.put_bytes("model/variables/variables.index", b"ix")
    store.put_bytes("serving/3/stale", b"half")  # a stopped earlier copy
    assert sorted(serving.publish(store, 3)) == ["serving/3/saved_model.pb", "serving/3/variables/variables.index"]
    assert sorted(store.list("serving/")) == ["serving/3/saved_model.pb", "serving/3/variables/variables.index"]
    assert store.get_bytes("model/saved_model.pb") == store.get_bytes("serving/3/saved_model.pb") == b"pb"


def test_prepare_refuses_an_unfinished_run_and_a_keras_model_and_publishes_the_next_version(tmp_path):
    from runfolder.storage import open_store

    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes("model/model.keras", b"zip")
    with pytest.raises(ConfigError) as e:
        serving.prepare(store)
    assert "is not COMPLETE" in str(e.value)
    store.put_bytes("COMPLETE", b"{}")
    with pytest.raises(ConfigError) as e:
        serving.prepare(store)
    assert "model.keras is a Keras file, not a SavedModel" in str(e.value)
    store.delete_prefix("model/")
    store.put_bytes("model/saved_model.pb", _pb("2.21.0"))
    assert serving.prepare(store) == ("2.21.0", 1, ["serving/1/saved_model.pb"])
    assert serving.prepare(store)[1] == 2  # a later ops serve publishes the next version beside the first
    with pytest.raises(ConfigError) as e:
        serving.prepare(store, serving_version="2.20.0")
    assert "TensorFlow 2.21.0" in str(e.value) and "tensorflow/serving 2.20.0" in str(e.value)
    assert sorted(store.list("serving/")) == ["serving/1/saved_model.pb", "serving/2/saved_model.pb"]


def test_serving_without_a_cluster_is_refused_naming_the_key():
    raw = {"cloud": "aws", "region": "us-east-1", "run": {"synthetic": True}, "serve": {"enabled": True}}
    with pytest.raises(ConfigError) as e:
        load_settings(raw, stack="dev")
    assert str(e.value) == ("trainstack:serve.enabled: true: serving runs on the run's cluster, and scheduler is "
                            "groups; set scheduler: kubernetes or serve.enabled: false")
    s = load_settings({**raw, "serve": {"enabled": False, "replicas": 2}}, stack="dev")
    assert s.serve.replicas == 2
    with pytest.raises(ConfigError) as e:
        load_settings({**raw, "serve": {"replica": 2}}, stack="dev")
    assert "serve.replica" in str(e.value)


@pytest.mark.slow
def test_the_documented_request_fits_the_signature_of_an_exported_model(tmp_path):
    """A SavedModel the trainer's export writes: its recorded version is this TensorFlow's, and the REST body
    `ops` documents fits its serving_default signature as saved_model_cli shows it."""
    import keras
    import tensorflow as tf

    from runfolder.storage import open_store
    from trainer.export import SIGNATURE, export_model, saved_model_signature

    inputs = keras.Input(shape=(3,), name="features", dtype="float32")
    model = keras.Model(inputs, keras.layers.Dense(2, name="scores")(inputs))
    local = tmp_path / "export"
    export_model(model, str(local), open_store(f"file://{tmp_path}/run"))

    pb = (local / "saved_model.pb").read_bytes()
    assert serving.saved_model_tf_version(pb) == tf.__version__
    assert serving.check_model(["saved_model.pb"], pb, tf.__version__) == tf.__version__

    args, kwargs = tf.saved_model.load(str(local)).signatures[SIGNATURE].structured_input_signature
    assert args == ()
    (name, spec), = kwargs.items()
    signature = saved_model_signature(str(local))
    assert signature["inputs"] == {name: {"dtype": spec.dtype.name, "shape": [None, 3]}}
    body = serving.rest_request([{name: [1.0, 2.0, 3.0]}, {name: [0.0, 0.5, 1.0]}])
    serving.check_request(body, signature)
    assert json.loads(body)["instances"][0][name] == [1.0, 2.0, 3.0]
    for wrong in ([{name: [1.0, 2.0]}], [{"x": [1.0, 2.0, 3.0]}]):
        with pytest.raises(ValueError):
            serving.check_request(serving.rest_request(wrong), signature)
