"""The user's own model through a booting machine: `run.code` in the real archive, on the S3 emulator.

The archive is packed as `pulumi up` packs it (trainer/ and the example's folder as usercode/),
the machine fetches and checks it, installs the trainer's and the user's pinned requirements
once, and the fake `docker run` runs the real trainer with the unpacked folder as its
--code-dir (TRAINSTACK_CODE_DIR from the env file). The run ends COMPLETE with the user's model.
"""

from __future__ import annotations

import json
import shutil

import boto3
import pytest

from components.aws.code import archive_key, pack
from components.userdata import USER_CODE_DIR
from devtools.sandbox import settings_for
from tests.userdata.helpers import s3_keys

pytestmark = pytest.mark.slow


@pytest.fixture
def user_code_uri(s3_run, tmp_path) -> str:
    from tests.trainer.helpers import REPO

    folder = tmp_path / "my-project"
    shutil.copytree(REPO / "examples" / "image-cnn", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "requirements.txt").write_text("# pinned, as run.code requires\nrich==15.0.0\n")
    data = pack(user_code=folder)
    key = archive_key(data)
    boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"]).put_object(Bucket=s3_run.bucket, Key=key, Body=data)
    return f"s3://{s3_run.bucket}/{key}"


def test_user_model_from_the_archive_trains_to_complete(sandbox_factory, s3_run, user_code_uri):
    settings = settings_for(model="shapes.model:build", code="examples/image-cnn", steps=30, batchSize=16,
                            checkpointEverySteps=10)
    box = sandbox_factory(settings=settings, code_uri=user_code_uri)
    assert box.boot().wait(timeout=240) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert "COMPLETE" in objects and "FAILED" not in objects, sorted(objects)
    done = json.loads(objects["COMPLETE"])
    assert done["step"] == 30
    assert done["signature"]["inputs"] == {"image": {"dtype": "float32", "shape": [None, 32, 32, 1]}}
    # The container was told where the user's folder is, and it was mounted from the archive.
    env_files = [c["argv"] for c in box.calls("docker-env-file")]
    assert any(f"TRAINSTACK_CODE_DIR={USER_CODE_DIR}" in lines for lines in env_files), env_files
    # The requirement files were installed, once, into the host cache.
    installed = list(box.root.rglob("INSTALLED_BY_FAKE_PIP"))
    assert len(installed) == 1
    text = installed[0].read_text()
    assert "-r /opt/trainstack/code/trainer/requirements.txt" in text
    assert "-r /opt/trainstack/code/trainer/requirements-gpu.txt" in text  # the CUDA/cuDNN wheels TF 2.21 needs
    assert "-r /opt/trainstack/code/usercode/requirements.txt" in text
    # The container finds the wheels' libraries first.
    run = next(a for a in box.argvs("docker") if a[0] == "run" and "trainer" in a)
    paths = [a.split("=", 1)[1] for a in run if a.startswith("LD_LIBRARY_PATH=")]
    assert len(paths) == 1 and paths[0].split(":")[:2] == ["/opt/trainstack/pip/nvidia/cublas/lib",
                                                           "/opt/trainstack/pip/nvidia/cudnn/lib"], run
    unpacked = [p for p in box.root.rglob("usercode/shapes/model.py")]
    assert len(unpacked) == 1


def test_a_machine_whose_tensorflow_sees_no_gpu_fails_at_once_with_the_reason(sandbox_factory, s3_run, group):
    # The real trainer, asked for 1 GPU, on a TensorFlow that sees none (this CPU): exit 78, and the
    # machine marks the run FAILED on the first try, with the trainer's reason, and scales to zero.
    from runfolder import layout
    from tests.userdata.helpers import group_size

    box = sandbox_factory(env_overrides={})
    box.env["FAKE_CHECK_GPUS"] = "1"
    assert box.boot().wait(timeout=240) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert "FAILED" in objects and "COMPLETE" not in objects, sorted(objects)
    marker = json.loads(objects["FAILED"])
    assert "exit 78" in marker[layout.MARKER_REASON] and "GPU" in marker[layout.MARKER_REASON], marker
    runs = [a for a in box.argvs("docker") if a[0] == "run" and "trainer" in a]
    assert len(runs) == 1  # no crash-loop retries on a machine that can never train
    assert group_size(s3_run, group) == (0, 0, 0)


@pytest.fixture
def fit_code_uri(s3_run, tmp_path) -> str:
    from tests.trainer.helpers import REPO

    folder = tmp_path / "my-fit-script"
    shutil.copytree(REPO / "examples" / "keras-fit", folder, ignore=shutil.ignore_patterns("__pycache__"))
    data = pack(user_code=folder)
    key = archive_key(data)
    boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"]).put_object(Bucket=s3_run.bucket, Key=key, Body=data)
    return f"s3://{s3_run.bucket}/{key}"


def test_a_fit_script_from_the_archive_trains_to_complete(sandbox_factory, s3_run, fit_code_uri, tmp_path):
    # Script mode on a machine: run.command reaches the container's trainer, which runs the seed
    # article's script (examples/keras-fit) in a writable copy of the unpacked folder on the data
    # disk, where it writes ./logs/args.txt and ./history.csv; its fit.output_dir() becomes outputs/, its
    # model model/, a SavedModel that serves, and `ops status` shows the run's accuracy.
    command = ["python", "train.py", "--epochs", "2", "--examples", "3200"]
    settings = settings_for(code="examples/keras-fit", command=command, synthetic=False)
    box = sandbox_factory(settings=settings, code_uri=fit_code_uri)
    assert box.boot().wait(timeout=300) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert "COMPLETE" in objects and "FAILED" not in objects, sorted(objects)
    done = json.loads(objects["COMPLETE"])
    assert done["step"] == 2 * 50 and "accuracy" in done["metrics"], done
    assert done["signature"]["endpoint"] == "serve"
    assert any(k.startswith("model/") for k in objects) and any(k.startswith("tensorboard/") for k in objects)
    assert objects["outputs/report.txt"].startswith(b"epochs: 2\n"), sorted(objects)
    # The unpacked code folder (mounted read-only in the container) was never written; the copy was.
    unpacked = [p.parent for p in box.root.rglob("usercode/train.py")]
    assert len(unpacked) == 1 and not (unpacked[0] / "logs").exists() and not (unpacked[0] / "history.csv").exists()
    assert [p.read_text()[:12] for p in box.root.rglob("work/code/logs/args.txt")] == ["{'epochs': 2"]
    assert len(list(box.root.rglob("work/code/history.csv"))) == 1
    env_files = [c["argv"] for c in box.calls("docker-env-file")]
    assert any(f"TRAINSTACK_COMMAND={json.dumps(command)}" in lines for lines in env_files), env_files

    import numpy as np
    import tensorflow as tf

    model_dir = tmp_path / "model"
    for key, data in objects.items():
        if key.startswith("model/"):
            (model_dir / key[len("model/"):]).parent.mkdir(parents=True, exist_ok=True)
            (model_dir / key[len("model/"):]).write_bytes(data)
    served = tf.saved_model.load(str(model_dir))  # held: its functions need the loaded object alive
    probs = served.serve(np.random.default_rng(1).random((4, 784), dtype=np.float32))
    assert probs.shape == (4, 10)
    np.testing.assert_allclose(probs.numpy().sum(axis=1), 1.0, rtol=1e-4)  # the script's softmax

    import io

    from rich.console import Console

    from ops import status

    st = status.read_status(s3_run.uri)
    out = io.StringIO()
    Console(file=out, width=160).print(status.render(st))
    assert st.state == "COMPLETE" and f"accuracy {done['metrics']['accuracy']:.4g}" in out.getvalue(), out.getvalue()


def test_a_fit_script_stopped_by_a_spot_notice_resumes_on_the_next_boot_at_its_step(sandbox_factory, s3_run, group,
                                                                                    metadata, fit_code_uri):
    # The machine's path for a notice in script mode: the watcher stops the container, the trainer
    # forwards SIGTERM to the script, which commits its step and exits 143 within the notice; the
    # replacement boot resumes the script at that very step and ends COMPLETE.
    from tests.trainer.helpers import REPO
    from tests.userdata.helpers import events, group_size, machine_events, wait_for

    # The script holds after its first epoch until the stop signal (tests/userdata/held_fit), so the
    # notice lands mid-run at a known step however slowly this machine trains: 3 epochs leave 199
    # steps to train after the stop, where 20 were a margin for the notice to land in time.
    steps_per_epoch, epochs = 100, 3
    command = ["python", "train.py", "--epochs", str(epochs), "--examples", str(64 * steps_per_epoch),
               "--deterministic"]
    settings = settings_for(code="examples/keras-fit", command=command, synthetic=False)
    box = sandbox_factory(settings=settings, code_uri=fit_code_uri)
    box.env["FAKE_TRAINER_PATH"] = str(REPO / "tests" / "userdata" / "held_fit")
    box.boot()
    wait_for(lambda: (box.state / "trainer-held").exists(), 240, "the script held after its first epoch")
    assert (box.state / "trainer-held").read_text() == f"{steps_per_epoch}\n"
    wait_for(lambda: any(e["event"] == "checkpoint" for e in events(s3_run)), 60, "the first epoch's commit")
    metadata.notice_aws()
    wait_for(lambda: "exited with 143" in box.journal(), 90, "the trainer's exit 143")
    assert box.argvs("docker").count(["stop", "--time", "100", "trainstack-trainer"]) == 1
    env_files = [c["argv"] for c in box.calls("docker-env-file")]
    assert any("TRAINSTACK_STOP_GRACE_S=90" in lines for lines in env_files), env_files  # the notice less 10 s
    preempted = [e for e in events(s3_run) if e["event"] == "preempted"]
    assert len(preempted) == 1 and preempted[0]["exit_code"] == 143, events(s3_run)
    stopped_at = preempted[0]["step"]
    assert steps_per_epoch < stopped_at < epochs * steps_per_epoch  # after the held step, before the end
    notice = wait_for(lambda: next((e for e in machine_events(s3_run) if e["event"] == "spot_notice"), None), 60,
                      "the spot_notice event")
    assert notice["grace_s"] == 100 and notice["stop_s"] < 90, notice  # stopped within the script's grace

    box.power_off()
    metadata.instance_action = None  # the replacement machine: no notice
    del box.env["FAKE_TRAINER_PATH"]  # the script as it is, not held
    assert box.boot().wait(timeout=300) == 0, box.journal()
    resumed = [e for e in events(s3_run) if e["event"] == "resumed"]
    assert [e["step"] for e in resumed] == [stopped_at], resumed
    assert (resumed[0]["epoch"], resumed[0]["batch"]) == divmod(stopped_at, steps_per_epoch)
    done = json.loads(s3_keys(s3_run)["COMPLETE"])
    assert done["step"] == epochs * steps_per_epoch and done["attempts"] == 2 and "accuracy" in done["metrics"], done
    assert group_size(s3_run, group) == (0, 0, 0)
