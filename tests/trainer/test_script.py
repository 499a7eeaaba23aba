"""Script mode (`python -m trainer ... -- COMMAND`): the parent's guarantees around a user's command.

The commands here are small Python stand-ins that speak the messages `trainer.fit` writes,
so each ending (COMPLETE, failed, preempted, cancelled) is checked in a second, without
TensorFlow. The real Keras script is in test_fit.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from runfolder import exits, layout
from tests.trainer.helpers import REPO, Trainer, kinds, run_trainer, store_events, trainer_env
from trainer.config import ConfigError, load_config

STANDIN = textwrap.dedent('''
    import json, os, signal, sys, time
    def send(kind, **f):
        with open(os.environ["TRAINSTACK_MESSAGES_FILE"], "a") as out:
            out.write(json.dumps({"kind": kind, **f}) + "\\n")
    mode = sys.argv[1]
    out = os.environ["TRAINSTACK_OUTPUT_DIR"]
    # What an earlier attempt kept in outputs/, then a write beside the script (its working folder).
    with open(os.path.join(out, "seen.txt"), "w") as f:
        f.write(",".join(sorted(n for n in os.listdir(out) if n not in ("seen.txt", "cadence.txt"))))
    os.makedirs("logs", exist_ok=True)
    with open(os.path.join("logs", "x"), "w") as f:
        f.write(os.getcwd())
    with open(os.path.join(out, "cadence.txt"), "w") as f:
        f.write(os.environ.get("TRAINSTACK_CHECKPOINT_EVERY_SECONDS", "unset"))
    if mode == "int":
        # fit's way with a stop signal: commit, then exit 143 at once (a terminal's Ctrl-C reaches both processes).
        def stop(signum, frame):
            send("checkpoint", step=7, seconds=0.1, bytes=10)
            os._exit(143)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        print(json.dumps({"event": "standin_ready", "pid": os.getpid()}), flush=True)
        time.sleep(60)
        sys.exit(5)
    if mode == "legacy":
        with open(os.path.join(out, "legacy.txt"), "w") as f:
            f.write(os.environ.get("TF_USE_LEGACY_KERAS", "unset"))
        send("epoch", step=10, total=10, epoch=1, metrics={"loss": 0.5})
        with open(os.path.join(os.environ["TRAINSTACK_MODEL_DIR"], "weights.bin"), "wb") as f:
            f.write(b"model")
        sys.exit(0)
    if mode == "noise":
        sys.stderr.write("I0000 00:00:1764000000.000000   12345 cpu_feature_guard.cc:210] This TensorFlow binary\\n")
        sys.stderr.write("the script's own warning\\n")
        sys.exit(0)
    if mode == "resumed":
        # A rerun past the last epoch: fit's restore says the last epoch's metrics, then nothing trains.
        send("resumed", step=10, epoch=1, batch=0, total=10, metrics={"loss": 0.5, "accuracy": 0.875})
        with open(os.path.join(os.environ["TRAINSTACK_MODEL_DIR"], "weights.bin"), "wb") as f:
            f.write(b"model")
        sys.exit(0)
    if mode.startswith("save:"):
        # A model saved outside fit.model_dir(), e.g. model.save("x.keras").
        for name in filter(None, mode[5:].split(",")):
            os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
            with open(name, "wb") as f:
                f.write(b"saved")
        sys.exit(0)
    if mode == "wait":
        def stop(signum, frame):
            with open(os.path.join(out, "stopped.txt"), "w") as f:
                f.write("7")
            send("checkpoint", step=7, seconds=0.1, bytes=10)
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        send("progress", step=3, total=10, epoch=0, metrics={"loss": 1.5, "accuracy": 0.25})
        print("ready", flush=True)
        print(json.dumps({"event": "standin_ready", "pid": os.getpid()}), flush=True)
        time.sleep(float(os.environ.get("STANDIN_SLEEP", "60")))
        sys.exit(5)
    send("epoch", step=10, total=10, epoch=1, metrics={"loss": 0.5, "accuracy": 0.875, "val_accuracy": 0.75})
    with open(os.path.join(os.environ["TRAINSTACK_MODEL_DIR"], "weights.bin"), "wb") as f:
        f.write(b"model")
    sys.exit(0 if mode == "ok" else int(mode))
''')


@pytest.fixture
def code(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "standin.py").write_text(STANDIN)
    return folder


def _store(uri):
    from runfolder.storage import open_store

    return open_store(uri)


# -- configuration: one line naming the key --


def test_command_after_double_dash_is_parsed(code):
    cfg = load_config(["--run-uri", "file:///tmp/x", "--code-dir", str(code), "--", "python", "standin.py", "ok"], env={})
    assert cfg.command == ("python", "standin.py", "ok")
    assert cfg.code_dir == str(code)


def test_command_from_the_environment(code):
    env = {"TRAINSTACK_COMMAND": json.dumps(["python", "standin.py", "ok"]), "TRAINSTACK_CODE_DIR": str(code)}
    assert load_config(["--run-uri", "file:///tmp/x"], env=env).command == ("python", "standin.py", "ok")


@pytest.mark.parametrize(("argv", "env", "names"), [
    (["--", "no-such-program-xyz"], {}, ["run.command", "no-such-program-xyz", "not found on PATH"]),
    (["--", "./run.sh"], {}, ["run.command", "./run.sh", "not an executable file"]),
    (["--", "python", "trian.py"], {}, ["run.command", "trian.py", "not in"]),
    (["--model", "pkg.mod:build", "--", "python", "standin.py"], {}, ["--model", "run.model", "run.command"]),
    (["--synthetic", "--", "python", "standin.py"], {}, ["run.synthetic", "run.command"]),
    (["--"], {}, ["nothing after it"]),
    (["--steps", "500", "--", "python", "standin.py"], {}, ["--steps", "run.steps", "does not apply"]),
    (["--batch-size=8", "--", "python", "standin.py"], {}, ["--batch-size", "run.batchSize"]),
    (["--", "python", "standin.py"], {"TRAINSTACK_STEPS": "5000"}, ["--steps", "TRAINSTACK_STEPS", "5000"]),
    (["--", "python", "standin.py"], {"TRAINSTACK_EXTRA_ARGS": "--lm-dim 32"}, ["--lm-dim", "run.extraArgs"]),
    (["--", "python", "standin.py"], {"TRAINSTACK_EXTRA_ARGS": "--learning-rate 0.1"}, ["--learning-rate"]),
    (["--", "python", "standin.py"], {"TRAINSTACK_EXTRA_ARGS": "--input-priority idle"},
     ["--input-priority", "run.extraArgs", "its own input pipeline"]),
    ([], {"TRAINSTACK_COMMAND": "python train.py"}, ["TRAINSTACK_COMMAND", "run.command", "JSON list"]),
])
def test_bad_commands_are_one_line_naming_the_key(code, argv, env, names):
    with pytest.raises(ConfigError) as e:
        load_config(["--run-uri", "file:///tmp/x", "--code-dir", str(code), *argv], env=env)
    message = str(e.value)
    assert "\n" not in message
    for name in names:
        assert name in message, message


def test_the_stacks_defaults_and_switched_off_cadences_are_no_refusal(code):
    # What a machine's env file always carries (the defaults, 0 for an off cadence) is no user's choice.
    env = {"TRAINSTACK_STEPS": "1000", "TRAINSTACK_BATCH_SIZE": "64", "TRAINSTACK_CHECKPOINT_EVERY_STEPS": "0",
           "TRAINSTACK_DATA_DIR": "/data/stage"}
    cfg = load_config(["--run-uri", "file:///tmp/x", "--code-dir", str(code), "--", "python", "standin.py"], env=env)
    assert cfg.command == ("python", "standin.py")


def test_help_shows_the_command_and_a_bare_command_is_told_about_the_double_dash(code):
    from trainer.config import build_parser

    assert "[-- COMMAND ...]" in build_parser().format_usage()
    p = subprocess.run([sys.executable, "-m", "trainer", "--run-uri", "file:///tmp/x", "python", "train.py"], cwd=REPO,
                       env=trainer_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown option python train.py" in p.stderr, p.stderr
    assert "put -- before it: -- python train.py" in p.stderr, p.stderr


def test_program_not_found_exits_2_with_one_line(code, tmp_path):
    p = subprocess.run([sys.executable, "-m", "trainer", "--run-uri", f"file://{tmp_path}/run", "--code-dir", str(code),
                        "--", "no-such-program-xyz"], cwd=REPO, env=trainer_env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.command" in lines[0] and "no-such-program-xyz" in lines[0], p.stderr
    assert not (tmp_path / "run").exists()  # nothing written to the run


# -- the working folder and the outputs --


def test_the_command_runs_in_a_copy_of_the_code_and_its_outputs_are_kept_across_attempts(code, tmp_path):
    # The first attempt is stopped; the second finds outputs/ as the first left it, in a fresh copy
    # of the code folder, which itself is never written.
    uri = f"file://{tmp_path}/run"
    work = tmp_path / "work"
    t = Trainer(uri, "--code-dir", str(code), "--work-dir", str(work), "--", "python", "standin.py", "wait")
    t.wait_event("standin_ready", timeout=60)
    t.signal()
    assert t.wait(timeout=60) == exits.PREEMPTED, t.stderr
    kept = tmp_path / "run" / "outputs"
    assert (kept / "stopped.txt").read_text() == "7"  # a preempted run keeps its outputs
    assert (work / "code" / "logs" / "x").read_text() == str(work / "code")  # it ran in the copy
    rc, _, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "ok", timeout=60)
    assert rc == 0, err
    assert (kept / "seen.txt").read_text() == "stopped.txt"  # the second attempt started with the first's outputs
    assert sorted(p.name for p in code.iterdir()) == ["standin.py"]  # the code folder was never written


# -- endings --


def test_exit_0_uploads_the_model_and_writes_complete_with_the_metrics(code, tmp_path):
    uri = f"file://{tmp_path}/run"
    rc, events, err = run_trainer(uri, "--code-dir", str(code), "--price-per-hour", "3600", "--", "python", "standin.py",
                                  "ok", timeout=60)
    assert rc == 0, err
    assert kinds(events)[0] == layout.STARTED and kinds(events)[-1] == layout.FINISHED, kinds(events)
    assert (tmp_path / "run" / "model" / "weights.bin").read_bytes() == b"model"
    done = json.loads((tmp_path / "run" / layout.COMPLETE).read_text())
    assert done["step"] == 10 and done["metrics"]["accuracy"] == 0.875 and done["metrics"]["val_accuracy"] == 0.75
    # The run's cost, as for the trainer's own loop: the attempt's machine time at the stack's price.
    # (A dear price, so that the seconds it ran are whole cents: COMPLETE rounds hours to 4 places.)
    assert 0 < done["machine_hours"] < 0.1 and done["cost_usd"] > 0
    assert done["cost_usd"] == pytest.approx(done["machine_hours"] * 3600, abs=0.2)
    assert [e["epoch"] for e in store_events(uri) if e["event"] == "epoch"] == [1]
    started = store_events(uri)[0]
    assert started["mode"] == "script" and started["config"]["model"] is None, started  # not the loop's "mlp"
    assert not [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]  # no lock file left
    # A second start finds the run complete and runs nothing, and says so now, of the run's last attempt.
    rc, events, _ = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "3", timeout=60)
    assert rc == 0 and kinds(events) == [layout.ALREADY_COMPLETE]
    assert events[0]["time"] > done["finished_at"] and events[0]["attempt"] == 1, (events, done)
    assert events[0]["ended_at"] == done["finished_at"]


@pytest.mark.parametrize(("mode", "rc"), [("3", 1), ("78", 78)])
def test_a_failing_command_is_a_failed_event(code, tmp_path, mode, rc):
    uri = f"file://{tmp_path}/run"
    got, events, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", mode, timeout=60)
    assert got == rc, err
    failed = [e for e in store_events(uri) if e["event"] == layout.FAILED_EVENT]
    assert len(failed) == 1 and failed[0]["exit_code"] == int(mode) and "standin.py" in failed[0]["reason"]
    assert not (tmp_path / "run" / layout.COMPLETE).exists()
    assert not (tmp_path / "run" / "model").exists()  # what it saved is no model until it exits 0
    if rc == 1:
        # No machine retries a local run: ops status says what to do.
        from ops import status

        st = status.read_status(uri)
        assert st.state == "STOPPED" and "fix the cause and run the same command" in st.detail, st.detail
        assert "retries" not in st.detail


def test_sigterm_is_forwarded_and_143_is_preempted(code, tmp_path):
    uri = f"file://{tmp_path}/run"
    t = Trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "wait")
    t.wait_event("standin_ready", timeout=60)
    t.signal()
    assert t.wait(timeout=60) == exits.PREEMPTED, t.stderr
    stored = store_events(uri)
    pre = [e for e in stored if e["event"] == layout.PREEMPTED]
    assert len(pre) == 1 and pre[0]["step"] == 7 and pre[0]["exit_code"] == 143, stored
    assert kinds(stored)[-2:] == [layout.CHECKPOINT, layout.PREEMPTED]
    progress = json.loads((tmp_path / "run" / layout.PROGRESS_KEY).read_text())
    assert progress["metrics"] == {"loss": 1.5, "accuracy": 0.25} and progress["total"] == 10


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(code, tmp_path):
    (code / "stubborn.py").write_text(textwrap.dedent('''
        import json, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(json.dumps({"event": "standin_ready"}), flush=True)
        time.sleep(60)
    '''))
    uri = f"file://{tmp_path}/run"
    t = Trainer(uri, "--code-dir", str(code), "--stop-grace-s", "1", "--", "python", "stubborn.py")
    t.wait_event("standin_ready", timeout=60)
    t.signal()
    assert t.wait(timeout=30) == exits.PREEMPTED, t.stderr
    pre = [e for e in store_events(uri) if e["event"] == layout.PREEMPTED]
    assert len(pre) == 1 and pre[0]["exit_code"] == -9 and 1 <= pre[0]["seconds"] < 10, pre


def test_stop_key_cancels_the_run(code, tmp_path):
    uri = f"file://{tmp_path}/run"
    env = trainer_env()
    t = Trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "wait", env=env)
    t.wait_event("standin_ready", timeout=60)
    _store(uri).put_bytes(layout.STOP_KEY, json.dumps({"reason": "enough"}).encode())
    assert t.wait(timeout=60) == 0, t.stderr
    marker = json.loads((tmp_path / "run" / layout.CANCELLED).read_text())
    assert marker["reason"] == "enough" and marker["step"] == 7


def test_a_killed_trainer_takes_its_command_with_it(code, tmp_path):
    import os
    import signal
    import time

    t = Trainer(f"file://{tmp_path}/run", "--code-dir", str(code), "--", "python", "standin.py", "wait",
                env=trainer_env(STANDIN_SLEEP="300"))
    pid = t.wait_event("standin_ready", timeout=60)["pid"]
    t.signal(signal.SIGKILL)
    t.proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError("the command outlived its trainer")


def test_a_command_killed_by_the_signal_before_its_first_commit_is_preempted_at_the_newest_checkpoint(code, tmp_path):
    # A notice during the script's start-up (before `from trainer import fit` handles SIGTERM): the
    # run stands at the newest committed checkpoint of an earlier attempt.
    from trainer.checkpoint_store import CheckpointStore

    (code / "bare.py").write_text("import json, time\nprint(json.dumps({'event': 'standin_ready'}), flush=True)\n"
                                  "time.sleep(60)\n")
    uri = f"file://{tmp_path}/run"
    saved = tmp_path / "ckpt"
    saved.mkdir()
    (saved / "state.json").write_text("{}")
    CheckpointStore(_store(uri)).commit(42, str(saved))
    t = Trainer(uri, "--code-dir", str(code), "--", "python", "bare.py")
    t.wait_event("standin_ready", timeout=60)
    t.signal()
    assert t.wait(timeout=60) == exits.PREEMPTED, t.stderr
    pre = [e for e in store_events(uri) if e["event"] == layout.PREEMPTED]
    assert len(pre) == 1 and pre[0]["step"] == 42 and pre[0]["exit_code"] == -15, pre


def test_a_lease_taken_over_kills_the_command_at_once_and_exits_77(code, tmp_path):
    # Another machine took the run: the command must not commit again. The stand-in would sleep
    # 300 s and, on SIGTERM, report a checkpoint; killed at once, it does neither.
    import time

    uri = f"file://{tmp_path}/run"
    t = Trainer(uri, "--code-dir", str(code), "--lease-ttl-s", "16", "--", "python", "standin.py", "wait",
                env=trainer_env(STANDIN_SLEEP="300", TRAINSTACK_MACHINE_ID="machine-a"))
    t.wait_event("standin_ready", timeout=60)
    store = _store(uri)
    data, version = store.get_versioned(layout.LEASE_KEY)
    held = json.loads(data)
    taken = {**held, "holder": "machine-b/1", "token": "b", "epoch": held["epoch"] + 1, "nonce": "b",
             "expires": time.time() + 600}
    store.put_bytes_if(layout.LEASE_KEY, json.dumps(taken).encode(), version=version)
    assert t.wait(timeout=60) == exits.LEASE_HELD, t.stderr[-3000:]
    assert t.events[-1]["event"] == layout.FAILED_EVENT and "taken over (machine-b/1" in t.events[-1]["reason"], t.events
    assert layout.CHECKPOINT not in kinds(t.events)  # the command was killed, not asked to save
    assert json.loads(store.get_bytes(layout.LEASE_KEY))["holder"] == "machine-b/1"


# -- nothing lost in silence --


@pytest.mark.parametrize(("saved", "model_files", "said"), [
    # model.save("x.keras") in the working folder: the one model file is taken as model/x.keras.
    ("x.keras", 1, "its one model file, ./x.keras in its working folder, was taken as model/x.keras"),
    # Several, or a SavedModel folder: named, not guessed at.
    ("a.keras,export/saved_model.pb", 0, "it saved ./a.keras, ./export (./ is its working folder"),
    ("", 0, "the script saved no model in fit.model_dir()"),
])
def test_a_model_saved_outside_the_model_folder_is_taken_or_named(code, tmp_path, saved, model_files, said):
    from ops import runs, status

    uri = f"file://{tmp_path}/run"
    rc, events, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", f"save:{saved}",
                                  timeout=60)
    assert rc == 0, err
    done = json.loads((tmp_path / "run" / layout.COMPLETE).read_text())
    assert done["model_files"] == model_files and said in done["model_note"], done
    assert said in err  # the run's end says it too
    st = status.read_status(uri)
    assert st.state == "COMPLETE" and said in st.detail, st.detail
    assert ("model in file://" in st.detail) == bool(model_files), st.detail
    if model_files:
        assert (tmp_path / "run" / "model" / "x.keras").read_bytes() == b"saved"
        return
    assert "the script saved no model in fit.model_dir()" in st.detail
    with pytest.raises(runs.OpsError, match=r"the script saved no model in fit\.model_dir\(\)"):
        runs.pull(uri, tmp_path / "pulled")


def test_a_rerun_past_the_last_epoch_completes_with_the_metrics_its_restore_said(code, tmp_path):
    uri = f"file://{tmp_path}/run"
    rc, _, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "resumed", timeout=60)
    assert rc == 0, err
    done = json.loads((tmp_path / "run" / layout.COMPLETE).read_text())
    assert done["metrics"] == {"loss": 0.5, "accuracy": 0.875}, done


@pytest.mark.parametrize(("extra", "env_value", "expected"), [
    ("--checkpoint-every-seconds 0", "600", "0"),
    ("--checkpoint-every-seconds 45", "600", "45"),
    ("", "0", "0"),
])
def test_the_command_gets_the_cadence_the_trainer_resolved(code, tmp_path, extra, env_value, expected):
    uri = f"file://{tmp_path}/run"
    env = trainer_env(TRAINSTACK_EXTRA_ARGS=extra, TRAINSTACK_CHECKPOINT_EVERY_SECONDS=env_value)
    rc, _, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "ok", env=env, timeout=60)
    assert rc == 0, err
    assert (tmp_path / "run" / "outputs" / "cadence.txt").read_text() == expected


@pytest.mark.parametrize(("flags", "shown"), [((), False), (("--verbose",), True)])
def test_tensorflows_start_up_lines_of_the_command_are_hidden_unless_verbose(code, tmp_path, flags, shown):
    rc, _, err = run_trainer(f"file://{tmp_path}/run", "--code-dir", str(code), *flags, "--", "python", "standin.py",
                             "noise", timeout=60)
    assert rc == 0, err
    assert "the script's own warning" in err
    assert ("cpu_feature_guard.cc:210] This TensorFlow binary" in err) == shown, err


@pytest.mark.slow
def test_ctrl_c_to_the_process_group_is_preempted_every_time(code, tmp_path):
    # A terminal's Ctrl-C: SIGINT to the trainer and its command at once. The command commits and
    # exits 143 at once, often before the trainer's loop has forwarded anything; each try must still
    # end preempted, exit 143. Repeated: the ending was a race.
    import os
    import signal

    from tests.trainer.helpers import parse_events

    for i in range(6):
        uri = f"file://{tmp_path}/run-{i}"
        p = subprocess.Popen([sys.executable, "-m", "trainer", "--run-uri", uri, "--code-dir", str(code), "--",
                              "python", "standin.py", "int"], cwd=REPO, env=trainer_env(), start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in p.stdout:
            if "standin_ready" in line:
                break
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == exits.PREEMPTED, (i, err[-2000:])
        stored = store_events(uri)
        assert kinds(stored)[-1] == layout.PREEMPTED and stored[-1]["step"] == 7, (i, stored)
        assert layout.FAILED_EVENT not in kinds(stored) + kinds(parse_events(out)), (i, stored)


# -- several workers --


def _worker_env(index: int) -> dict:
    return trainer_env(TF_CONFIG=json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                             "task": {"type": "worker", "index": index}}))


def test_a_workers_parent_writes_nothing_to_the_run_and_the_chiefs_writes_it_all(code, tmp_path):
    uri = f"file://{tmp_path}/run"
    rc, events, err = run_trainer(uri, "--code-dir", str(code), "--work-dir", str(tmp_path / "w1"), "--", "python",
                                  "standin.py", "legacy", env=_worker_env(1), timeout=60)
    assert rc == 0, err
    assert kinds(events)[0] == layout.STARTED  # printed only
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())  # no lease, events, model
    assert (tmp_path / "w1" / "outputs" / "legacy.txt").read_text() == "1"  # tf.keras is Keras 2 on a cluster
    rc, _, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "legacy",
                             env=_worker_env(0), timeout=60)
    assert rc == 0, err
    assert (tmp_path / "run" / layout.COMPLETE).exists() and (tmp_path / "run" / "model" / "weights.bin").exists()
    assert (tmp_path / "run" / "outputs" / "legacy.txt").read_text() == "1"


def test_a_command_that_lost_its_cluster_exits_76_not_failed(code, tmp_path):
    # trainer.fit ends a script whose peer was lost with 76: no failure counted on this machine.
    rc, events, err = run_trainer(f"file://{tmp_path}/run", "--code-dir", str(code), "--", "python", "standin.py",
                                  "76", env=_worker_env(0), timeout=60)
    assert rc == exits.PEER_LOST, err
    assert events[-1]["event"] == layout.FAILED_EVENT and "lost its cluster" in events[-1]["reason"], events
