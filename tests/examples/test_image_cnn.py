"""The worked example `examples/image-cnn`: a user's own model and TFRecords, trained as a user would.

Records written from numpy arrays by the example's own script, trained with `--code-dir`,
stopped by SIGTERM half way, resumed to COMPLETE with its validation accuracy in COMPLETE, TensorBoard
and `ops status`, and the exported SavedModel serves a prediction.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.trainer.helpers import REPO, Trainer, kinds, run_trainer, trainer_env

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "image-cnn"
MODEL = ["--code-dir", str(EXAMPLE), "--model", "shapes.model:build"]


def _args(data_dir, steps: int) -> list[str]:
    return [*MODEL, "--data-uri", f"file://{data_dir}/train", "--validation-data-uri", f"file://{data_dir}/validation",
            "--eval-every-steps", "20", "--steps", str(steps), "--batch-size", "32",
            "--checkpoint-every-steps", "25", "--log-every", "5", "--seed", "3"]


def _write_records(*argv: str) -> int:
    """The example's writer, its `main` as `python write_tfrecords.py ARGV` runs it, in this process:
    TensorFlow is loaded here anyway, where a process of its own would load it again (~5 s of CPU).
    The script puts its folder first on sys.path for `shapes`: both are put back after."""
    import importlib.util

    path, modules = list(sys.path), set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location("write_tfrecords", EXAMPLE / "write_tfrecords.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        return script.main(list(argv))
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            if name == "write_tfrecords" or name.split(".")[0] == "shapes":
                del sys.modules[name]


def test_example_records_train_stop_resume_complete_and_serve(tmp_path):
    data = tmp_path / "data"
    assert _write_records(str(data), "--examples", "2000", "--shards", "3") == 0
    assert sorted(p.name for p in (data / "train").iterdir()) == [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]
    # A tenth held back: the validation records, apart from the training ones.
    assert sorted(p.name for p in (data / "validation").iterdir()) == ["validation-00000-of-00001.tfrecord"]

    uri = f"file://{tmp_path / 'run'}"
    t = Trainer(uri, *_args(data, 100000))
    t.wait_event("checkpoint", pred=lambda e: e["step"] >= 25)
    t.signal(signal.SIGTERM)
    assert t.wait() == 143, t.stderr[-3000:]
    stopped = t.events[-1]["step"]
    assert t.events[-1]["event"] == "preempted" and stopped >= 25

    rc, events, err = run_trainer(uri, *_args(data, stopped + 40))
    assert rc == 0, err[-3000:]
    assert [e["step"] for e in events if e["event"] == "resumed"] == [stopped], kinds(events)
    assert events[-1]["event"] == "finished" and events[-1]["step"] == stopped + 40
    done = json.loads((tmp_path / "run" / "COMPLETE").read_text())
    assert done["attempts"] == 2 and done["examples_seen"] == (stopped + 40) * 32
    # Validation accuracy on the 200 held-back records, at the end and every 20 steps.
    evals = [e for e in events if e["event"] == "evaluated"]
    assert evals and all(e["examples"] == 200 for e in evals) and evals[-1]["step"] == stopped + 40
    assert done["metrics"]["val_accuracy"] == evals[-1]["metrics"]["val_accuracy"]
    assert done["metrics"]["val_accuracy"] > 0.25, done["metrics"]  # better than chance (4 classes)
    assert 0.0 <= done["metrics"]["accuracy"] <= 1.0
    # The same evaluations in TensorBoard, beside the training curves, and in `ops status`.
    from bench.run_all import tensorboard_scalars

    board = str(tmp_path / "run" / "tensorboard")
    val = dict(tensorboard_scalars(board, "validation/accuracy"))
    assert {e["step"]: val.get(e["step"]) for e in evals} == pytest.approx(
        {e["step"]: e["metrics"]["val_accuracy"] for e in evals})
    assert {e["step"] for e in evals} <= {s for s, _ in tensorboard_scalars(board, "validation/loss")}
    train_acc = tensorboard_scalars(board, "train/accuracy")
    assert train_acc and all(0.0 <= v <= 1.0 for _, v in train_acc) and max(s for s, _ in train_acc) == stopped + 40
    _assert_status_shows(uri, done)
    # COMPLETE says how to call the model: the SavedModel's own signature.
    assert done["signature"]["endpoint"] == "serve"
    assert done["signature"]["inputs"] == {"image": {"dtype": "float32", "shape": [None, 32, 32, 1]}}
    assert [o["shape"] for o in done["signature"]["outputs"].values()] == [[None, 4]]

    # The SavedModel answers on its own: no trainstack and no example code on the path.
    probe = (
        "import sys, numpy as np, tensorflow as tf\n"
        "m = tf.saved_model.load(sys.argv[1])\n"
        "x = np.load(sys.argv[2])\n"
        "print(np.asarray(m.serve(tf.constant(x))).tolist())\n"
    )
    images = tmp_path / "images.npy"
    sys.path.insert(0, str(EXAMPLE))
    try:
        from shapes.data import make_images
    finally:
        sys.path.remove(str(EXAMPLE))
    x, _ = make_images(4, seed=99)
    np.save(images, x.astype(np.float32) / 255.0)
    env = {k: v for k, v in trainer_env().items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run" / "model"), str(images)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    probs = np.array(json.loads(out.stdout.strip().splitlines()[-1]))
    assert probs.shape == (4, 4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)


def _assert_status_shows(uri: str, done: dict) -> None:
    import io

    from rich.console import Console

    from ops import status

    st = status.read_status(uri)
    assert st.state == "COMPLETE" and st.metrics["val_accuracy"] == done["metrics"]["val_accuracy"], st
    out = io.StringIO()
    Console(file=out, width=160).print(status.render(st))
    text = out.getvalue()
    assert f"val_accuracy {done['metrics']['val_accuracy']:.4g}" in text, text
    assert f"accuracy {done['metrics']['accuracy']:.4g}" in text, text


def test_missing_code_dir_is_one_line_naming_the_flag(tmp_path):
    rc, _, err = run_trainer(f"file://{tmp_path / 'run'}", "--code-dir", str(tmp_path / "nope"),
                             "--model", "shapes.model:build", "--synthetic")
    assert rc == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "--code-dir" in lines[0] and "no such folder" in lines[0], err
    assert not (tmp_path / "run").exists()


def test_model_not_in_code_dir_names_the_folder(tmp_path):
    rc, events, err = run_trainer(f"file://{tmp_path / 'run'}", "--code-dir", str(tmp_path),
                                  "--model", "shapes.model:build", "--synthetic", "--steps", "5")
    assert rc == 1
    failed = [e for e in events if e["event"] == "failed"]
    assert failed and f"in --code-dir {tmp_path}" in failed[0]["reason"], events
