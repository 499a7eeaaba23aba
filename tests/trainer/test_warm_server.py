"""The warm trainer server (devtools/trainer_server.py) runs `python -m MODULE` as the plain process
does: the same facts seen from inside, exit codes, signals and their verdicts; the plain process
where it cannot; and no run outlives its launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import cli_server, trainer_server
from tests.trainer.helpers import FAST, REPO, committed_weights, max_abs_diff, run_trainer, trainer_env
from tests.userdata.helpers import wait_for

PROBE = '''
import ctypes, json, os, signal, sys, time

import numpy as np

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "usr1":  # before saying it is ready
        signal.signal(signal.SIGUSR1, lambda *_: sys.exit(7))
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    umask = os.umask(0)
    os.umask(umask)
    facts = {
        "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "cwd": os.getcwd(),
        "env": dict(os.environ), "c_getenv": getenv(b"PROBE_VALUE").decode(), "name": __name__,
        "umask": umask, "stdin": sys.stdin.read() if mode == "facts" else None,
        "signals": {s.name: str(signal.getsignal(s)) for s in
                    (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT)},
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "streams": [(s.encoding, s.errors, s.line_buffering, s.fileno()) for s in (sys.stdin, sys.stdout, sys.stderr)],
        "pid": os.getpid(), "pgid": os.getpgrp(), "random": float(np.random.random()),
    }
    print(json.dumps(facts), flush=True)
    print("to stderr", file=sys.stderr)
    if mode == "facts":
        sys.exit(3)
    time.sleep(600)  # until the test's signal (the test kills it at its end in any case)
'''


@pytest.fixture(scope="module")
def server() -> str:
    return trainer_server.ensure_server(wait=True)


@pytest.fixture
def probe(tmp_path) -> dict:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "warm_probe.py").write_text(PROBE)
    # TF_CONFIG: TensorFlow reads it when a run asks, not at import, so the caller's reaches the run.
    return trainer_env(PYTHONPATH=f"{tmp_path / 'code'}{os.pathsep}{REPO}", PROBE_VALUE="seen from C",
                       TF_CONFIG='{"task": {"type": "worker", "index": 1}}')


def _start(env: dict, mode: str, served: str | None, cwd=REPO, args=(), **kw) -> subprocess.Popen:
    if served is None:
        argv = [sys.executable, "-m", "warm_probe", mode, *args]
    else:
        argv, env = trainer_server.command("warm_probe", [mode, *args]), {**env, trainer_server.SOCKET_VAR: served}
    return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals, **kw)


def _default_signals() -> None:
    """The signals the tests send at their default disposition, as a foreground shell starts a command:
    the test process may have inherited them ignored (`nohup`; a background job ignores SIGINT), and an
    ignored signal stays ignored in the plain process and, passed on, in a served run."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_DFL)


def _facts(proc: subprocess.Popen) -> dict:
    return json.loads(proc.stdout.readline())


def _served(proc: subprocess.Popen, facts: dict) -> bool:
    """The plain launcher becomes the process (exec); a served run is another process."""
    return facts["pid"] != proc.pid


def test_a_served_run_sees_what_the_plain_process_sees(server, probe):
    seen = {}
    for mode, via in (("plain", None), ("served", server), ("served again", server)):
        proc = _start(probe, "facts", via)
        out, err = proc.communicate(input="the caller's stdin\n", timeout=120)
        seen[mode] = (proc.returncode, json.loads(out.splitlines()[0]), err)
        assert _served(proc, seen[mode][1]) == (via is not None)
    assert seen["plain"][0] == seen["served"][0] == 3
    assert seen["plain"][2] == seen["served"][2] == "to stderr\n"
    plain, served = seen["plain"][1], seen["served"][1]
    assert served["stdin"] == "the caller's stdin\n" and served["c_getenv"] == "seen from C"
    assert served["pid"] != plain["pid"] and served["random"] != seen["served again"][1]["random"]
    assert trainer_server.SOCKET_VAR not in served["env"]
    for fact in ("pid", "pgid", "random"):
        plain.pop(fact), served.pop(fact)
    assert served == plain


@pytest.mark.parametrize(("sig", "mode", "code"), [
    (signal.SIGTERM, "wait", -signal.SIGTERM),  # default disposition: killed, and so is the launcher
    (signal.SIGINT, "wait", -signal.SIGINT),  # KeyboardInterrupt uncaught: the interpreter ends by SIGINT
    (signal.SIGUSR1, "usr1", 7),  # the module's own handler decides
    (signal.SIGHUP, "wait", -signal.SIGHUP),
])
def test_a_signal_to_the_launcher_has_the_plain_process_verdict(server, probe, sig, mode, code):
    for via in (None, server):
        proc = _start(probe, mode, via)
        try:
            facts = _facts(proc)
            assert _served(proc, facts) == (via is not None)
            proc.send_signal(sig)
            proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.communicate()
        assert proc.returncode == code, (via, proc.returncode)


def test_a_run_killed_where_it_runs_ends_its_launcher_by_the_same_signal(server, probe):
    # SIGKILL sent to the run itself (the kernel's OOM killer, a kill -9 of its pid; a test that times
    # a stop in the trainer): the launcher ends by it too, as the plain process does, not with 1.
    for via in (None, server):
        proc = _start(probe, "wait", via)
        try:
            facts = _facts(proc)
            assert _served(proc, facts) == (via is not None)
            os.kill(facts["pid"], signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            proc.kill()
            _, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, (via, proc.returncode, err[-2000:])


def test_a_signal_to_the_launchers_group_reaches_the_run_once(server, probe):
    # The child leads its own group: the group's SIGINT reaches it through the launcher only (a
    # second SIGINT would abort the trainer), and its verdict is the plain process's.
    proc = _start(probe, "wait", server, start_new_session=True)
    try:
        facts = _facts(proc)
        assert _served(proc, facts) and facts["pgid"] == facts["pid"] != proc.pid
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        _out, err = proc.communicate()
    assert proc.returncode == -signal.SIGINT
    assert err.count("KeyboardInterrupt") == 1, err


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_run_whose_launcher_is_killed_ends(server, probe):
    proc = _start(probe, "wait", server)
    try:
        child = _facts(proc)["pid"]
        assert child != proc.pid and _alive(child)
        proc.kill()
        proc.wait(timeout=30)
        wait_for(lambda: not _alive(child), 30, "the served run to end with its launcher")
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("case", ["verbose", "other trainer", "no server", "PYTHONHASHSEED", "TF_ENABLE_ONEDNN_OPTS"])
def test_a_run_the_server_cannot_serve_runs_as_the_plain_process(server, probe, tmp_path, case):
    env, via, cwd, args = probe, server, REPO, ()
    if case == "verbose":
        env = {**env, "TRAINSTACK_VERBOSE": "1"}
    elif case == "other trainer":  # run in a code folder with a trainer of its own: first on the path
        cwd = tmp_path / "code"
        (cwd / "trainer").mkdir()
        (cwd / "trainer" / "__init__.py").write_text("")
    elif case == "no server":
        via = str(tmp_path / "nothing-listens-here")
    else:  # read at import: the server's import did not see the caller's
        env = {**env, case: "7" if case == "PYTHONHASHSEED" else "0"}
    proc = _start(env, "facts", via, cwd=cwd, args=args)
    out, err = proc.communicate(input="", timeout=120)
    facts = json.loads(out.splitlines()[0])
    assert proc.returncode == 3, err
    assert not _served(proc, facts)


def _conversions(server: str) -> list[list]:
    """The AutoGraph conversions the server's children logged (file, line, name, options)."""
    log = Path(server + ".autograph")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_run_after_the_first_converts_nothing_the_server_has_and_trains_as_the_plain_process(server, tmp_path):
    args = [*FAST[:1], "--steps", "20", *FAST[3:]]
    before = len(_conversions(server))
    code, _, err = run_trainer(f"file://{tmp_path}/first", *args)
    assert code == 0, err
    first = _conversions(server)[before:]
    # The trainer's own step and data functions, and Keras's and TensorFlow's export signatures.
    files = {Path(line[0]).name for line in first}
    assert {"step.py", "data.py", "metrics.py"} <= files, first
    code, _, err = run_trainer(f"file://{tmp_path}/second", *args)
    assert code == 0, err
    again = _conversions(server)[before + len(first):]
    assert again == [], again  # each was converted in the server after the first run: cache hits
    code, _, err = run_trainer(f"file://{tmp_path}/plain", *args, served=False)
    assert code == 0, err
    weights = {name: committed_weights(f"file://{tmp_path}/{name}", 20, tmp_path / f"w-{name}")
               for name in ("first", "second", "plain")}
    assert max_abs_diff(weights["second"], weights["plain"]) == 0.0
    assert max_abs_diff(weights["first"], weights["plain"]) == 0.0


def test_a_server_with_more_than_one_thread_forks_no_run(probe, tmp_path):
    # NumPy's BLAS pool at two threads: the server must not fork (the launcher runs the plain process).
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    server, path = cli_server.start_server([sys.executable, "-E", str(trainer_server.HERE / "trainer_server.py")],
                                           "warm-trainer-threads", "a server with threads", env=env)
    try:
        with open(f"/proc/{server.pid}/status") as f:
            threads = int(next(line.split()[1] for line in f if line.startswith("Threads:")))
        assert threads >= 2, threads  # NumPy's pool (and SciPy's, where TensorFlow's import finds SciPy)
        proc = _start(probe, "facts", path)
        out, err = proc.communicate(input="", timeout=120)
        assert proc.returncode == 3 and not _served(proc, json.loads(out.splitlines()[0])), err
    finally:
        server.kill()
        server.wait()


def test_a_copy_of_the_servers_trainer_is_served(server, probe, tmp_path):
    # A machine runs the trainer unpacked from its code archive: the same files, another folder.
    code = tmp_path / "code"
    for source in (REPO / "trainer").rglob("*.py"):
        copy = code / source.relative_to(REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(source.read_bytes())
    proc = _start(probe, "facts", server, cwd=code)
    out, err = proc.communicate(input="", timeout=120)
    assert proc.returncode == 3 and _served(proc, json.loads(out.splitlines()[0])), err
    copy.write_bytes(copy.read_bytes() + b"\n# changed\n")  # one file differs: not the server's trainer
    proc = _start(probe, "facts", server, cwd=code)
    out, err = proc.communicate(input="", timeout=120)
    assert proc.returncode == 3 and not _served(proc, json.loads(out.splitlines()[0])), err


@pytest.mark.parametrize("args", [["--stpes", "5"], ["--help"]])
def test_the_served_trainer_says_what_the_plain_one_says(server, tmp_path, args):
    # Its output whole: a served run adds no line of its own (runpy's warnings, the server's).
    seen = {}
    for mode, via in (("plain", None), ("served", server)):
        argv = [sys.executable, "-m", "trainer", "--run-uri", f"file://{tmp_path}/run", *args]
        env = trainer_env()
        if via is not None:
            argv, env = trainer_server.command("trainer", argv[3:]), {**env, trainer_server.SOCKET_VAR: via}
        p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        seen[mode] = (p.returncode, p.stdout, p.stderr)
    assert seen["served"] == seen["plain"]
    assert seen["plain"][0] == (2 if "--stpes" in args else 0) and (seen["plain"][1] or seen["plain"][2])


# -- the user's script of a script-mode trainer (`python -m trainer ... -- python train.py`) --

FIT_SCRIPT = '''
import json, os, signal, sys, time

print(json.dumps({
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path0": sys.path[0], "file": __file__, "cwd": os.getcwd(),
    "name": __name__, "executable": sys.executable, "spec": repr(__spec__), "package": __package__,
    "pid": os.getpid(), "ppid": os.getppid(), "tensorflow": "tensorflow" in sys.modules,
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
mode = sys.argv[1]
if mode == "raise":
    raise ValueError("the script's own error")
if mode == "term":  # fit's way with a stop signal: exit 143
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
if mode in ("term", "wait"):
    with open(os.environ["READY_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
sys.exit(4)
'''


@pytest.fixture
def fit_script(tmp_path) -> tuple[dict, Path]:
    """The script in `code/sub/`, and the environment the trainer gives it (the trainer on its path)."""
    (tmp_path / "code" / "sub").mkdir(parents=True)
    (tmp_path / "code" / "sub" / "fit_probe.py").write_text(FIT_SCRIPT)
    return trainer_env(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
                       READY_FILE=str(tmp_path / "ready")), tmp_path / "code"


@pytest.mark.parametrize("mode", ["exit", "raise"])
def test_a_served_script_runs_as_the_plain_one(server, fit_script, mode):
    env, code = fit_script
    seen = {}
    for via, python in (("plain", sys.executable), ("served", trainer_server.script_launcher(server))):
        p = subprocess.run([python, "sub/fit_probe.py", mode, "two words"], cwd=code, env=env, capture_output=True,
                           text=True, timeout=120)
        facts = json.loads(p.stdout.splitlines()[0])
        seen[via] = (p.returncode, facts, p.stdout.splitlines()[1:], p.stderr)
    (plain_rc, plain, plain_out, plain_err), (rc, served, out, err) = seen["plain"], seen["served"]
    # Served: forked from the server, TensorFlow already imported; plain: the interpreter's own process.
    assert served.pop("tensorflow") and not plain.pop("tensorflow")
    assert served.pop("ppid") == trainer_server._server[0].pid != plain.pop("ppid")
    served.pop("pid"), plain.pop("pid")
    assert served == plain
    assert plain["argv"] == ["sub/fit_probe.py", mode, "two words"] and plain["path0"] == str(code / "sub")
    assert plain["file"] == str(code / "sub" / "fit_probe.py") and plain["name"] == "__main__"
    assert (rc, out, err) == (plain_rc, plain_out, plain_err)
    assert rc == (4 if mode == "exit" else 1)
    assert err == "to stderr\n" if mode == "exit" else err.endswith("ValueError: the script's own error\n"), err


@pytest.mark.parametrize(("mode", "code"), [("term", 143), ("wait", -signal.SIGTERM)])
def test_a_signal_to_a_served_scripts_launcher_has_the_plain_verdict(server, fit_script, tmp_path, mode, code):
    env, folder = fit_script
    for python in (sys.executable, trainer_server.script_launcher(server)):
        (tmp_path / "ready").unlink(missing_ok=True)
        proc = subprocess.Popen([python, "sub/fit_probe.py", mode], cwd=folder, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=_default_signals)
        try:
            wait_for(lambda: (tmp_path / "ready").exists(), 60, "the script to start")
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.communicate()
        assert proc.returncode == code, (python, proc.returncode)


def test_a_script_the_server_cannot_serve_runs_the_plain_interpreter(server, fit_script, tmp_path):
    env, code = fit_script
    launcher = trainer_server.script_launcher(server)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("")  # the interpreter's start-up imports it
    # Read at import: "1" goes to the Keras 2 sibling (below), TensorFlow's other spelling runs plain.
    for argv, extra in (([launcher, "sub/fit_probe.py", "exit"], {"TF_USE_LEGACY_KERAS": "true"}),
                        ([launcher, "sub/fit_probe.py", "exit"], {"PYTHONPATH": f"{tmp_path / 'site'}:{REPO}"}),
                        ([launcher, "-u", "sub/fit_probe.py", "exit"], {})):  # an option of the interpreter's
        p = subprocess.run(argv, cwd=code, env={**env, **extra}, capture_output=True, text=True, timeout=120)
        facts = json.loads(p.stdout.splitlines()[0])
        assert p.returncode == 4 and facts["argv"] == ["sub/fit_probe.py", "exit"], p.stderr
        assert not facts["tensorflow"] and facts["ppid"] == os.getpid(), extra  # the launcher became it (exec)


KERAS2_SCRIPT = '''
import json, os, sys
before = "tensorflow" in sys.modules
import tensorflow as tf
print(json.dumps({"before": before, "model": tf.keras.Model.__module__, "ppid": os.getppid()}), flush=True)
'''


def test_a_keras_2_call_is_served_by_a_sibling_imported_with_keras_2(server, fit_script):
    # TF_USE_LEGACY_KERAS=1 is read at TensorFlow's import: the server starts a sibling imported with it.
    env, code = fit_script
    (code / "keras2.py").write_text(KERAS2_SCRIPT)
    seen = {}
    for via, python in (("plain", sys.executable), ("served", trainer_server.script_launcher(server))):
        p = subprocess.run([python, "keras2.py"], cwd=code, env={**env, "TF_USE_LEGACY_KERAS": "1"},
                           capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr
        seen[via] = json.loads(p.stdout.splitlines()[-1])
    assert seen["served"]["before"] and not seen["plain"]["before"]
    assert seen["served"]["model"] == seen["plain"]["model"] == "tf_keras.src.engine.training"
    with open(f"/proc/{seen['served']['ppid']}/cmdline") as f:
        parent = f.read().split("\0")
    assert trainer_server.keras2_server(server) in parent and seen["served"]["ppid"] != trainer_server._server[0].pid
    # `python -m MODULE` too (the trainer of a Keras 2 run), once the sibling answers.
    (code / "warm_probe.py").write_text(PROBE)
    proc = _start({**env, "TF_USE_LEGACY_KERAS": "1", "PYTHONPATH": f"{code}{os.pathsep}{REPO}", "PROBE_VALUE": "-"},
                  "facts", server)
    out, err = proc.communicate(input="", timeout=120)
    assert proc.returncode == 3, err
    facts = json.loads(out.splitlines()[0])
    assert _served(proc, facts) and facts["env"]["TF_USE_LEGACY_KERAS"] == "1"


@pytest.mark.parametrize("given", ["after --", "TRAINSTACK_COMMAND"])  # a laptop's run, a machine's
def test_a_served_script_mode_trainer_serves_its_script_and_it_ends_with_the_trainer(server, fit_script, tmp_path,
                                                                                      given):
    env, code = fit_script
    command = ["python", "sub/fit_probe.py", "wait"]
    args = ["--run-uri", f"file://{tmp_path}/run", "--code-dir", str(code)]
    if given == "after --":
        args += ["--", *command]
    else:
        env = {**env, "TRAINSTACK_COMMAND": json.dumps(command)}
    argv, env = trainer_server.command("trainer", args), {**env, trainer_server.SOCKET_VAR: server}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), 120, "the trainer's script to start")
        script = int((tmp_path / "ready").read_text())
        with open(f"/proc/{script}/status") as f:
            ppid = int(next(line.split()[1] for line in f if line.startswith("PPid:")))
        assert ppid == trainer_server._server[0].pid  # forked from the server: served
        proc.kill()  # the trainer's launcher: the server kills the trainer, its script's launcher dies with it
        proc.wait(timeout=30)
        wait_for(lambda: not _alive(script), 30, "the served script to end with its trainer")
    finally:
        proc.kill()
        proc.communicate()
