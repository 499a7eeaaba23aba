"""`trainer_client.py MODULE ARGS...`: `python -m MODULE ARGS...` through the warm trainer server.

Standard library only (it starts with `python -E -s -S`): see `trainer_server.py`. It sends its
argv, environment (less `WARM_TRAINER_SOCKET`), working directory, umask, signal mask, ignored
signals and its stdin, stdout and stderr; it relays every signal it can catch to the server's
child for the run, and ends as the child ended: with its exit code, or killed by the same
signal. Without a server at `$WARM_TRAINER_SOCKET`, or when the server answers that this run
is not one it can serve, it becomes the plain `python -m MODULE ARGS...` (exec). A call with
`TF_USE_LEGACY_KERAS=1` goes to the server's Keras 2 sibling (`trainer_server.py` says how).

`script_main` is the same for `python SCRIPT ARGS...`: the interpreter a served script-mode
trainer runs the user's command with (`python -m trainer ... -- python train.py`).
"""

import contextlib
import os
import signal
import socket
import sys
import time

if __package__:
    from devtools.cli_client import read_exact, send_call
else:  # `python trainer_client.py`: this folder is the path's first entry
    from cli_client import read_exact, send_call

SOCKET_VAR = "WARM_TRAINER_SOCKET"
# TensorFlow reads TF_USE_LEGACY_KERAS at its import: a call with it set to 1 (a Keras 2 fit script, the
# trainer of a Keras 2 run) goes to a sibling server imported with it, at the server's socket + KERAS2_SUFFIX.
# The first such call asks the server, which starts the sibling and answers ASK_KERAS2.
KERAS2_VAR, KERAS2_SUFFIX, ASK_KERAS2 = "TF_USE_LEGACY_KERAS", ".keras2", -1
KERAS2_START_S = 120  # the sibling's imports: about 3 s of CPU, longer on a loaded machine
# SIGKILL and SIGSTOP cannot be caught; SIGCHLD would be this process's own (it has no children).
NOT_RELAYED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
# Python itself ignores these at start-up: the run's process gets the same from the server.
PYTHON_IGNORES = {signal.SIGPIPE, signal.SIGXFSZ}


def main() -> int:
    module, args = sys.argv[1], sys.argv[2:]
    env = dict(os.environ)
    path = env.pop(SOCKET_VAR, "")
    return run({"module": module, "argv": args}, path, env, [sys.executable, "-m", module, *args], f"python -m {module}")


def script_main(path: str) -> int:
    """The warm stand-in for `python` that the server gives a served script-mode trainer as its
    `sys.executable`: `python SCRIPT ARGS...` through the server at `path` when SCRIPT is a file,
    the plain interpreter with the same arguments for anything else (an option such as `-u`, `-m`
    or `-c`, a folder or zip archive, the interactive interpreter)."""
    args = sys.argv[1:]
    plain = [sys.executable, *args]
    if not args or args[0].startswith("-") or not os.path.isfile(args[0]) or args[0].endswith((".zip", ".pyz")):
        os.execv(sys.executable, plain)
    return run({"script": args[0], "argv": args[1:]}, path, dict(os.environ), plain, f"python {args[0]}")


def run(call: dict, path: str, env: dict, plain_argv: list[str], what: str) -> int:
    """Run `call` (a module or a script, with its arguments) in a child of the server at `path`;
    without one, or when it will not serve the call, become `plain_argv` (exec)."""
    relayed = [s for s in signal.valid_signals() if s not in NOT_RELAYED]
    ignored = [int(s) for s in relayed if s not in PYTHON_IGNORES and signal.getsignal(s) == signal.SIG_IGN]
    # Held until the child's pidfd is here, then relayed: a signal sent during the hand-over is not lost.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, relayed)

    def plain() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.execve(plain_argv[0], plain_argv, env)

    request = {**call, "env": env, "cwd": os.getcwd(), "umask": _umask(), "mask": sorted(int(s) for s in mask),
               "ignored": ignored}
    keras2 = keras2_server(path) if env.get(KERAS2_VAR) == "1" else path
    conn, pid, fds = _ask(keras2 if os.path.exists(keras2) else path, request)
    if pid == ASK_KERAS2:  # the server has started its Keras 2 sibling: the call goes there once it answers
        conn.close()
        deadline = time.monotonic() + KERAS2_START_S
        while not os.path.exists(keras2) and time.monotonic() < deadline:
            time.sleep(0.05)
        conn, pid, fds = _ask(keras2, request)
    if conn is None or pid <= 0 or not fds:  # no server, or it runs no child for this call: the plain process
        if conn is not None:
            conn.close()
        plain()
    pidfd = fds[0]

    def relay(signum, _frame) -> None:
        with contextlib.suppress(ProcessLookupError):  # the child has ended: its status is on its way
            signal.pidfd_send_signal(pidfd, signum)

    for s in relayed:
        with contextlib.suppress(OSError, ValueError):  # the C library's own real-time signals
            signal.signal(s, relay)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        status = int.from_bytes(read_exact(conn, 4), "big", signed=True)
    except ConnectionError:
        print(f"{what}: the warm trainer server went away (its child {pid} with it)", file=sys.stderr)
        return 1
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal: so is this process, and its parent sees the same -N
        if -code not in NOT_RELAYED:  # SIGKILL (the kernel's OOM killer, a kill -9) has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _ask(path: str, request: dict) -> tuple[socket.socket | None, int, list[int]]:
    """Send the call to the server at `path`: its connection, its answer (the child's pid; 0: run the
    plain process; ASK_KERAS2) and the child's pidfd; no connection when no server answered."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        send_call(conn, request)
        head, fds, _flags, _addr = socket.recv_fds(conn, 8, 1)
        head += read_exact(conn, 8 - len(head)) if 0 < len(head) < 8 else b""
    except OSError:  # no server, or it went away before forking (ConnectionError is an OSError)
        conn.close()
        return None, 0, []
    return conn, int.from_bytes(head, "big", signed=True) if len(head) == 8 else 0, fds


def keras2_server(path: str) -> str:
    """The socket of the server at `path`'s Keras 2 sibling (itself when `path` is that sibling's)."""
    return path if path.endswith(KERAS2_SUFFIX) else path + KERAS2_SUFFIX


def command(module: str, args: list[str]) -> list[str]:
    """The argv that runs `python -m MODULE ARGS` through the server named by `$WARM_TRAINER_SOCKET`
    in its environment (the plain process without one)."""
    return [sys.executable, "-E", "-s", "-S", os.path.abspath(__file__), module, *args]


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


if __name__ == "__main__":
    sys.exit(main())
