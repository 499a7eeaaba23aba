"""CPU seconds of a 60-step trainer run, plain against served warm (devtools/trainer_server.py), by hand.

    python -m tests.warm_trainer_cpu [PAIRS]      # default 10 pairs, plain and served alternating

A plain run's CPU is its process's (`wait4`). A served run's is the launcher's (`wait4`) and what
the server's reaped children and the server itself spent during the run (`/proc/PID/stat`: the
child is reaped before the launcher is answered). The server's own start (its imports, once per
test process) is printed apart.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from devtools import trainer_server
from tests.trainer.helpers import FAST, REPO, trainer_env

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return sum(int(x) for x in stat[stat.rfind(")") + 2:].split()[11:15]) / _TICK


def _run(argv: list[str], env: dict) -> float:
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read()
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:6]} ended {proc.returncode}: {err[-2000:]!r}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    start = time.monotonic()
    path = trainer_server.ensure_server(wait=True)
    server = trainer_server._server[0].pid
    print(f"server started: {_proc_cpu(server):.2f} CPU-s, {time.monotonic() - start:.1f} s", flush=True)
    plain, served = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            args = ["--run-uri", f"file://{tmp}/plain-{i}", *FAST]
            plain.append(_run([sys.executable, "-m", "trainer", *args], trainer_env()))
            args = ["--run-uri", f"file://{tmp}/served-{i}", *FAST]
            before = _proc_cpu(server)
            launcher = _run(trainer_server.command("trainer", args), trainer_env(WARM_TRAINER_SOCKET=path))
            served.append(launcher + _proc_cpu(server) - before)
            print(f"pair {i}: plain {plain[-1]:.2f}, served {served[-1]:.2f} (launcher {launcher:.2f})", flush=True)
    for name, xs in (("plain", plain), ("served", served)):
        print(f"{name}: median {statistics.median(xs):.2f} CPU-s, min {min(xs):.2f}, max {max(xs):.2f}")
    print(f"served / plain (medians): {statistics.median(served) / statistics.median(plain):.2f}; "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
