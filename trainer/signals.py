"""Stop requests: SIGTERM/SIGINT set a flag that the training loop checks between steps.

Installed first thing in `python -m trainer`, before TensorFlow loads (which takes
seconds), so a spot notice that arrives during start-up is not lost: the loop sees it at
its first step and stops cleanly. A second SIGINT aborts at once.
"""

from __future__ import annotations

import signal
import threading


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
