"""`python -m trainer` (and the test modules that run in its place), served warm for the tests.

Each trainer process the tests start spends about 4-5 s of CPU importing TensorFlow, Keras and
the trainer before its first step. This server imports them once and forks a child per run, as
`cli_server.py` does for the fake cloud CLIs (and with its call hand-over):

- the launcher (`trainer_client.py`, standard library only, `python -E -s -S`) sends its argv,
  environment, working directory, umask, signal mask and ignored signals, and passes its stdin,
  stdout and stderr as file descriptors (SCM_RIGHTS);
- the child takes them as its own (`os.environ` replaced whole, so C code's getenv sees the
  caller's), gets default signal dispositions, `sys.path` as `-m` builds it, fresh standard
  streams and a fresh NumPy seed, and runs the module with `runpy` as `__main__`;
- the server answers the launcher with the child's pid and a pidfd: the launcher relays every
  signal it can catch through it (never to a recycled pid). When the child ends, the server
  reaps it and sends the wait status: the launcher exits with the same code, or kills itself
  with the same signal (so `Popen.returncode` is -N as before);
- when the launcher goes away (SIGKILL, its machine powered off) the server kills the child at
  once; when the server goes away its children are killed (PR_SET_PDEATHSIG).

The server only imports: it never creates TensorFlow's eager context or runs an op (which
start TensorFlow's thread pools), and it runs with `OPENBLAS_NUM_THREADS=1` (NumPy's BLAS pool
is the one thread the imports start otherwise), so each fork copies a process of one thread.
It checks that before each fork; a server with more threads runs no child (the launcher runs
the plain process) and says so once on its stderr.

What differs from a plain process, so that the tests that depend on it keep one:

- the child leads its own process group: a signal to the launcher's group reaches it once,
  through the relay (in the group too, it would get it twice, and a second SIGINT aborts the
  trainer). SIGSTOP of the launcher does not stop it (no test freezes a trainer);
- the launcher's resource usage (`wait4`) is the launcher's own; the child's CPU is counted in
  the server's reaped children (`/proc/PID/stat` cutime, what `tests/cpu_profile.py` reads);
- TensorFlow is imported before the trainer's own start-up checks (`ended_before_start`), and
  NumPy's BLAS runs on one thread.

A run whose environment differs in what the imports read (`TF_CPP_*`, `KERAS_*`, the locale,
Python's own `PYTHON*` settings but PYTHONPATH), a `--verbose` run (it shows TensorFlow's
import lines), and one whose path finds other trainer sources than the server's (a code folder
with a `trainer/` of its own; a copy of the same files, a machine's unpacked code archive, is the
same code) run as the plain process, and so does a run of the user's own command
(`python -m trainer ... -- python train.py`: it imports no TensorFlow).

`python trainer_server.py SOCKET` serves until killed; `ensure_server()` starts one per test
process, on first use. The bench measures real start-ups and never uses it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import importlib.machinery
import io
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

if __package__:
    from devtools import cli_server
    from devtools.trainer_client import SOCKET_VAR, command  # noqa: F401 - command: the tests' way to a served run
else:  # `python trainer_server.py`: this folder is the path's first entry
    import cli_server
    from trainer_client import SOCKET_VAR

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_TF_LOG_LEVEL = "2"  # what `python -m trainer` sets when the caller did not
IMPORT_READS = ("TF_CPP_", "TF_ENABLE_", "TF_USE_", "KERAS_")  # variables TensorFlow's and Keras's imports read

_server: tuple = ()
_lock = threading.Lock()


def ensure_server(*, wait: bool = True) -> str:
    """This process's server socket path, starting the server on first use.

    With `wait`, once the server answers (its imports take about 3 s of CPU: less than the plain
    process a first run would otherwise be); without, at once. A run started before the server
    answers runs as the plain process."""
    global _server
    with _lock:
        if not _server or _server[0].poll() is not None:
            env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
            env.pop(SOCKET_VAR, None)
            # -E: the server's own path is the interpreter's; each child builds the caller's.
            _server = cli_server.start_server([sys.executable, "-E", str(Path(__file__).resolve())], "warm-trainer",
                                              "the warm trainer server", env=env, wait=False)
        proc, path = _server
    deadline = time.monotonic() + 120
    while wait and not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return path


# ---------------------------------------------------------------- the server process

LIBRARIES = Path(sys.prefix).resolve()  # the interpreter's environment (a .venv inside the checkout)
BASE_PATH: list[str] = []  # the interpreter's own sys.path entries (stdlib, site-packages)
SERVED_PACKAGES: dict[str, tuple[str, str]] = {}  # the project's packages imported here: name -> file, digest


def _why_plain(request: dict) -> str | None:
    """Why this run cannot be served (it then runs as the plain process), or None."""
    env, args = request["env"], request["argv"]
    if request.get("module") is None:
        return "no module"
    for key in sorted(set(env) | set(os.environ)):
        if key in ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"):
            continue
        if key.startswith("PYTHON") and key in env:
            return f"{key} is set"
        # TensorFlow's and Keras's settings that their imports read (TF_CONFIG and the like are
        # read when the run asks: the caller's own reach the child).
        if key.startswith(IMPORT_READS):
            default = DEFAULT_TF_LOG_LEVEL if key == "TF_CPP_MIN_LOG_LEVEL" else None
            if env.get(key, default) != os.environ.get(key, default):
                return f"{key} differs"
    if _text_encoding(env) != _text_encoding(os.environ):
        return "its locale's encoding differs"
    if env.get("TRAINSTACK_VERBOSE") or "--verbose" in args:
        return "a verbose run shows TensorFlow's import"
    if "--" in args:
        return "a run of the user's own command imports no TensorFlow"
    path = _child_path(request)
    for name, (origin, digest) in SERVED_PACKAGES.items():
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        # Another copy of the same files (a machine's unpacked code archive) is the same code.
        if spec is None or spec.origin is None or (spec.origin != origin and _digest(spec.origin) != digest):
            return f"its path finds another {name}"
    return None


def _digest(origin: str) -> str:
    """The sources of the package whose `__init__.py` (or of the module) is `origin`."""
    top = Path(origin)
    files = sorted(top.parent.rglob("*.py")) if top.name == "__init__.py" else [top]
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative_to(top.parent)}\0".encode())
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def _text_encoding(env) -> str:
    """The encoding the interpreter gives the standard streams in `env`'s locale: UTF-8 unless
    the locale names another (the C and POSIX locales are coerced to UTF-8, PEP 538)."""
    name = next((env[k] for k in ("LC_ALL", "LC_CTYPE", "LANG") if env.get(k)), "C")
    if name in ("C", "POSIX") or name.lower().replace("-", "").endswith("utf8"):
        return "utf-8"
    return name


def _child_path(request: dict) -> list[str]:
    """sys.path as `python -m` builds it in the caller's working directory and PYTHONPATH."""
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    return [request["cwd"], *extra, *BASE_PATH]


def _standard_streams(env: dict) -> None:
    """sys.stdin, stdout and stderr over the caller's descriptors, as the interpreter makes them:
    stdout line-buffered on a terminal, stderr line-buffered, PYTHONUNBUFFERED honoured."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    made = []
    for fd, old in ((0, sys.__stdin__), (1, sys.__stdout__), (2, sys.__stderr__)):
        write = fd != 0
        buffer = open(fd, "wb" if write else "rb", buffering=0 if unbuffered and write else -1,  # noqa: SIM115
                      closefd=False)  # a standard stream: open as long as the process
        stream = io.TextIOWrapper(buffer, encoding=old.encoding, errors=old.errors, newline="\n",
                                  line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)),
                                  write_through=unbuffered and write)
        stream.mode = "w" if write else "r"
        made.append(stream)
    sys.stdin, sys.stdout, sys.stderr = made
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made


def _become(request: dict, fds: list[int], server_pid: int) -> None:
    """The forked child becomes the caller's `python -m MODULE`, up to running the module."""
    os.setpgid(0, 0)
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: ends with the server
    if os.getppid() != server_pid:
        os._exit(1)
    ignored = set(request["ignored"])
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)
    for s in (signal.SIGPIPE, signal.SIGXFSZ):  # as the interpreter's start-up does
        signal.signal(s, signal.SIG_IGN)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    cli_server.take_call(request, fds)
    sys.path[:] = _child_path(request)
    importlib.invalidate_caches()
    sys.argv = [request["module"], *request["argv"]]  # runpy puts the module's file first
    sys.orig_argv = [sys.executable, "-m", request["module"], *request["argv"]]
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    _standard_streams(request["env"])
    if "numpy" in sys.modules:  # NumPy's global generator was seeded once, in the server
        sys.modules["numpy"].random.seed()
    signal.pthread_sigmask(signal.SIG_SETMASK, request["mask"])


def _run(module: str) -> int:
    """Run `module` as `__main__`; the exit code a `python -m` process would end with."""
    import atexit
    import runpy

    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # the interpreter then ends by SIGINT
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # noqa: SLF001 - what the interpreter does at exit: join the threads
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    return code & 0xFF


def _warm_up() -> None:
    """Import what `python -m trainer` imports before its first step, as it imports it
    (`imports_kept`: collector off, then frozen; TensorFlow's start-up lines dropped)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_TF_LOG_LEVEL)
    from trainer import __main__ as entry

    with entry.imports_kept(), entry.quiet_native_stderr():
        import trainer.config  # noqa: F401
        import trainer.loop_attempt  # noqa: F401
        import trainer.run_attempt  # noqa: F401
        import trainer.signals  # noqa: F401
    # `python -m trainer` runs trainer/__main__.py as `__main__` only, never imported as a module
    # (runpy warns when it finds it imported already).
    del sys.modules["trainer.__main__"]
    del sys.modules["trainer"].__main__
    for name, module in sys.modules.items():
        file = getattr(module, "__file__", None)
        # The project's packages (this folder's own modules, imported by file, are the server).
        # (A virtual environment inside the checkout holds libraries, not the project: scipy's extension
        # modules, imported under top-level names such as `_csparsetools`, are found by no path.)
        if "." not in name and name != "__main__" and file and Path(file).resolve().parent != HERE \
                and Path(file).resolve().is_relative_to(REPO) and not Path(file).resolve().is_relative_to(LIBRARIES):
            SERVED_PACKAGES[name] = (file, _digest(file))
    gc.collect()
    gc.freeze()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


class _Run:
    def __init__(self, conn: socket.socket, pid: int, pidfd: int):
        self.conn: socket.socket | None = conn
        self.pid, self.pidfd = pid, pidfd


def serve(path: str) -> None:
    BASE_PATH[:] = sys.path[1:]  # started with -E: the interpreter's entries after this folder
    sys.path.insert(0, str(REPO))
    _warm_up()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # answers from the moment the path exists
    # poll(2), not epoll: a forked child would share an epoll instance with the server.
    sel = selectors.PollSelector()
    sel.register(listener, selectors.EVENT_READ)
    runs: dict[int, _Run] = {}  # by the fd whose event concerns it: the launcher's socket, the pidfd
    while True:
        for key, _events in sel.select():
            if key.fileobj is listener:
                run = _start(listener, runs)
                if run is not None:
                    runs[run.conn.fileno()] = runs[run.pidfd] = run
                    sel.register(run.conn, selectors.EVENT_READ)
                    sel.register(run.pidfd, selectors.EVENT_READ)
                continue
            run = runs.get(key.fd)
            # An event of this batch may concern a descriptor closed earlier in it (its number
            # perhaps reused by a call accepted since): each is matched to its run's own.
            if run is not None and key.fileobj is run.conn:
                # The launcher sends nothing after its call: readable means it is gone.
                os.kill(run.pid, signal.SIGKILL)  # not reaped yet (below), so still its pid
                del runs[key.fd]
                sel.unregister(run.conn)
                run.conn.close()
                run.conn = None
            elif run is not None and key.fileobj == run.pidfd:
                pid, status, _usage = os.wait4(run.pid, os.WNOHANG)
                if pid == 0:
                    continue
                del runs[run.pidfd]
                sel.unregister(run.pidfd)
                os.close(run.pidfd)
                if run.conn is not None:
                    del runs[run.conn.fileno()]
                    sel.unregister(run.conn)
                    with contextlib.suppress(OSError):
                        run.conn.sendall(status.to_bytes(4, "big", signed=True))
                    run.conn.close()


_warned = False


def _start(listener: socket.socket, runs: dict[int, _Run]) -> _Run | None:
    """Accept one call and fork its child; None when the call runs as the plain process (the
    launcher is told so) or its caller left."""
    global _warned
    conn, _ = listener.accept()
    conn.settimeout(30)  # the launcher sends its call at once
    try:
        request, fds = cli_server.receive_call(conn)
    except (OSError, ValueError):
        conn.close()
        return None
    conn.settimeout(None)
    why, threads = _why_plain(request), _threads()
    if why is None and threads != 1:
        why = f"the warm trainer server has {threads} threads: trainers run as plain processes"
        if not _warned:
            print(why, file=sys.stderr, flush=True)
            _warned = True
    if why is not None:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.sendall((0).to_bytes(8, "big", signed=True))
        conn.close()
        return None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    server_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for sock in (listener, conn, *(run.conn for run in runs.values() if run.conn is not None)):
                sock.close()  # this process's copies only: the server keeps its own
            for fd in {run.pidfd for run in runs.values()}:
                os.close(fd)
            _become(request, fds, server_pid)
            code = _run(request["module"])
        except BaseException:  # noqa: BLE001 - a child that failed to start says why, on the caller's stderr
            with contextlib.suppress(Exception):
                traceback.print_exc()
                sys.stderr.flush()
        os._exit(code)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        socket.send_fds(conn, [pid.to_bytes(8, "big", signed=True)], [pidfd])
    except OSError:  # the launcher left: its child must not run on (reaped when its pidfd says so)
        os.kill(pid, signal.SIGKILL)
    return _Run(conn, pid, pidfd)


if __name__ == "__main__":
    serve(sys.argv[1])
