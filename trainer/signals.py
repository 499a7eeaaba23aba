"""Stop requests: SIGTERM/SIGINT set a flag that the training loop checks between steps.

Installed first thing in `python -m trainer`, before TensorFlow loads (which takes
seconds), so a spot notice that arrives during start-up is not lost: the loop sees it at
its first step and stops cleanly. A second SIGINT aborts at once.

The other way to ask a run to end is the run folder's `STOP` object (`ops stop` writes
it): `StopKeyPoller` looks for it on its own thread, at most every `STOP_POLL_SECONDS`, so
the steps never wait for the store.
"""

from __future__ import annotations

import json
import signal
import threading

from runfolder import layout

STOP_POLL_SECONDS = 10.0


class StopRequest:
    """A flag set by SIGTERM or SIGINT; `signal_name` says which arrived."""

    def __init__(self):
        self.event = threading.Event()
        self.signal_name: str | None = None
        self._old: dict = {}

    def install(self) -> StopRequest:
        """Handle SIGTERM and SIGINT (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread() or self._old:
            return self
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def reclaim(self) -> None:
        """Install the handlers again, over any that a library put in since.

        TensorFlow's multi-worker runtime installs its own C-level SIGTERM handler (its
        preemption notifier) when the strategy starts, which would swallow the signal.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(sig, self._handle)
            self._old.setdefault(sig, previous)

    def _handle(self, signum, frame) -> None:
        if self.event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user really wants out
        self.signal_name = signal.Signals(signum).name
        self.event.set()

    def restore(self) -> None:
        """Put the previous handlers back."""
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    @property
    def requested(self) -> bool:
        """True once a stop signal has arrived."""
        return self.event.is_set()


class StopKeyPoller:
    """Watches the run's `STOP` key from a background thread; `requested` once it exists.

    `reason` is the request's `reason` when `STOP` holds JSON with one (what `ops stop`
    writes), else its text, else a default. A store that cannot be read is asked again at
    the next poll: a hiccup must neither stop the run nor end the polling.
    """

    def __init__(self, store, every: float = STOP_POLL_SECONDS) -> None:
        self.store = store
        self.every = every
        self.event = threading.Event()
        self.reason: str | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StopKeyPoller:
        """Start polling (the first look is at once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="stop-key", daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        from runfolder.storage import NotFound

        while not self._done.is_set():
            try:
                raw = self.store.get_bytes(layout.STOP_KEY)
            except NotFound:
                raw = None
            except Exception:  # noqa: BLE001 - transient or not, the next poll asks again
                raw = None
            if raw is not None:
                self.reason = _reason(raw)
                self.event.set()
                return
            self._done.wait(self.every)

    def close(self) -> None:
        """Stop polling."""
        self._done.set()

    @property
    def requested(self) -> bool:
        """True once `STOP` was found."""
        return self.event.is_set()


def _reason(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get(layout.MARKER_REASON):
        return str(doc[layout.MARKER_REASON])[:500]
    return text[:500] or "stop requested (STOP in the run folder)"
