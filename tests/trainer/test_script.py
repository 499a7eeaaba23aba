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
    if mode == "wait":
        def stop(signum, frame):
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
    ([], {"TRAINSTACK_COMMAND": "python train.py"}, ["TRAINSTACK_COMMAND", "run.command", "JSON list"]),
])
def test_bad_commands_are_one_line_naming_the_key(code, argv, env, names):
    with pytest.raises(ConfigError) as e:
        load_config(["--run-uri", "file:///tmp/x", "--code-dir", str(code), *argv], env=env)
    message = str(e.value)
    assert "\n" not in message
    for name in names:
        assert name in message, message


def test_program_not_found_exits_2_with_one_line(code, tmp_path):
    p = subprocess.run([sys.executable, "-m", "trainer", "--run-uri", f"file://{tmp_path}/run", "--code-dir", str(code),
                        "--", "no-such-program-xyz"], cwd=REPO, env=trainer_env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.command" in lines[0] and "no-such-program-xyz" in lines[0], p.stderr
    assert not (tmp_path / "run").exists()  # nothing written to the run


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
    # A second start finds the run complete and runs nothing.
    rc, events, _ = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "3", timeout=60)
    assert rc == 0 and kinds(events) == [layout.ALREADY_COMPLETE]


@pytest.mark.parametrize(("mode", "rc"), [("3", 1), ("78", 78)])
def test_a_failing_command_is_a_failed_event(code, tmp_path, mode, rc):
    uri = f"file://{tmp_path}/run"
    got, events, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", mode, timeout=60)
    assert got == rc, err
    failed = [e for e in store_events(uri) if e["event"] == layout.FAILED_EVENT]
    assert len(failed) == 1 and failed[0]["exit_code"] == int(mode) and "standin.py" in failed[0]["reason"]
    assert not (tmp_path / "run" / layout.COMPLETE).exists()
    assert not (tmp_path / "run" / "model").exists()  # what it saved is no model until it exits 0


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
