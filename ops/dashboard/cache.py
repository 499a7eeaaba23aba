"""What the dashboard keeps between a page's refreshes, within a bound on its bytes.

A dashboard left open on a bucket of many runs would otherwise keep every object it ever read
(each run's ``events.jsonl``, the curves of every TensorBoard event file) for as long as it
serves. :class:`Kept` is a dict-like cache, least recently used first out, whose entries
weigh what their ``weigh`` function says; past ``max_bytes`` the oldest go. What is dropped
is only read again on the next refresh that needs it. The server answers requests on
several threads, and the runs table reads 16 runs at once: every call takes one lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable


class Kept:
    """A least-recently-used cache bounded by the total of its entries' weights (bytes)."""

    def __init__(self, max_bytes: int, weigh: Callable[[object], int]) -> None:
        if max_bytes < 0:
            raise ValueError(f"Kept needs max_bytes >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._weigh = weigh
        self._entries: OrderedDict[str, tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def get(self, name: str, default=None):
        """The entry kept for ``name`` (now the most recently used), else ``default``."""
        with self._lock:
            kept = self._entries.get(name)
            if kept is None:
                return default
            self._entries.move_to_end(name)
            return kept[0]

    def __setitem__(self, name: str, value) -> None:
        weight = max(0, int(self._weigh(value)))
        with self._lock:
            old = self._entries.pop(name, None)
            if old is not None:
                self.bytes -= old[1]
            if weight > self.max_bytes:
                return  # larger than the whole cache: read again when asked for
            self._entries[name] = (value, weight)
            self.bytes += weight
            while self.bytes > self.max_bytes:
                _name, (_value, w) = self._entries.popitem(last=False)
                self.bytes -= w

    def pop(self, name: str, default=None):
        """Forget ``name``; its entry, else ``default``."""
        with self._lock:
            kept = self._entries.pop(name, None)
            if kept is None:
                return default
            self.bytes -= kept[1]
            return kept[0]

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
