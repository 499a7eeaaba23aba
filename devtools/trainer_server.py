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
same code) run as the plain process.

The user's own command of a served script-mode trainer (`python -m trainer ... -- python
train.py`, or a machine's `TRAINSTACK_COMMAND`: a Keras fit script, which imports TensorFlow) is
served too: a served trainer sees as `sys.executable` (what `python` names in its command) this
server's script launcher (`SOCKET.python`, `trainer_client.script_main`), which asks the
server for `python SCRIPT ARGS` in a child of its own: `sys.argv` `[SCRIPT, *ARGS]`,
`sys.path[0]` the script's folder, the script's code run as `__main__` with `__file__` its
absolute path, the caller's environment, working directory and streams, signals relayed. What the imports would read differently
(`TF_CPP_*` of a verbose run, a `sitecustomize` on its PYTHONPATH, which the interpreter's start-up
would import), an option before the script (`-u`, `-m`, `-c`) or no script file run the plain
interpreter, with the same arguments.

A call with `TF_USE_LEGACY_KERAS=1` (a Keras 2 fit script, or the trainer of a `run.keras: 2` run),
which TensorFlow reads at its import, goes to a sibling server imported with it, at this server's
socket + `.keras2`: the first such call asks this server, which starts the sibling (it ends with
this server) and answers the launcher to call there once it answers.
The trainer's `_die_with_parent` holds for the launcher, and the server kills the script's child
when its launcher goes away.

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
    from devtools import cli_server, warm_autograph

    # command: the tests' way to a served run
    from devtools.trainer_client import ASK_KERAS2, KERAS2_VAR, SOCKET_VAR, command, keras2_server  # noqa: F401
else:  # `python trainer_server.py`: this folder is the path's first entry
    import cli_server
    import warm_autograph
    from trainer_client import ASK_KERAS2, KERAS2_VAR, SOCKET_VAR, keras2_server

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
SOCKET: list[str] = []  # this server's socket path
LEARNED: list = []  # the AutoGraph conversions its children logged (warm_autograph.Learned)
SCRIPT_LAUNCHER: list[str] = []  # the served script-mode trainer's `python` (`script_launcher`), once written


def script_launcher(path: str) -> str:
    """The executable that stands in for `python SCRIPT ARGS` through the server at socket `path`."""
    return path + ".python"


def _write_script_launcher(path: str) -> str:
    launcher = script_launcher(path)
    # One interpreter word and one option word: all a #! line carries to the kernel.
    text = (f"#!{sys.executable} -ESs\n"
            f'"""`python SCRIPT ARGS` through the warm trainer server (devtools/trainer_server.py)."""\n'
            f"import sys\n"
            f"sys.path.insert(0, {str(HERE)!r})\n"
            f"from trainer_client import script_main\n"
            f"sys.exit(script_main({path!r}))\n")
    with open(launcher + ".tmp", "w") as f:
        f.write(text)
    os.chmod(launcher + ".tmp", 0o755)
    os.rename(launcher + ".tmp", launcher)
    return launcher


def _why_plain(request: dict) -> str | None:
    """Why this run cannot be served (it then runs as the plain process), or None."""
    env, args, script = request["env"], request["argv"], request.get("script")
    if request.get("module") is None and script is None:
        return "no module"
    for key in sorted(set(env) | set(os.environ)):
        if key in ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"):
            continue
        if key.startswith("PYTHON") and key in env:
            return f"{key} is set"
        # TensorFlow's and Keras's settings that their imports read (TF_CONFIG and the like are
        # read when the run asks: the caller's own reach the child).
        if key.startswith(IMPORT_READS):
            # The trainer sets the log level when the caller did not; a script is told it (or not: verbose).
            default = DEFAULT_TF_LOG_LEVEL if key == "TF_CPP_MIN_LOG_LEVEL" and script is None else None
            if env.get(key, default) != os.environ.get(key, default):
                return f"{key} differs"
    if _text_encoding(env) != _text_encoding(os.environ):
        return "its locale's encoding differs"
    if env.get("TRAINSTACK_VERBOSE") or (script is None and "--verbose" in args):
        return "a verbose run shows TensorFlow's import"
    path = _child_path(request)
    for name in ("sitecustomize", "usercustomize"):
        # The interpreter's start-up imports them from the caller's path (its first entry, the
        # script's folder or the working directory, is added after): the server's start-up did not.
        spec = importlib.machinery.PathFinder.find_spec(name, path[1:])
        served = getattr(sys.modules.get(name), "__file__", None)
        if spec is not None and spec.origin != served:
            return f"its path has a {name} of its own"
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
    """sys.path as `python -m` (or `python SCRIPT`: the script's folder, its links resolved) builds it
    in the caller's working directory and PYTHONPATH."""
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    first = request["cwd"]
    if request.get("script") is not None:
        first = os.path.dirname(os.path.realpath(os.path.join(request["cwd"], request["script"])))
    return [first, *extra, *BASE_PATH]


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
    if request.get("script") is not None:
        sys.argv = [request["script"], *request["argv"]]
        sys.orig_argv = [sys.executable, request["script"], *request["argv"]]
    else:
        sys.argv = [request["module"], *request["argv"]]  # runpy puts the module's file first
        sys.orig_argv = [sys.executable, "-m", request["module"], *request["argv"]]
        # In script mode (its command in argv or TRAINSTACK_COMMAND), the user's `python` is served too.
        if request["module"] == "trainer" and SCRIPT_LAUNCHER:
            sys.executable = SCRIPT_LAUNCHER[0]
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    _standard_streams(request["env"])
    if SOCKET:
        warm_autograph.record(SOCKET[0] + ".autograph")
    if "numpy" in sys.modules:  # NumPy's global generator was seeded once, in the server
        sys.modules["numpy"].random.seed()
    signal.pthread_sigmask(signal.SIG_SETMASK, request["mask"])


def _run_script(script: str) -> None:
    """Run the file `script` as `python SCRIPT` runs it: its code in a fresh `__main__` module."""
    import builtins
    import types

    file = os.path.abspath(script)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=file, __cached__=None, __builtins__=builtins, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", file))
    sys.modules["__main__"] = main
    with io.open_code(file) as f:
        source = f.read()
    exec(compile(source, file, "exec", dont_inherit=True), main.__dict__)  # noqa: S102 - the user's script, as python runs it


def _report(script: str | None) -> None:
    """The uncaught exception on stderr, as the interpreter reports it: for a script, from its own
    frames on (none for a SyntaxError), not the server's."""
    kind, value, tb = sys.exc_info()
    if script is not None:
        file = os.path.abspath(script)
        while tb is not None and tb.tb_frame.f_code.co_filename != file:
            tb = tb.tb_next
        value = value.with_traceback(tb)  # what the interpreter's report prints
    sys.excepthook(kind, value, tb)


def _run(request: dict) -> int:
    """Run the module (or script) as `__main__`; the exit code a `python -m` (`python SCRIPT`)
    process would end with."""
    import atexit
    import runpy

    code, script = 0, request.get("script")
    try:
        if script is not None:
            _run_script(script)
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # the interpreter then ends by SIGINT
        _report(script)
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        _report(script)
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
    # What nearly every run imports after its start: the stores' clients and TensorBoard's event protos
    # (their modules only: no client, no writer, no thread), about 0.1 CPU-s a run, ~190 runs a CI.
    with entry.imports_kept(), entry.quiet_native_stderr():
        import boto3.s3.transfer  # noqa: F401
        import botocore.client  # noqa: F401
        import tensorflow as tf
        from google.cloud import storage  # noqa: F401

        tf.compat.v1.Event, tf.compat.v1.Summary, tf.io.TFRecordWriter  # noqa: B018 - loaded on first use
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
    SOCKET[:], SCRIPT_LAUNCHER[:] = [path], [_write_script_launcher(path)]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + ".autograph")
    LEARNED[:] = [warm_autograph.Learned(path + ".autograph")]
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
                LEARNED[0].take()  # what it converted, converted here for the next children


_warned = False
_keras2: list = []  # the Keras 2 sibling server, once started


def _keras2_sibling(request: dict, path: str) -> bool:
    """Whether a call this server cannot serve only because it sets TF_USE_LEGACY_KERAS=1 goes to
    the Keras 2 sibling (started here on the first such call): a server imported with it set."""
    env = request["env"]
    if os.environ.get(KERAS2_VAR) is not None or env.get(KERAS2_VAR) != "1":
        return False  # this is the sibling, or the call's Keras is this server's (or another value)
    if _why_plain({**request, "env": {k: v for k, v in env.items() if k != KERAS2_VAR}}) is not None:
        return False
    if not _keras2:
        import subprocess

        pdeathsig = ctypes.CDLL(None, use_errno=True).prctl
        # Its own socket: the launcher goes there once it exists. It ends with this server.
        _keras2.append(subprocess.Popen(  # noqa: S603 - this interpreter and this file
            [sys.executable, "-E", str(Path(__file__).resolve()), keras2_server(path)],
            stdin=subprocess.DEVNULL, env={**os.environ, KERAS2_VAR: "1"},
            preexec_fn=lambda: pdeathsig(1, signal.SIGKILL)))  # noqa: PLW1509 - one thread here
    return _keras2[0].poll() is None


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
    if why is not None and _keras2_sibling(request, SOCKET[0]):
        with contextlib.suppress(OSError):
            conn.sendall(ASK_KERAS2.to_bytes(8, "big", signed=True))
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
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
            code = _run(request)
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
