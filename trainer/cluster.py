"""Several workers: a bounded wait for the cluster to form, and a peer's loss told apart from a failure.

TensorFlow's MultiWorkerMirroredStrategy waits without bound at start-up for every worker
named in `TF_CONFIG`, inside its C++ runtime and holding Python's GIL (measured with TF
2.21: no Python thread runs meanwhile, and the coordination service's
`cluster_register_timeout_in_ms` does not end the leader's wait). So the wait is bounded
before TensorFlow starts: `wait_for_peers` listens on this worker's own port and waits, up to
`--startup-timeout`, until every peer's port answers (a peer's own wait, or TensorFlow's server
once it has started). A peer that never answers makes the worker record a `failed` event naming
the workers it waited for and exit `exits.NO_CLUSTER` (75). A peer that answered and
then never joined (it died, or it formed another cluster) would still hold the wait inside
TensorFlow: `StartupWatchdog` records the event and ends the process where Python can run, and
its `NativeDeadline` (a libc timer calling `_exit(75)`) ends it where Python cannot, unrecorded.

Once training runs, a peer that dies is seen by TensorFlow's heartbeats (a killed process at
once, a frozen one in about 10 s) and the next collective raises; `peer_loss` recognises that
error, so the worker exits `exits.PEER_LOST` (76): not this machine's failure.

Only the chief writes the run's `events.jsonl`. Another worker's `failed` event is recorded
in its own object, `worker-events/<address>.jsonl` (`layout.worker_events_key`), which
`ops status` reads beside the machines' events.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

from runfolder import exits, layout

# How long a dying worker may spend recording its `failed` event before it exits anyway.
RECORD_TIMEOUT_S = 30.0
# How long a probe of one peer's port may take when the wait ran out.
PROBE_TIMEOUT_S = 2.0

_TASK = re.compile(r"/job:worker/(?:replica:\d+/)?task:(\d+)")


def unreachable(addresses: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """The `host:port` addresses where nothing accepts a TCP connection (no trainer started there)."""
    out = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                pass
        except (OSError, ValueError):
            out.append(address)
    return out


def wait_for_peers(own: str, peers: Sequence[str], deadline: float, poll: float = 0.5,
                   stop: Callable[[], bool] = lambda: False) -> list[str]:
    """Wait until every peer's `host:port` accepts a connection, `time.monotonic()` passes `deadline`
    or `stop()` is true (a stop signal: the caller checks it).

    Meanwhile this worker listens on its own port so that peers waiting the same way see it;
    the socket is closed before returning, so TensorFlow can bind the port next. Returns the
    peers never reached (empty: all are up).
    """
    missing = list(peers)
    listener = None
    with contextlib.suppress(OSError, ValueError):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("", int(own.rpartition(":")[2])))
        listener.listen(64)
    try:
        while missing:
            missing = unreachable(missing, timeout=min(PROBE_TIMEOUT_S, max(0.1, deadline - time.monotonic())))
            if not missing or time.monotonic() >= deadline or stop():
                break
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
    finally:
        if listener is not None:
            listener.close()
    return missing


class _Sigevent(ctypes.Structure):
    # glibc's struct sigevent (64 bytes on 64-bit Linux) with its SIGEV_THREAD members.
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("function", ctypes.c_void_p), ("attribute", ctypes.c_void_p), ("_pad", ctypes.c_int * 8)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


_SIGEV_THREAD = 2
_CLOCK_MONOTONIC = 1


class NativeDeadline:
    """`_exit(code)` after `seconds`, from a libc timer thread that needs no Python lock.

    The last resort while TensorFlow's start-up holds the GIL (no Python thread or signal
    handler can run then): POSIX `timer_create` with `SIGEV_THREAD` calls libc's `_exit`
    with the code as its argument. Nothing is printed or recorded on that path. Where the
    timer cannot be made (not glibc), `ok` is False and nothing is armed.
    """

    def __init__(self, seconds: float, code: int):
        self.ok = False
        self._libc = None
        self._timer = ctypes.c_void_p()
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            event = _Sigevent(value=code, signo=0, notify=_SIGEV_THREAD,
                              function=ctypes.cast(libc._exit, ctypes.c_void_p).value)
            if libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(self._timer)) != 0:
                return
            whole = int(seconds)
            spec = _Itimerspec(value=_Timespec(whole, int((seconds - whole) * 1e9)))
            if libc.timer_settime(self._timer, 0, ctypes.byref(spec), None) != 0:
                libc.timer_delete(self._timer)
                return
        except (OSError, AttributeError):
            return
        self._libc, self.ok = libc, True

    def cancel(self) -> None:
        """Never fire."""
        if self.ok:
            self._libc.timer_delete(self._timer)
            self.ok = False


class StartupWatchdog:
    """Calls `on_expire` once if not disarmed within `timeout` seconds (on its own thread).

    With `native_grace`, a `NativeDeadline` also ends the process with `native_code` that
    many seconds later, for when the Python thread cannot run at all (TensorFlow holds the GIL).
    """

    def __init__(self, timeout: float, on_expire: Callable[[], None], *, native_grace: float | None = None,
                 native_code: int = exits.NO_CLUSTER):
        self.timeout = timeout
        self.on_expire = on_expire
        self.native_grace = native_grace
        self.native_code = native_code
        self.native: NativeDeadline | None = None
        self._disarmed = threading.Event()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None

    def start(self) -> StartupWatchdog:
        """Start counting."""
        self.started_at = time.monotonic()
        if self.native_grace is not None:
            self.native = NativeDeadline(self.timeout + self.native_grace, self.native_code)
        self._thread = threading.Thread(target=self._watch, name="startup-watchdog", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        if not self._disarmed.wait(self.timeout):
            self.on_expire()

    def disarm(self) -> None:
        """The cluster formed: never fire."""
        self._disarmed.set()
        if self.native is not None:
            self.native.cancel()

    @property
    def armed(self) -> bool:
        """True while started and not yet disarmed."""
        return self._thread is not None and not self._disarmed.is_set()


def peer_loss(error: BaseException) -> bool:
    """True when `error` is a collective failing because a peer went away (not this worker's fault).

    TensorFlow raises `UnavailableError` for a peer that stopped sending heartbeats or reset
    its connection, `DeadlineExceededError` for one that stopped answering, and `CancelledError`
    / `AbortedError` for the collectives it aborted because of either.
    """
    import tensorflow as tf

    return isinstance(error, tf.errors.UnavailableError | tf.errors.DeadlineExceededError
                      | tf.errors.CancelledError | tf.errors.AbortedError)


def lost_peers(error: BaseException, addresses: Sequence[str], own_index: int) -> list[str]:
    """The peers TensorFlow's message names (`/job:worker/replica:0/task:N`), as addresses."""
    text = str(getattr(error, "message", None) or error)
    out = []
    for m in _TASK.finditer(text):
        i = int(m.group(1))
        if i != own_index and i < len(addresses) and addresses[i] not in out:
            out.append(addresses[i])
    return out


def brief_error(error: BaseException, limit: int = 400) -> str:
    """TensorFlow's error message without the Python stack it carries: its type and first lines."""
    text = str(getattr(error, "message", None) or error)
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("File ", "Detected at node", "Graph execution error", "[[")):
            continue
        keep.append(s)
    summary = " ".join(keep[:3]) or text.strip()
    if len(summary) > limit:
        summary = summary[:limit - 3] + "..."
    return f"{type(error).__name__}: {summary}"


def record_worker_event(store, address: str, event: dict, timeout: float = RECORD_TIMEOUT_S) -> bool:
    """Append `event` to this worker's own `worker-events/<address>.jsonl`; False if not done in `timeout`.

    A worker other than the chief never writes `events.jsonl` (one writer per object), so this
    is where its `failed` event is kept. Bounded: a store that does not answer must not keep
    a dying worker alive.
    """
    done = threading.Event()
    line = json.dumps(event, default=str)

    def write() -> None:
        try:
            store.append_line(layout.worker_events_key(address), line)
            done.set()
        except Exception as e:  # noqa: BLE001 - reported, never fatal: the worker is ending anyway
            print(f"trainstack: could not record the worker's event in the run: {e}", file=sys.stderr)

    t = threading.Thread(target=write, name="worker-event", daemon=True)
    t.start()
    t.join(timeout)
    return done.is_set()


def hard_exit(code: int) -> None:
    """End the process now with `code` (from any thread; the main one may be stuck in TensorFlow)."""
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
