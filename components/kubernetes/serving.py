"""Serving a COMPLETE run's model with `tensorflow/serving`: the checks before, the versioned copy, the manifests.

`ops serve` (not `pulumi up`: the model exists only when the run is COMPLETE, hours after the stack is up)
1. refuses a model that TF Serving would not load, each in one line: a `.keras` file (not a SavedModel), or a
   SavedModel written by another TensorFlow minor version than the serving image;
2. publishes a versioned copy `<run>/serving/<version>/...` of `model/` (TF Serving loads `<base>/<version>/
   saved_model.pb`, the highest version number; the run folder keeps `model/` as it is);
3. applies the Deployment and Service below in the run's namespace, whose NetworkPolicy admits ingress from
   inside the namespace only.

The TensorFlow version a SavedModel was written by is its MetaInfoDef's `tensorflow_version` (what
`saved_model_cli show` reports), read with protobuf from the three fields on the way to it: `ops` does not
import TensorFlow.
"""

from __future__ import annotations

import json
import re
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from components.kubernetes.manifests import labels
from components.settings.errors import ConfigError

SERVING_REPOSITORY = "tensorflow/serving"
SERVING_NAME = "serving"
REST_PORT = 8501
GRPC_PORT = 8500
MODEL_NAME = "model"  # the URL's model: POST /v1/models/model:predict
VERSIONS_PREFIX = "serving/"  # the versioned copies, beside model/ in the run folder


def _saved_model_class():
    """SavedModel, MetaGraphDef and MetaInfoDef reduced to the path to `tensorflow_version` (field numbers as in
    tensorflow/core/protobuf/saved_model.proto and meta_graph.proto); the other fields parse as unknown."""
    f = descriptor_pb2.FileDescriptorProto(name="trainstack_saved_model_version.proto", package="trainstack",
                                           syntax="proto3")
    optional, repeated = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    string, message = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    info = f.message_type.add(name="MetaInfoDef")
    info.field.add(name="tags", number=4, label=repeated, type=string)
    info.field.add(name="tensorflow_version", number=5, label=optional, type=string)
    graph = f.message_type.add(name="MetaGraphDef")
    graph.field.add(name="meta_info_def", number=1, label=optional, type=message, type_name=".trainstack.MetaInfoDef")
    saved = f.message_type.add(name="SavedModel")
    saved.field.add(name="meta_graphs", number=2, label=repeated, type=message, type_name=".trainstack.MetaGraphDef")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("trainstack.SavedModel"))


_SAVED_MODEL = _saved_model_class()


def saved_model_tf_version(saved_model_pb: bytes) -> str:
    """The TensorFlow version that wrote a saved_model.pb (its serving meta graph's MetaInfoDef)."""
    saved = _SAVED_MODEL()
    saved.ParseFromString(saved_model_pb)
    versions = [g.meta_info_def.tensorflow_version for g in saved.meta_graphs if g.meta_info_def.tensorflow_version]
    if not versions:
        raise ConfigError("serve", "the run's model/saved_model.pb records no TensorFlow version; export it with "
                          "model.export (a SavedModel) and rerun")
    return versions[0]


def minor(version: str) -> str:
    """2.21.0 -> 2.21 (a nightly's 2.22.0-dev2026 -> 2.22)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"not a TensorFlow version: {version!r}")
    return f"{m.group(1)}.{m.group(2)}"


def check_model(model_files: list[str], saved_model_pb: bytes | None, serving_version: str) -> str:
    """The version of a model TF Serving `serving_version` can load; else one line naming what is wrong.
    `model_files` are the names under the run's model/ folder."""
    keras_files = [n for n in model_files if n.endswith((".keras", ".h5"))]
    if saved_model_pb is None:
        what = f"{keras_files[0]} is a Keras file, not a SavedModel" if keras_files else "there is no saved_model.pb"
        raise ConfigError("serve", f"the run's model/: {what}; tensorflow/serving loads a SavedModel only: "
                          "export it with model.export(fit.model_dir())")
    trained = saved_model_tf_version(saved_model_pb)
    if minor(trained) != minor(serving_version):
        raise ConfigError("serve", f"the model was written by TensorFlow {trained} and the serving image is "
                          f"tensorflow/serving {serving_version}: serve it with the training's minor version "
                          f"{minor(trained)} (image.tag)")
    return trained


def serving_tag(tf_version: str) -> str:
    """The tensorflow/serving tag of a TensorFlow version (they are released together: 2.19.0 -> 2.19.0)."""
    return re.match(r"\d+\.\d+\.\d+", tf_version).group(0)


def serving_image(tf_version: str) -> str:
    """`tensorflow/serving` of the training's version, pinned by the digest its tag has now (the registry's
    answer through `registry.DIGEST_SOURCE`, as the Job's image is pinned); one line naming the tag if none."""
    from components import registry

    tag = serving_tag(tf_version)
    try:
        digest = registry.DIGEST_SOURCE.get()(SERVING_REPOSITORY, tag)
    except registry.RegistryError as e:
        raise ConfigError("serve", f"cannot resolve {SERVING_REPOSITORY}:{tag} to a digest: {e}") from e
    if not registry.DIGEST_RE.fullmatch(digest):
        raise ConfigError("serve", f"{SERVING_REPOSITORY}:{tag} resolved to {digest!r}, not a sha256 digest")
    return f"{SERVING_REPOSITORY}@{digest}"


# The pod template's record of the version published last (a change of it rolls the serving pods).
VERSION_ANNOTATION = "trainstack.dev/serving-version"
# Where a run on S3's versions are copied for the server (an emptyDir of the serving pod).
LOCAL_MODELS = "/models"
LOCAL_BASE_PATH = f"{LOCAL_MODELS}/{MODEL_NAME}"


def publish(store, version: int) -> list[str]:
    """Copy the run's model/ to serving/<version>/ (what TF Serving loads as version `version`); the keys
    written. A copy already there is written afresh: a half copy from a stopped `ops serve` is never served."""
    from runfolder import layout

    dest = f"{VERSIONS_PREFIX}{version}/"
    store.delete_prefix(dest)
    written = []
    for key in store.list(layout.MODEL_PREFIX):
        to = dest + key[len(layout.MODEL_PREFIX):]
        store.put_bytes(to, store.get_bytes(key))
        written.append(to)
    return written


def prepare(store, *, serving_version: str | None = None) -> tuple[str, int, list[str]]:
    """What `ops serve` does in the run folder before the cluster: refuse a run that is not COMPLETE or a model
    TF Serving `serving_version` (default: the training's own) would not load, then publish the next version.
    Returns (the training's TensorFlow version, the version published, the keys written)."""
    from runfolder import layout
    from runfolder.storage import NotFound

    try:
        store.get_bytes(layout.COMPLETE)
    except NotFound:
        raise ConfigError("serve", "the run is not COMPLETE: tensorflow/serving serves a finished run's model; "
                          "run ops serve again once ops status says COMPLETE") from None
    files = [k[len(layout.MODEL_PREFIX):] for k in store.list(layout.MODEL_PREFIX)]
    pb = store.get_bytes(layout.MODEL_PREFIX + "saved_model.pb") if "saved_model.pb" in files else None
    trained = check_model(files, pb, serving_version or (saved_model_tf_version(pb) if pb else "0.0"))
    published = {k[len(VERSIONS_PREFIX):].split("/", 1)[0] for k in store.list(VERSIONS_PREFIX)}
    version = 1 + max((int(v) for v in published if v.isdigit()), default=0)
    return trained, version, publish(store, version)


def serving_labels(run_id: str) -> dict[str, str]:
    """The serving pods' labels: the run's, with their own component (the Job's headless Service does not
    select them, and this Service selects no trainer)."""
    return {**labels(run_id), "app.kubernetes.io/component": SERVING_NAME}


def deployment(ns: str, run_id: str, *, image: str, base_path: str, replicas: int, cpu: str,
               memory: str, fetch_image: str | None = None, version: int | None = None) -> dict[str, Any]:
    """tensorflow/serving of the run's versioned copies at `base_path` (the store's serving/ folder), as the
    trainer's ServiceAccount (which may read the run's prefix).

    `fetch_image` (the trainer's image, for a run on S3, which tensorflow/serving cannot read since 2.7): an init
    container of it copies the versions into an emptyDir (`python -m trainer.serving_fetch`), and the server
    loads them from there. `version` (the one just published) is the pod template's annotation: a new one rolls
    the pods, whose init container copies it (a server reading the store itself finds it by its own polling)."""
    resources = {"cpu": cpu, "memory": memory}
    selector = serving_labels(run_id)
    security = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    mounts = [{"name": "scratch", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [{"name": "scratch", "emptyDir": {}}]
    init: list[dict[str, Any]] = []
    if fetch_image is not None:
        volumes.append({"name": "models", "emptyDir": {}})
        init.append({"name": "fetch", "image": fetch_image, "imagePullPolicy": "IfNotPresent",
                     "command": ["python", "-m", "trainer.serving_fetch", base_path, LOCAL_BASE_PATH],
                     "env": [{"name": "HOME", "value": "/tmp"}],
                     "resources": {"requests": resources, "limits": resources}, "securityContext": security,
                     "volumeMounts": [*mounts, {"name": "models", "mountPath": LOCAL_MODELS}]})
        mounts = [*mounts, {"name": "models", "mountPath": LOCAL_MODELS, "readOnly": True}]
        base_path = LOCAL_BASE_PATH
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": SERVING_NAME, "namespace": ns, "labels": selector},
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": {
                "metadata": {"labels": selector,
                             **({"annotations": {VERSION_ANNOTATION: str(version)}} if version is not None else {})},
                "spec": {
                    "serviceAccountName": "trainstack",
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": SERVING_NAME,
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": [f"--model_name={MODEL_NAME}", f"--model_base_path={base_path}",
                                 f"--port={GRPC_PORT}", f"--rest_api_port={REST_PORT}"],
                        "ports": [{"name": "rest", "containerPort": REST_PORT, "protocol": "TCP"},
                                  {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": f"/v1/models/{MODEL_NAME}", "port": "rest"},
                                           "periodSeconds": 10},
                        "resources": {"requests": resources, "limits": resources},
                        "securityContext": security,
                        "volumeMounts": mounts,
                    }],
                    **({"initContainers": init} if init else {}),
                    "volumes": volumes,
                }}}}


def service(ns: str, run_id: str) -> dict[str, Any]:
    """A ClusterIP Service (never a LoadBalancer: the ResourceQuota allows none) in front of the serving pods."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SERVING_NAME, "namespace": ns, "labels": serving_labels(run_id)},
            "spec": {"type": "ClusterIP", "selector": serving_labels(run_id),
                     "ports": [{"name": "rest", "port": REST_PORT, "targetPort": "rest", "protocol": "TCP"},
                               {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}]}}


def network_policy(ns: str, run_id: str) -> dict[str, Any]:
    """The serving pods take requests from pods of their own namespace only (the run's default-deny policy
    still governs their egress: DNS and HTTPS to the store)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": SERVING_NAME, "namespace": ns, "labels": serving_labels(run_id)},
            "spec": {"podSelector": {"matchLabels": serving_labels(run_id)}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {}}],
                                  "ports": [{"protocol": "TCP", "port": REST_PORT},
                                            {"protocol": "TCP", "port": GRPC_PORT}]}]}}


def rest_request(instances: list[dict[str, Any]]) -> str:
    """The body of `POST /v1/models/model:predict` (TF Serving's REST API, row format)."""
    return json.dumps({"signature_name": "serving_default", "instances": instances})


def check_request(body: str, signature: dict) -> None:
    """Refuse a REST body that does not fit the signature COMPLETE records (names, and each instance's shape
    without its batch dimension), in one line."""
    instances = json.loads(body)["instances"]
    inputs = signature["inputs"]
    for i, inst in enumerate(instances):
        if set(inst) != set(inputs):
            raise ValueError(f"instances[{i}]: inputs {sorted(inst)}; the signature takes {sorted(inputs)}")
        for name, spec in inputs.items():
            want = spec["shape"][1:]
            got = _shape(inst[name])
            if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got, strict=True)):
                raise ValueError(f"instances[{i}].{name}: shape {got}; the signature takes {want} per instance")


def _shape(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        value = value[0] if value else None
    return shape
