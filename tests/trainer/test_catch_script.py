"""Script mode's parent, in this process: what a user's command is told, what it leaves, how it ends.

`ScriptRun` runs here (no `python -m trainer` child), and the user's command is a small
Python stand-in that does what its plan says: messages as `trainer.fit` writes them, files
in the folders it is given, an exit code, a wait for the stop signal. The stop signal, the
run folder's STOP and a lost lease are stand-ins too, tripped when the command says it is
ready, so every ending is reached on purpose and in about a second. The end-to-end twins
(a real trainer process, real signals) are in test_script.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import json
import os
import signal
import sys
import textwrap
import time

import pytest

from runfolder import environment, exits, layout
from runfolder.storage import open_store
from trainer import script, script_child, script_folders
from trainer.config import load_config
from trainer.signals import StopRequest

# Each case takes a second or two; a loop that never ends (a planted bug) fails here, not in an hour.
pytestmark = pytest.mark.timeout(20)

PLAN = textwrap.dedent('''
    import json, os, signal, sys, time
    plan = json.loads(sys.argv[1])
    def send(msg):
        with open(os.environ["TRAINSTACK_MESSAGES_FILE"], "a") as out:
            out.write(json.dumps(msg) + "\\n")
    def where(name):
        for var in ("MODEL", "OUTPUT", "TENSORBOARD"):
            if name.startswith(var + "/"):
                return os.path.join(os.environ["TRAINSTACK_" + var + "_DIR"], name[len(var) + 1:])
        return name
    for name, text in plan.get("files", {}).items():
        path = where(name)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(text.replace("$CWD", os.getcwd()))
    for msg in plan.get("messages", []):
        send(msg)
    for line in plan.get("stderr", []):
        sys.stderr.write(line + "\\n")
    sys.stderr.flush()
    if plan.get("pdeathsig"):
        import ctypes
        got = ctypes.c_int()
        ctypes.CDLL("libc.so.6").prctl(2, ctypes.byref(got))  # PR_GET_PDEATHSIG
        with open(os.path.join(os.environ["TRAINSTACK_OUTPUT_DIR"], "pdeathsig"), "w") as f:
            f.write(str(got.value))
    # Wait (at most 10 s) until the parent has uploaded this file to the run folder.
    seen = plan.get("until_uploaded")
    if seen:
        deadline = time.monotonic() + 10
        while not os.path.exists(seen):
            if time.monotonic() > deadline:
                sys.exit(9)
            time.sleep(0.02)
    if plan.get("orphan"):
        # A process of its own that outlives it, holding its stderr open.
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(15)"])
    on_term = plan.get("on_term")
    if on_term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif on_term == "sigint":
        def interrupted(signum, frame):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        signal.signal(signal.SIGTERM, interrupted)
    elif on_term is not None:
        def stop(signum, frame):
            for msg in on_term:
                send(msg)
            os._exit(143)
        signal.signal(signal.SIGTERM, stop)
    if plan.get("ready"):
        open(os.environ["STANDIN_READY"], "w").close()
        time.sleep(plan.get("sleep", 10))
    if plan.get("kill_self"):
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(plan.get("exit", 0))
''')


@pytest.fixture(autouse=True)
def quick(monkeypatch, tmp_path):
    """A quick poll, a known environment, and the ready flag the stand-ins write."""
    monkeypatch.setattr(script, "POLL_S", 0.01)
    for k in list(os.environ):
        if k.startswith("TRAINSTACK_") or k in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("STANDIN_READY", str(tmp_path / "ready"))


@pytest.fixture
def code(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "plan.py").write_text(PLAN)
    return folder


def make_cfg(tmp_path, code, plan: dict | None = None, *flags: str, **changes):
    cfg = load_config(["--run-uri", f"file://{tmp_path}/run", "--code-dir", str(code),
                       "--work-dir", str(tmp_path / "work"), *flags, "--", "python", "plan.py",
                       json.dumps(plan or {})], env={})
    return dataclasses.replace(cfg, **changes) if changes else cfg


def printed(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]


def stored(tmp_path) -> list[dict]:
    path = tmp_path / "run" / layout.EVENTS_KEY
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


class Ready:
    """True once the command wrote its ready flag (it then waits for the stop signal)."""

    def __init__(self, tmp_path):
        self.flag = tmp_path / "ready"

    def __bool__(self) -> bool:
        return self.flag.exists()

    def __call__(self) -> bool:
        return bool(self)


class SignalWhenReady(StopRequest):
    """A SIGTERM that arrives once the command is ready."""

    def __init__(self, ready: Ready, name: str = "SIGTERM"):
        super().__init__()
        self.ready, self.name = ready, name

    @property
    def requested(self) -> bool:
        if not self.event.is_set() and self.ready:
            self.signal_name = self.name
            self.event.set()
        return self.event.is_set()


class StopKeyWhen:
    """The run folder's STOP, found once `when()` is true."""

    def __init__(self, when, reason: str | None = "enough"):
        self.when, self.reason = when, reason
        self.started = self.closed = False

    def start(self):
        self.started = True
        return self

    def close(self) -> None:
        self.closed = True

    @property
    def requested(self) -> bool:
        return bool(self.when())


def attempt(tmp_path, code, plan, *flags, stop=None, key=None, **changes):
    """(exit code, printed events, the run) of one in-process attempt."""
    stream = io.StringIO()
    run = script.ScriptRun(make_cfg(tmp_path, code, plan, *flags, **changes), stream=stream, stop=stop)
    if key is not None:
        run.stop_key = key
    rc = run.run()
    return rc, printed(stream), run


def new_run(tmp_path, code, plan=None, *flags, **changes):
    return script.ScriptRun(make_cfg(tmp_path, code, plan, *flags, **changes), stream=io.StringIO())


# -- who this process is in a cluster --


@pytest.mark.parametrize(("tf_config", "role"), [
    (None, (1, True)),
    ("not json", (1, True)),
    ({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}, (1, True)),
    ({"cluster": {"chief": ["c"], "worker": ["a", "b"]}, "task": {"type": "chief", "index": 0}}, (3, True)),
    ({"cluster": {"chief": ["c"], "worker": ["a", "b"]}, "task": {"type": "worker", "index": 0}}, (3, False)),
    ({"cluster": {"worker": ["a", "b"], "evaluator": ["e"]}, "task": {"type": "worker", "index": 0}}, (2, True)),
    ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": "0"}}, (2, True)),
    ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker"}}, (2, True)),
    ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 1}}, (2, False)),
    ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "evaluator", "index": 0}}, (2, False)),
    ({"cluster": {"worker": ["a", "b"]}}, (2, False)),
    ({"task": {"type": "worker", "index": 0}}, (1, True)),
    ({"cluster": {"worker": ["a"]}}, (1, True)),  # one machine is its own chief, whatever its task says
])
def test_the_chief_of_a_cluster_is_its_chief_task_else_worker_0(monkeypatch, tf_config, role):
    if tf_config is not None:
        monkeypatch.setenv("TF_CONFIG", tf_config if isinstance(tf_config, str) else json.dumps(tf_config))
    assert script.cluster_role() == role


# -- what the command is told --


def test_the_command_is_told_the_runs_folders_and_finds_the_trainer_first_on_its_path(tmp_path, code, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/theirs")
    monkeypatch.setenv(environment.COMMAND, '["python", "plan.py"]')
    monkeypatch.setenv(environment.CHECKPOINT_EVERY_SECONDS, "999")
    run = new_run(tmp_path, code, None, "--keep-checkpoints", "5", "--seed", "11", "--checkpoint-every-seconds", "2.5")
    env = run.child_env()
    work = str(tmp_path / "work")
    assert env["PYTHONPATH"] == os.pathsep.join([script.TRAINER_ROOT, os.path.join(work, "code"), "/theirs"])
    assert environment.COMMAND not in env  # the command is not told to run itself again
    assert {k: env[k] for k in (environment.RUN_URI, environment.CHECKPOINT_DIR, environment.TENSORBOARD_DIR,
                                environment.MODEL_DIR, environment.OUTPUT_DIR, environment.MESSAGES_FILE,
                                environment.ATTEMPT, environment.KEEP_CHECKPOINTS, environment.SEED,
                                environment.CHECKPOINT_EVERY_SECONDS)} == {
        environment.RUN_URI: f"file://{tmp_path}/run",
        environment.CHECKPOINT_DIR: os.path.join(work, "checkpoints"),
        environment.TENSORBOARD_DIR: os.path.join(work, "tensorboard"),
        environment.MODEL_DIR: os.path.join(work, "model"),
        environment.OUTPUT_DIR: os.path.join(work, "outputs"),
        environment.MESSAGES_FILE: os.path.join(work, "messages.jsonl"),
        environment.ATTEMPT: "1",
        environment.KEEP_CHECKPOINTS: "5",
        environment.SEED: "11",
        environment.CHECKPOINT_EVERY_SECONDS: "2.5",  # the trainer's own resolution, not the inherited 999
    }
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"  # TensorFlow's start-up noise is hidden
    assert "TF_USE_LEGACY_KERAS" not in env  # one worker: the Keras the script imports


def test_no_python_path_of_its_own_and_a_cadence_switched_off(tmp_path, code, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "")
    run = new_run(tmp_path, code, None, checkpoint_every_seconds=None)
    env = run.child_env()
    assert env["PYTHONPATH"] == os.pathsep.join([script.TRAINER_ROOT, os.path.join(str(tmp_path / "work"), "code")])
    assert env[environment.CHECKPOINT_EVERY_SECONDS] == "0"
    assert new_run(tmp_path, code, None, checkpoint_every_seconds=600.0).child_env()[
        environment.CHECKPOINT_EVERY_SECONDS] == "600"


def test_verbose_leaves_tensorflows_log_level_and_a_users_own_level_is_kept(tmp_path, code, monkeypatch):
    assert "TF_CPP_MIN_LOG_LEVEL" not in new_run(tmp_path, code, None, "--verbose").child_env()
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    assert new_run(tmp_path, code).child_env()["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_several_workers_get_keras_2_unless_the_user_chose(tmp_path, code, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 0}}))
    assert new_run(tmp_path, code).child_env()["TF_USE_LEGACY_KERAS"] == "1"
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    assert new_run(tmp_path, code).child_env()["TF_USE_LEGACY_KERAS"] == "0"


@pytest.mark.parametrize(("command", "first"), [
    (("python", "t.py"), sys.executable), (("python3", "t.py"), sys.executable), (("bash", "t.sh"), "bash"),
    (("python3.11", "t.py"), "python3.11")])
def test_python_is_the_trainers_own_interpreter(command, first):
    words = script.child_command(command)
    assert words == [first, *command[1:]]
    assert isinstance(words, list)


def test_the_command_dies_with_its_trainer():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    before = ctypes.c_int()
    libc.prctl(2, ctypes.byref(before))  # PR_GET_PDEATHSIG
    try:
        script_child.die_with_parent()
        got = ctypes.c_int()
        libc.prctl(2, ctypes.byref(got))
        assert got.value == signal.SIGKILL
    finally:
        libc.prctl(1, before.value)  # this test process keeps its own setting


# -- the working folder and the outputs --


def test_the_working_folder_is_a_fresh_copy_of_the_code_and_outputs_come_back_as_kept(tmp_path, code):
    (code / "data").mkdir()
    (code / "data" / "a.csv").write_text("1,2")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "plan.cpython.pyc").write_text("stale")
    (code / "link").symlink_to("data/a.csv")
    run = new_run(tmp_path, code)
    os.makedirs(run.folders.workdir)
    (tmp_path / "work" / "code" / "old.txt").write_text("from an earlier attempt")
    os.makedirs(run.folders.dirs["outputs"])
    (tmp_path / "work" / "outputs" / "local-only.txt").write_text("never kept")
    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes("outputs/report.txt", b"kept")
    store.put_bytes("outputs/deep/plot.png", b"png")
    run.folders.prepare()
    work = tmp_path / "work"
    assert sorted(str(p.relative_to(work / "code")) for p in (work / "code").rglob("*")) == [
        "data", "data/a.csv", "link", "plan.py"]
    assert (work / "code" / "link").is_symlink()  # copied as a link, as the user made it
    for name in ("checkpoints", "tensorboard", "model", "outputs"):
        assert (work / name).is_dir()
    assert sorted(str(p.relative_to(work / "outputs")) for p in (work / "outputs").rglob("*")) == [
        "deep", "deep/plot.png", "report.txt"]
    assert (work / "outputs" / "report.txt").read_text() == "kept"
    # The stored time: the kept copy is current, uploaded again only when the command changes it.
    kept = store.stat("outputs/")
    for key, rel in (("outputs/report.txt", "report.txt"), ("outputs/deep/plot.png", "deep/plot.png")):
        stamp = kept[key].modified.timestamp()
        assert os.stat(work / "outputs" / rel).st_mtime == pytest.approx(stamp, abs=1e-6)


def test_a_work_folder_inside_the_code_folder_is_not_copied_into_itself(tmp_path, code):
    run = script.ScriptRun(dataclasses.replace(make_cfg(tmp_path, code), work_dir=str(code / "work")),
                           stream=io.StringIO())
    (code / "workish").mkdir()
    run.folders.prepare()
    assert sorted(p.name for p in (code / "work" / "code").iterdir()) == ["plan.py", "workish"]
    assert not (code / "work" / "code" / "work").exists()


def test_no_outputs_kept_is_an_empty_output_folder(tmp_path, code):
    run = new_run(tmp_path, code)
    run.folders.prepare()
    assert os.listdir(run.folders.dirs["outputs"]) == []


# -- what the command says --


def test_progress_and_epochs_reach_progress_json_and_the_events(tmp_path, code):
    run = new_run(tmp_path, code)
    run.folders.prepare()
    run.report.said({"kind": "progress", "step": 3, "total": 10, "epoch": 0, "examples_per_sec": 12.5,
                  "metrics": {"loss": 1.5, "accuracy": 0.25}, "examples_seen": 96})
    run.events.flush()
    progress = json.loads((tmp_path / "run" / layout.PROGRESS_KEY).read_text())
    assert {k: progress[k] for k in ("step", "total", "loss", "examples_per_sec", "metrics", "epoch")} == {
        "step": 3, "total": 10, "loss": 1.5, "examples_per_sec": 12.5,
        "metrics": {"loss": 1.5, "accuracy": 0.25}, "epoch": 0}
    assert (run.report.step, run.report.total, run.report.examples_seen) == (3, 10, 96)
    run.report.said({"kind": "epoch", "step": 10, "epoch": 1, "examples_per_sec": 20.0, "metrics": {"loss": 0.5}})
    run.events.flush()
    epoch = of(printed(run.events.stream), "epoch")
    assert len(epoch) == 1 and {k: epoch[0][k] for k in ("step", "epoch", "metrics")} == {
        "step": 10, "epoch": 1, "metrics": {"loss": 0.5}}
    assert of(stored(tmp_path), "epoch")  # the run's log has it too
    progress = json.loads((tmp_path / "run" / layout.PROGRESS_KEY).read_text())
    assert (progress["step"], progress["total"], progress["loss"], progress["epoch"], progress["examples_per_sec"],
            progress["metrics"]) == (10, 10, 0.5, 1, 20.0, {"loss": 0.5})


@pytest.mark.parametrize("kind", ["progress", "epoch"])
def test_a_progress_without_a_total_or_a_loss(tmp_path, code, kind):
    run = new_run(tmp_path, code)
    run.report.said({"kind": kind, "step": 2})
    run.events.flush()
    progress = json.loads((tmp_path / "run" / layout.PROGRESS_KEY).read_text())
    assert (progress["step"], progress["total"], progress["loss"]) == (2, 0, None)
    assert "epoch" not in progress


def test_a_message_without_a_kind_still_says_where_the_command_is(tmp_path, code):
    run = new_run(tmp_path, code)
    run.report.said({"step": 5, "total": 9})
    assert (run.report.step, run.report.total) == (5, 9) and printed(run.events.stream) == []


@pytest.mark.parametrize("bad", [{"step": "3"}, {"total": 1.5}, {"examples_seen": None}, {"metrics": [1]}])
def test_fields_of_the_wrong_type_leave_what_was_known(tmp_path, code, bad):
    run = new_run(tmp_path, code)
    run.report.said({"kind": "other", "step": 4, "total": 8, "examples_seen": 16, "metrics": {"loss": 1.0}})
    run.report.said({"kind": "other", **bad})
    assert (run.report.step, run.report.total, run.report.examples_seen, run.report.metrics) == (4, 8, 16, {"loss": 1.0})
    assert printed(run.events.stream) == []  # an unknown kind says nothing


def test_a_commit_is_a_checkpoint_event_and_uploads_the_outputs(tmp_path, code):
    run = new_run(tmp_path, code)
    run.folders.prepare()
    (tmp_path / "work" / "outputs" / "report.txt").write_text("at step 7")
    run.report.said({"kind": "checkpoint", "step": 7, "seconds": 0.25, "bytes": 100})
    run.events.flush()
    ev = of(printed(run.events.stream), layout.CHECKPOINT)
    assert len(ev) == 1 and {k: ev[0][k] for k in ("step", "seconds", "bytes")} == {"step": 7, "seconds": 0.25,
                                                                                  "bytes": 100}
    assert run.report.committed == 7
    assert (tmp_path / "run" / "outputs" / "report.txt").read_text() == "at step 7"
    assert of(stored(tmp_path), layout.CHECKPOINT)


def test_a_commit_moves_progress_json_to_its_step(tmp_path, code):
    # A stop's commit lands between two progress messages: progress.json must not stay behind the
    # `preempted` event's step (ops status draws its bar from one and words from the other).
    run = new_run(tmp_path, code)
    run.report.said({"kind": "progress", "step": 2423, "total": 2814, "epoch": 5, "metrics": {"loss": 0.25}})
    run.report.said({"kind": "checkpoint", "step": 2742, "seconds": 0.5, "bytes": 10})
    run.events.flush()
    progress = json.loads((tmp_path / "run" / layout.PROGRESS_KEY).read_text())
    assert (progress["step"], progress["total"], progress["epoch"], progress["loss"]) == (2742, 2814, 5, 0.25)


def test_a_resume_and_the_stores_own_events_are_said(tmp_path, code):
    run = new_run(tmp_path, code)
    run.report.said({"kind": "resumed", "step": 30, "examples_seen": 960, "epoch": 2, "batch": 5})
    run.report.said({"kind": "event", "event": "checkpoint_failed", "reason": "slow"})
    run.report.said({"kind": "event", "event": 5, "reason": "not a name"})
    run.report.said({"kind": "event"})
    evs = printed(run.events.stream)
    assert [e["event"] for e in evs] == [layout.RESUMED, "checkpoint_failed"]
    assert {k: evs[0][k] for k in ("step", "examples_seen", "batches_seen", "epoch", "batch")} == {
        "step": 30, "examples_seen": 960, "batches_seen": 30, "epoch": 2, "batch": 5}
    assert evs[1]["reason"] == "slow" and "kind" not in evs[1]


def test_messages_are_read_line_by_line_a_torn_line_waits_and_junk_is_skipped(tmp_path, code):
    run = new_run(tmp_path, code)
    run.report.read()  # no file yet: nothing
    os.makedirs(os.path.dirname(run.folders.messages), exist_ok=True)
    with open(run.folders.messages, "w") as f:
        f.write('{"kind": "other", "step": 1}\nnot json\n[1, 2]\n{"kind": "other", "total": 5}\n{"kind": "other", "st')
    run.report.read()
    assert (run.report.step, run.report.total) == (1, 5)  # the line after the junk is read too
    with open(run.folders.messages, "a") as f:
        f.write('ep": 2}\n')
    run.report.read()
    assert run.report.step == 2
    run.report.step = 0
    run.report.read()  # what was read is not read again
    assert run.report.step == 0


def test_a_resumed_attempt_says_only_its_own_events(tmp_path, code):
    # The work folder outlives an attempt (a machine's /data/work survives its reboot): the messages
    # of attempt 1 must not be read again, and said again as attempt 2's, by attempt 2.
    first = {"messages": [{"kind": "epoch", "step": 5, "epoch": 0, "metrics": {"loss": 1.0}},
                          {"kind": "checkpoint", "step": 5, "seconds": 0.1, "bytes": 10}], "exit": 143}
    rc, _, _ = attempt(tmp_path, code, first)
    assert rc == exits.PREEMPTED
    second = {"messages": [{"kind": "resumed", "step": 5, "examples_seen": 160, "epoch": 1, "batch": 0},
                           {"kind": "epoch", "step": 10, "epoch": 1, "metrics": {"loss": 0.5}}]}
    rc, _, _ = attempt(tmp_path, code, second)
    assert rc == exits.OK
    kinds = [(e["attempt"], e["event"]) for e in stored(tmp_path)]
    assert kinds == [(1, layout.STARTED), (1, "epoch"), (1, layout.CHECKPOINT), (1, layout.PREEMPTED),
                     (2, layout.STARTED), (2, layout.RESUMED), (2, "epoch"), (2, layout.FINISHED)]
    assert [e["step"] for e in of(stored(tmp_path), layout.CHECKPOINT)] == [5]


# -- endings --


def test_exit_0_keeps_the_model_outputs_and_tensorboard_and_writes_complete(tmp_path, code):
    plan = {"files": {"MODEL/weights.bin": "model", "OUTPUT/where.txt": "$CWD", "TENSORBOARD/events.out": "tb",
                      "logs/x": "beside the script"},
            "messages": [{"kind": "epoch", "step": 10, "total": 10, "epoch": 1, "examples_seen": 320,
                          "metrics": {"loss": 0.5, "accuracy": 0.875}}]}
    rc, evs, _ = attempt(tmp_path, code, plan)
    assert rc == exits.OK
    run_folder = tmp_path / "run"
    assert (run_folder / "model" / "weights.bin").read_text() == "model"
    assert (run_folder / "outputs" / "where.txt").read_text() == str(tmp_path / "work" / "code")  # ran in the copy
    assert (run_folder / "tensorboard" / "events.out").read_text() == "tb"
    assert sorted(p.name for p in code.iterdir()) == ["plan.py"]  # the code folder was never written
    done = json.loads((run_folder / layout.COMPLETE).read_text())
    assert done["step"] == 10 and done["metrics"] == {"loss": 0.5, "accuracy": 0.875}
    assert done["examples_seen"] == 320 and done["model_files"] == 1
    finished = of(evs, layout.FINISHED)
    assert len(finished) == 1 and {k: finished[0][k] for k in ("step", "metrics", "examples_seen", "model_files")} == {
        "step": 10, "metrics": {"loss": 0.5, "accuracy": 0.875}, "examples_seen": 320, "model_files": 1}
    assert "model_note" not in finished[0]
    started = of(stored(tmp_path), layout.STARTED)
    assert len(started) == 1 and started[0]["mode"] == "script"
    # The loop's fields, as script mode knows them: one process, no replicas, batch or precision of its own.
    assert {k: started[0][k] for k in ("workers", "worker", "replicas", "global_batch", "precision")} == {
        "workers": 1, "worker": 0, "replicas": None, "global_batch": None, "precision": None}
    assert started[0]["command"] == ["python", "plan.py", json.dumps(plan)]
    assert started[0]["config"]["steps"] is None and started[0]["config"]["model"] is None
    assert [e["event"] for e in stored(tmp_path)] == [layout.STARTED, "epoch", layout.FINISHED]


def test_a_replaced_model_leaves_nothing_of_the_old_one(tmp_path, code):
    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes("model/old.bin", b"old")
    rc, _, _ = attempt(tmp_path, code, {"files": {"MODEL/new.bin": "new"}})
    assert rc == exits.OK
    assert sorted(p.name for p in (tmp_path / "run" / "model").iterdir()) == ["new.bin"]


def test_a_saved_model_with_its_signature_and_one_without(tmp_path, code, monkeypatch):
    from trainer import export

    seen = []
    monkeypatch.setattr(export, "saved_model_signature", lambda d: seen.append(d) or {"inputs": {"x": 1}})
    rc, evs, _ = attempt(tmp_path, code, {"files": {"MODEL/saved_model.pb": "pb"}})
    assert rc == exits.OK and seen == [str(tmp_path / "work" / "model")]
    assert json.loads((tmp_path / "run" / layout.COMPLETE).read_text())["signature"] == {"inputs": {"x": 1}}

    def broken(d):
        raise ValueError("no serving_default")

    monkeypatch.setattr(export, "saved_model_signature", broken)
    other = tmp_path / "other"
    other.mkdir()
    rc, evs, _ = attempt(other, code, {"files": {"MODEL/saved_model.pb": "pb"}})
    assert rc == exits.OK
    notes = of(evs, "note")
    assert len(notes) == 1 and notes[0]["message"] == f"model/ has no {export.SIGNATURE}: no serving_default"
    assert "note" not in [e["event"] for e in stored(other)]  # said, not stored
    assert "signature" not in json.loads((other / "run" / layout.COMPLETE).read_text())


def test_a_model_saved_in_the_working_folder_is_taken(tmp_path, code, capsys):
    rc, evs, _ = attempt(tmp_path, code, {"files": {"sub/net.keras": "k"}})
    assert rc == exits.OK
    assert (tmp_path / "run" / "model" / "net.keras").read_text() == "k"
    note = ("the script saved no model in fit.model_dir(); its one model file, ./sub/net.keras in its working "
            "folder, was taken as model/net.keras (keras.models.load_model)")
    assert of(evs, layout.FINISHED)[0]["model_note"] == note and of(evs, layout.FINISHED)[0]["model_files"] == 1
    assert f"trainstack: {note}\n" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / layout.COMPLETE).read_text())["model_note"] == note


@pytest.mark.parametrize(("files", "found"), [
    ({}, ["./changed.h5"]),
    ({"a.h5": "x", "OUTPUT/b.hdf5": "x", "OUTPUT/sm/saved_model.pb": "x", "saved_model.pb": "x", "c.txt": "x"},
     ["./a.h5", "./changed.h5", "./", "outputs/b.hdf5", "outputs/sm"]),
    ({"x.keras": "1", "y.keras": "2"}, ["./changed.h5", "./x.keras", "./y.keras"]),
    ({"OUTPUT/m.keras": "x"}, ["./changed.h5", "outputs/m.keras"]),
])
def test_models_saved_elsewhere_are_named_not_guessed_at(tmp_path, code, capsys, files, found):
    (code / "shipped.keras").write_text("came with the code")
    (code / "changed.h5").write_text("came with the code")
    files = {**files, "changed.h5": "saved again, longer"}
    rc, evs, _ = attempt(tmp_path, code, {"files": files})
    assert rc == exits.OK
    finished = of(evs, layout.FINISHED)[0]
    assert finished["model_files"] == 0
    assert finished["model_note"] == (
        f"the script saved no model in fit.model_dir(); it saved {', '.join(found)} (./ is its working folder, a "
        "scratch copy that is not kept; outputs/ is kept): save the model with model.export(fit.model_dir()) or "
        "model.save(os.path.join(fit.model_dir(), 'model.keras'))")
    assert not (tmp_path / "run" / "model").exists()


def test_no_model_at_all_is_said(tmp_path, code):
    run = new_run(tmp_path, code)
    run.folders.prepare()
    assert run.folders.take_model() == (0, "the script saved no model in fit.model_dir()")
    assert run.folders.models_elsewhere() == []


def test_what_the_command_left_in_its_working_folder_is_said_in_one_line_at_the_end(tmp_path, code, capsys):
    (code / "data.csv").write_text("shipped")
    plan = {"files": {"logs/train/events.out": "tb", "logs/validation/events.out": "tb", "history.csv": "epoch,loss",
                      "sub/net.keras": "k", "OUTPUT/kept.txt": "kept"}, "exit": 143}
    rc, _, _ = attempt(tmp_path, code, plan)
    assert rc == exits.PREEMPTED  # whatever the ending
    err = capsys.readouterr().err.splitlines()
    assert err == ["trainstack: not kept, written in the working folder (a scratch copy of the code): ./history.csv, "
                   "./logs/ (2 files), ./sub/ (1 file); write what the run should keep to fit.output_dir() "
                   "(kept as outputs/)"]


def test_a_model_taken_from_the_working_folder_is_not_said_to_be_left_behind(tmp_path, code, capsys):
    rc, _, _ = attempt(tmp_path, code, {"files": {"net.keras": "k", "history.csv": "h"}})
    assert rc == exits.OK
    err = capsys.readouterr().err
    assert "model/net.keras" in err
    assert err.splitlines()[-1] == ("trainstack: not kept, written in the working folder (a scratch copy of the "
                                    "code): ./history.csv; write what the run should keep to fit.output_dir() "
                                    "(kept as outputs/)")


def test_a_command_that_wrote_nothing_beside_itself_says_nothing_of_it(tmp_path, code, capsys):
    rc, _, _ = attempt(tmp_path, code, {"files": {"MODEL/w": "m", "OUTPUT/o": "o"}})
    assert rc == exits.OK
    assert "not kept" not in capsys.readouterr().err


def test_left_behind_counts_new_and_changed_files_not_copies_or_caches(tmp_path):
    code, work = tmp_path / "code", tmp_path / "work"
    (code / "pkg").mkdir(parents=True)
    for rel in ("same.py", "pkg/same.txt", "changed.txt"):
        (code / rel).write_text("shipped")
    import shutil
    shutil.copytree(code, work)
    (work / "changed.txt").write_text("written again")
    (work / "pkg" / "new.txt").write_text("n")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "same.cpython.pyc").write_text("c")
    (work / "pkg" / "__pycache__").mkdir()
    (work / "pkg" / "__pycache__" / "x.pyc").write_text("c")
    (work / "model.keras").write_text("taken")
    assert script_folders.left_behind(str(work), str(code), skip="model.keras") == [("./changed.txt", 1), ("./pkg/", 1)]
    assert script_folders.left_behind(str(work), str(code))[0] == ("./changed.txt", 1)
    assert script_folders.left_behind(str(tmp_path / "none"), str(code)) == []


def test_the_left_behind_line_names_five_then_counts():
    assert script_folders.left_behind_line([]) is None
    found = [(f"./f{i}", 1) for i in range(6)] + [("./logs/", 3)]
    line = script_folders.left_behind_line(found)
    assert line.startswith("not kept, written in the working folder (a scratch copy of the code): "
                           "./f0, ./f1, ./f2, ./f3, ./f4 and 2 more; ")
    assert script_folders.left_behind_line([("./logs/", 3)], most=1).split(": ")[1].startswith("./logs/ (3 files);")


def test_a_copied_file_is_the_same_only_with_its_size_and_time(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("12345")
    b.write_text("12345")
    os.utime(a, (1000, 1000.2))
    os.utime(b, (1000, 1000.7))
    assert script_folders.same_file(str(a), str(b))
    os.utime(b, (1000, 1001.0))
    assert not script_folders.same_file(str(a), str(b))
    os.utime(b, (1000, 1000.0))
    b.write_text("123456")
    os.utime(b, (1000, 1000.0))
    assert not script_folders.same_file(str(a), str(b))
    assert not script_folders.same_file(str(a), str(tmp_path / "missing"))
    assert not script_folders.same_file(str(tmp_path / "missing"), str(a))


@pytest.mark.parametrize(("rc", "code_out"), [(3, exits.FAILED), (exits.UNUSABLE, exits.UNUSABLE), (1, exits.FAILED)])
def test_a_failing_command_is_a_failed_event(tmp_path, code, rc, code_out):
    plan = {"messages": [{"kind": "progress", "step": 4}], "files": {"OUTPUT/partial.txt": "p"}}
    got, evs, _ = attempt(tmp_path, code, {**plan, "exit": rc})
    assert got == code_out
    failed = of(stored(tmp_path), layout.FAILED_EVENT)
    assert len(failed) == 1
    assert failed[0]["reason"] == f"the command ['python', 'plan.py', {json.dumps({**plan, 'exit': rc})!r}] exited with {rc}"
    assert failed[0]["exit_code"] == rc and failed[0]["step"] == 4
    assert (tmp_path / "run" / "outputs" / "partial.txt").read_text() == "p"  # kept whatever the ending
    assert not (tmp_path / "run" / layout.COMPLETE).exists() and not (tmp_path / "run" / "model").exists()


def test_a_command_killed_by_a_signal_nobody_sent_failed(tmp_path, code):
    got, _, _ = attempt(tmp_path, code, {"kill_self": True})
    assert got == exits.FAILED
    failed = of(stored(tmp_path), layout.FAILED_EVENT)
    assert len(failed) == 1 and failed[0]["exit_code"] == -9
    assert failed[0]["reason"].endswith(" exited with -9 (killed by a signal)")


@pytest.mark.parametrize("rc", [exits.PEER_LOST, exits.NO_CLUSTER])
def test_a_command_that_lost_its_cluster_is_not_this_machines_failure(tmp_path, code, rc):
    plan = {"messages": [{"kind": "progress", "step": 6}], "exit": rc}
    got, _, _ = attempt(tmp_path, code, plan)
    assert got == rc
    failed = of(stored(tmp_path), layout.FAILED_EVENT)
    assert len(failed) == 1 and failed[0]["exit_code"] == rc and failed[0]["step"] == 6
    assert failed[0]["reason"] == f"the command ['python', 'plan.py', {json.dumps(plan)!r}] lost its cluster (exit {rc})"


def test_a_stop_signal_is_forwarded_and_a_commit_then_143_is_preempted(tmp_path, code):
    plan = {"messages": [{"kind": "progress", "step": 3, "examples_seen": 96}], "ready": True,
            "files": {"OUTPUT/before.txt": "b"},
            "on_term": [{"kind": "checkpoint", "step": 7, "seconds": 0.1, "bytes": 10}]}
    stop = SignalWhenReady(Ready(tmp_path))
    rc, evs, _ = attempt(tmp_path, code, plan, stop=stop)
    assert rc == exits.PREEMPTED
    pre = of(stored(tmp_path), layout.PREEMPTED)
    assert len(pre) == 1
    assert {k: pre[0][k] for k in ("step", "signal", "exit_code", "examples_seen")} == {
        "step": 7, "signal": "SIGTERM", "exit_code": 143, "examples_seen": 96}
    # From the forwarded signal to the command's end, in milliseconds.
    assert 0 <= pre[0]["seconds"] < 2.5 and pre[0]["seconds"] == round(pre[0]["seconds"], 3)
    assert [e["event"] for e in stored(tmp_path)][-2:] == [layout.CHECKPOINT, layout.PREEMPTED]
    assert (tmp_path / "run" / "outputs" / "before.txt").read_text() == "b"
    assert not (tmp_path / "run" / layout.COMPLETE).exists()


def test_a_command_that_ignores_the_signal_is_killed_after_the_grace(tmp_path, code):
    plan = {"ready": True, "on_term": "ignore"}
    started = time.monotonic()
    rc, _, _ = attempt(tmp_path, code, plan, stop=SignalWhenReady(Ready(tmp_path), "SIGINT"), stop_grace_s=0.3)
    assert rc == exits.PREEMPTED and time.monotonic() - started < 20
    pre = of(stored(tmp_path), layout.PREEMPTED)
    assert len(pre) == 1 and pre[0]["exit_code"] == -9 and pre[0]["signal"] == "SIGINT"
    assert 0.3 <= pre[0]["seconds"] < 10


def test_a_command_ended_by_the_signal_before_its_first_commit_stands_at_the_newest_checkpoint(tmp_path, code):
    from trainer.checkpoint_store import CheckpointStore

    saved = tmp_path / "ckpt"
    saved.mkdir()
    (saved / "state.json").write_text("{}")
    ckstore = CheckpointStore(open_store(f"file://{tmp_path}/run"))
    for step in (12, 30, 42):
        ckstore.commit(step, str(saved))
    rc, _, _ = attempt(tmp_path, code, {"ready": True}, stop=SignalWhenReady(Ready(tmp_path)))
    assert rc == exits.PREEMPTED
    pre = of(stored(tmp_path), layout.PREEMPTED)
    assert len(pre) == 1 and pre[0]["step"] == 42 and pre[0]["exit_code"] == -signal.SIGTERM


def test_a_stop_with_no_checkpoint_anywhere_stands_at_step_0(tmp_path, code):
    rc, _, _ = attempt(tmp_path, code, {"ready": True}, stop=SignalWhenReady(Ready(tmp_path)))
    assert rc == exits.PREEMPTED
    assert of(stored(tmp_path), layout.PREEMPTED)[0]["step"] == 0


def test_a_command_that_ended_as_the_signal_came_is_preempted(tmp_path, code):
    # A terminal's Ctrl-C reaches the command too: it may end before the signal is forwarded.
    stop = StopRequest()
    run = None

    class Late(StopRequest):
        @property
        def requested(self):
            if run is not None and run.child is not None and run.child.poll() is not None:
                stop.signal_name = "SIGINT"
                return True
            return False

    late = Late()
    late.event = stop.event
    stream = io.StringIO()
    run = script.ScriptRun(make_cfg(tmp_path, code, {"exit": 143}), stream=stream, stop=late)
    assert run.run() == exits.PREEMPTED
    pre = of(stored(tmp_path), layout.PREEMPTED)
    assert len(pre) == 1 and pre[0]["exit_code"] == 143 and pre[0]["signal"] == "STOP" and pre[0]["seconds"] is not None


def test_exit_143_unasked_is_preempted_without_a_stop(tmp_path, code):
    rc, _, _ = attempt(tmp_path, code, {"exit": 143})
    assert rc == exits.PREEMPTED
    pre = of(stored(tmp_path), layout.PREEMPTED)
    assert len(pre) == 1 and pre[0]["seconds"] is None and pre[0]["signal"] == "STOP"


def test_the_run_folders_stop_cancels_after_the_commands_last_commit(tmp_path, code):
    plan = {"ready": True, "messages": [{"kind": "progress", "step": 3, "examples_seen": 96}],
            "on_term": [{"kind": "checkpoint", "step": 7, "seconds": 0.1, "bytes": 10}]}
    key = StopKeyWhen(Ready(tmp_path))
    rc, evs, run = attempt(tmp_path, code, plan, key=key)
    assert rc == exits.OK and key.started and key.closed, evs
    marker = json.loads((tmp_path / "run" / layout.CANCELLED).read_text())
    assert (marker["reason"], marker["step"], marker["examples_seen"]) == ("enough", 7, 96)
    cancelled = of(stored(tmp_path), layout.CANCELLED_EVENT)
    assert len(cancelled) == 1 and (cancelled[0]["step"], cancelled[0]["reason"], cancelled[0]["examples_seen"]) == (
        7, "enough", 96)
    assert not of(stored(tmp_path), layout.PREEMPTED)


def test_a_stop_without_a_reason_is_named_as_the_run_folders(tmp_path, code):
    key = StopKeyWhen(Ready(tmp_path), reason=None)
    rc, _, _ = attempt(tmp_path, code, {"ready": True}, key=key)
    assert rc == exits.OK
    assert json.loads((tmp_path / "run" / layout.CANCELLED).read_text())["reason"] == (
        "stop requested (STOP in the run folder)")


def test_a_signal_and_the_run_folders_stop_together_is_preempted_not_cancelled(tmp_path, code):
    ready = Ready(tmp_path)
    rc, _, _ = attempt(tmp_path, code, {"ready": True}, stop=SignalWhenReady(ready), key=StopKeyWhen(ready))
    assert rc == exits.PREEMPTED
    assert not (tmp_path / "run" / layout.CANCELLED).exists()


def test_a_stop_that_came_as_the_command_ended_cancels(tmp_path, code):
    run = None

    def ended():
        return run is not None and run.child is not None and run.child.poll() is not None

    stream = io.StringIO()
    run = script.ScriptRun(make_cfg(tmp_path, code, {"exit": 143}), stream=stream)
    run.stop_key = StopKeyWhen(ended)
    assert run.run() == exits.OK
    assert (tmp_path / "run" / layout.CANCELLED).exists()


def test_tensorboard_is_uploaded_while_the_command_runs(tmp_path, code, monkeypatch):
    monkeypatch.setattr(script, "TENSORBOARD_EVERY_S", 0.0)
    plan = {"files": {"TENSORBOARD/events.out": "tb"}, "until_uploaded": str(tmp_path / "run" / "tensorboard" /
                                                                                "events.out")}
    rc, _, _ = attempt(tmp_path, code, plan)
    assert rc == exits.OK  # the command saw its file in the run folder before it ended (else exit 9)


def test_tensorboard_waits_for_its_period(tmp_path, code, monkeypatch):
    monkeypatch.setattr(script, "TENSORBOARD_EVERY_S", 60.0)
    plan = {"files": {"TENSORBOARD/events.out": "tb"}, "until_uploaded": str(tmp_path / "run" / "tensorboard" /
                                                                                "events.out")}
    run = new_run(tmp_path, code, plan)
    synced = []
    run.folders.sync_tensorboard = lambda: synced.append(run.child.poll())
    run.folders.sync_outputs = lambda: None
    # The command gives up after its 10 s wait: the upload came only at the end.
    assert run.run() == exits.FAILED
    assert synced == [9]


def test_outputs_are_uploaded_at_each_commit_while_the_command_runs(tmp_path, code):
    plan = {"files": {"OUTPUT/report.txt": "r"}, "messages": [{"kind": "checkpoint", "step": 1}],
            "until_uploaded": str(tmp_path / "run" / "outputs" / "report.txt")}
    rc, _, _ = attempt(tmp_path, code, plan)
    assert rc == exits.OK


def test_a_lost_lease_kills_the_command_at_once_and_writes_nothing_more(tmp_path, code):
    run = None

    class LoseLease(StopRequest):
        @property
        def requested(self):
            if Ready(tmp_path) and run.lost_lease is None:
                run._lease_lost("taken over (machine-b/1)")
            return False

    stream = io.StringIO()
    plan = {"ready": True, "on_term": [{"kind": "checkpoint", "step": 7}], "files": {"OUTPUT/r.txt": "r"}}
    run = script.ScriptRun(make_cfg(tmp_path, code, plan), stream=stream, stop=LoseLease())
    started = time.monotonic()
    assert run.run() == exits.LEASE_HELD
    assert time.monotonic() - started < 20
    evs = printed(stream)
    assert evs[-1]["event"] == layout.FAILED_EVENT
    assert evs[-1]["reason"] == "taken over (machine-b/1); the command was killed"
    assert layout.CHECKPOINT not in [e["event"] for e in evs]  # killed, not asked to save
    assert not (tmp_path / "run" / "outputs").exists()  # the new holder's outputs are not overwritten
    assert run.child.returncode == -signal.SIGKILL


def test_a_lost_lease_without_a_reason_says_so(tmp_path, code):
    run = new_run(tmp_path, code)
    run._lease_lost("")
    assert run.lost_lease == "the lease was lost"
    run._kill_child()  # no command yet: nothing to kill


def test_a_workers_parent_leaves_the_ending_to_the_chief(tmp_path, code, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker",
                                                                                          "index": 1}}))
    plan = {"files": {"MODEL/w.bin": "m", "OUTPUT/o.txt": "o", "TENSORBOARD/t": "t"},
            "messages": [{"kind": "checkpoint", "step": 2}]}
    rc, evs, run = attempt(tmp_path, code, plan)
    assert rc == exits.OK and not run.chief and run.lease is None
    assert not (tmp_path / "run").exists()  # nothing written to the run
    assert [e["event"] for e in evs] == [layout.STARTED, layout.CHECKPOINT]
    other = tmp_path / "cancel"
    other.mkdir()
    rc, _, _ = attempt(other, code, {"ready": True}, key=StopKeyWhen(Ready(tmp_path)))
    assert rc == exits.OK and not (other / "run").exists()


def test_the_commands_stderr_is_relayed_without_tensorflows_start_up_lines(monkeypatch):
    pipe = io.BytesIO(b"I0000 00:00:1764000000.000000   12345 cpu_feature_guard.cc:210] This TensorFlow binary\n"
                      b"the script's own warning\n\xff bytes\n")
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, "stderr", out)
    script_child.relay_stderr(pipe)
    out.flush()
    assert out.buffer.getvalue() == b"the script's own warning\n\xff bytes\n"
    assert pipe.closed
    text = io.StringIO()
    monkeypatch.setattr(sys, "stderr", text)
    script_child.relay_stderr(io.BytesIO(b"plain\n\xff\n"))
    assert text.getvalue() == "plain\n\ufffd\n"


def test_run_script_runs_one_attempt_or_fails_to_start(tmp_path, code):
    cfg = make_cfg(tmp_path, code, {"files": {"MODEL/w": "m"}})
    assert script.run_script(cfg, stream=io.StringIO()) == exits.OK
    broken = dataclasses.replace(cfg, run_uri="nosuch://bucket/run")
    stream = io.StringIO()
    assert script.run_script(broken, stream=stream) == exits.FAILED
    assert printed(stream)[0]["event"] == layout.FAILED_EVENT


def test_the_command_is_killed_with_its_trainer_and_its_stderr_relayed_without_tensorflows_noise(
        tmp_path, code, capfd, monkeypatch):
    made = []
    real = script_child.threading.Thread

    def spy(*args, **kwargs):
        thread = real(*args, **kwargs)
        made.append((kwargs.get("target"), thread))
        return thread

    monkeypatch.setattr(script_child.threading, "Thread", spy)
    noise = "I0000 00:00:1764000000.000000   12345 cpu_feature_guard.cc:210] This TensorFlow binary"
    rc, _, _ = attempt(tmp_path, code, {"pdeathsig": True, "stderr": [noise, "the script's own warning"]})
    assert rc == exits.OK
    assert (tmp_path / "run" / "outputs" / "pdeathsig").read_text() == str(int(signal.SIGKILL))
    err = capfd.readouterr().err
    assert "the script's own warning\n" in err and "cpu_feature_guard" not in err
    relays = [t for target, t in made if target is script_child.relay_stderr]
    assert len(relays) == 1 and relays[0].daemon  # a command's stray child holding stderr never holds the trainer


def test_verbose_leaves_the_commands_stderr_as_it_is(tmp_path, code, capfd):
    noise = "I0000 00:00:1764000000.000000   12345 cpu_feature_guard.cc:210] This TensorFlow binary"
    rc, _, _ = attempt(tmp_path, code, {"stderr": [noise]}, "--verbose")
    assert rc == exits.OK
    assert noise in capfd.readouterr().err


def test_only_what_changed_is_uploaded_again_and_the_model_whole(tmp_path, code, monkeypatch):
    calls = []
    real = script_folders.ScriptFolders.prepare

    def prepare(self):
        upload = self.store.upload_dir

        def spy(local, prefix, *, changed_only):
            calls.append((prefix, changed_only))
            return upload(local, prefix, changed_only=changed_only)

        self.store.upload_dir = spy
        real(self)

    monkeypatch.setattr(script_folders.ScriptFolders, "prepare", prepare)
    rc, _, _ = attempt(tmp_path, code, {"files": {"MODEL/w": "m", "OUTPUT/o": "o", "TENSORBOARD/t": "t"},
                                        "messages": [{"kind": "checkpoint", "step": 1}]})
    assert rc == exits.OK
    assert sorted(set(calls)) == [(layout.MODEL_PREFIX, False), (layout.OUTPUTS_PREFIX, True),
                                  (layout.TENSORBOARD_PREFIX, True)]


def test_run_script_passes_the_stop_on(tmp_path, code):
    stop = SignalWhenReady(Ready(tmp_path))
    cfg = make_cfg(tmp_path, code, {"ready": True})
    assert script.run_script(cfg, stream=io.StringIO(), stop=stop) == exits.PREEMPTED


def test_a_command_that_said_nothing_ends_at_step_0(tmp_path, code):
    rc, evs, _ = attempt(tmp_path, code, {"exit": 3})
    assert rc == exits.FAILED and of(stored(tmp_path), layout.FAILED_EVENT)[0]["step"] == 0
    other = tmp_path / "ok"
    other.mkdir()
    rc, evs, _ = attempt(other, code, {"files": {"MODEL/w": "m"}})
    assert rc == exits.OK
    done = json.loads((other / "run" / layout.COMPLETE).read_text())
    assert (done["step"], done["examples_seen"], done["metrics"]) == (0, None, {})
    finished = of(evs, layout.FINISHED)[0]
    assert (finished["step"], finished["examples_seen"]) == (0, None)


def test_a_signal_and_the_run_folders_stop_as_the_command_ended_is_preempted(tmp_path, code):
    run = None

    def ended():
        return run is not None and run.child is not None and run.child.poll() is not None

    class Late(StopRequest):
        @property
        def requested(self):
            if ended():
                self.signal_name = "SIGTERM"
                return True
            return False

    run = script.ScriptRun(make_cfg(tmp_path, code, {"exit": 143}), stream=io.StringIO(), stop=Late())
    run.stop_key = StopKeyWhen(ended)
    assert run.run() == exits.PREEMPTED
    assert not (tmp_path / "run" / layout.CANCELLED).exists()


def test_a_command_that_dies_of_sigint_after_the_forwarded_signal_is_preempted(tmp_path, code):
    rc, _, _ = attempt(tmp_path, code, {"ready": True, "on_term": "sigint"}, stop=SignalWhenReady(Ready(tmp_path)))
    assert rc == exits.PREEMPTED
    assert of(stored(tmp_path), layout.PREEMPTED)[0]["exit_code"] == -signal.SIGINT


def test_a_process_the_command_left_behind_does_not_hold_the_trainer(tmp_path, code):
    started = time.monotonic()
    rc, _, _ = attempt(tmp_path, code, {"orphan": True, "files": {"MODEL/w": "m"}})
    assert rc == exits.OK
    assert time.monotonic() - started < 12  # the stderr relay is waited for 5 s, not for the stray process
