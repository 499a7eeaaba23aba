"""The SavedModel upload and its signature, in this process (`trainer.export`).

A previous attempt may have left part of an upload in `model/`: the export starts that folder
afresh, uploads every file it wrote, and the signature COMPLETE records is the one the uploaded
model declares (names, dtypes, shapes). A small Keras model keeps it to a few seconds of CPU
once TensorFlow is imported.
"""

from __future__ import annotations

import os

import pytest

from runfolder import layout

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    import keras

    inputs = keras.Input(shape=(3,), name="features", dtype="float32")
    outputs = keras.layers.Dense(2, name="scores")(inputs)
    return keras.Model(inputs, outputs)


def test_export_replaces_a_partial_upload_and_uploads_every_file(model, tmp_path, capfd):
    from runfolder.storage import open_store
    from trainer.export import export_model

    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes(layout.MODEL_PREFIX + "stale/left-by-attempt-1", b"old")
    local = tmp_path / "export"
    (local / "old").mkdir(parents=True)  # a local folder left over is removed first
    (local / "old" / "junk").write_bytes(b"x")

    uploaded = export_model(model, str(local), store)

    # The trainer's stdout is its event stream (JSON lines): Keras's "Saved artifact at ..." stays off it.
    assert capfd.readouterr().out == ""
    written = sorted(os.path.relpath(os.path.join(d, f), local) for d, _, fs in os.walk(local) for f in fs)
    assert "saved_model.pb" in written and not any(w.startswith("old") for w in written)
    assert uploaded == len(written) > 1
    stored = sorted(k[len(layout.MODEL_PREFIX):] for k in store.list(layout.MODEL_PREFIX))
    assert stored == written
    assert store.get_bytes(layout.MODEL_PREFIX + "saved_model.pb") == (local / "saved_model.pb").read_bytes()


def test_the_signature_is_the_one_the_saved_model_declares(model, tmp_path):
    from runfolder.storage import open_store
    from trainer.export import SIGNATURE, export_model, saved_model_signature

    local = tmp_path / "export"
    export_model(model, str(local), open_store(f"file://{tmp_path}/run"))

    sig = saved_model_signature(str(local))

    (out_name,) = sig["outputs"]
    assert sig == {"endpoint": "serve", "signature": SIGNATURE,
                   "inputs": {"features": {"dtype": "float32", "shape": [None, 3]}},
                   "outputs": {out_name: {"dtype": "float32", "shape": [None, 2]}}}
