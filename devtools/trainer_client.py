"""`trainer_client.py MODULE ARGS...`: `python -m MODULE ARGS...` through the warm trainer server.

Standard library only (it starts with `python -E -s -S`): see `trainer_server.py`. It sends its
argv, environment (less `WARM_TRAINER_SOCKET`), working directory, umask, signal mask, ignored
signals and its stdin, stdout and stderr; it relays every signal it can catch to the server's
child for the run, and ends as the child ended: with its exit code, or killed by the same
signal. Without a server at `$WARM_TRAINER_SOCKET`, or when the server answers that this run
is not one it can serve, it becomes the plain `python -m MODULE ARGS...` (exec).

`script_main` is the same for `python SCRIPT ARGS...`: the interpreter a served script-mode
trainer runs the user's command with (`python -m trainer ... -- python train.py`).
"""

import contextlib
import os
import signal
import socket
import sys

if __package__:
    from devtools.cli_client import read_exact, send_call
else:  # `python trainer_client.py`: this folder is the path's first entry
    from cli_client import read_exact, send_call

SOCKET_VAR = "WARM_TRAINER_SOCKET"
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

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        send_call(conn, {**call, "env": env, "cwd": os.getcwd(),
                         "umask": _umask(), "mask": sorted(int(s) for s in mask), "ignored": ignored})
        head, fds, _flags, _addr = socket.recv_fds(conn, 8, 1)
        head += read_exact(conn, 8 - len(head)) if 0 < len(head) < 8 else b""
    except OSError:  # no server, or it went away before forking (ConnectionError is an OSError)
        conn.close()
        plain()
    pid = int.from_bytes(head, "big", signed=True) if len(head) == 8 else 0
    if pid <= 0 or not fds:  # the server runs no child for this call: the plain process runs it
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
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


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
