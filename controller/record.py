"""The run folder's ``placement.json``: which placement is active and every move, written conditionally.

::

    {"active": 1, "since": "2026-...Z",
     "moves": [{"from": 0, "to": 1, "reason": "...", "step": 400, "time": "2026-...Z", "done": true}],
     "failed_at": {"0": 1767225600.0},
     "broken": {"2": {"first": 1767225600.0, "ticks": 6, "error": "...", "said": true}},
     "hung": {"1": [1767229200.0]}, "seen": {"1": {"ids": ["i-0a"], "at": 1767229500.0}}}

Absent: placement 0 is active. Its writers are the controller's tick and ``ops move``, both
through :mod:`controller.tick`, and every write is conditional on the version read
(:meth:`runfolder.storage.Store.put_bytes_if`: S3 ``If-None-Match: *`` / ``If-Match``, GCS
``ifGenerationMatch``), as the run's lease is written: of two writers from the same version,
the store accepts one and the other gets :class:`~runfolder.storage.PreconditionFailed`.

``broken`` names the placements whose group's API failed at every tick since ``first`` (``ticks`` of
them in a row, the newest ``error``; ``said`` once a ``waiting`` event named it): an entry goes as soon
as one of its calls succeeds (:mod:`controller.tick`). ``hung`` keeps, per placement, when the
controller last replaced its machines for making no progress (the newest few); ``seen``, the active
group's running machines (their ids) and when a tick first saw them so: a machine's age where the cloud
does not say it.

A move is recorded before it is carried out (``done: false``); whoever reads a move that is
not done finishes it (every step is idempotent), then marks it done.

The ``moved`` events go to their own object (``layout.PLACEMENT_EVENTS_KEY``), appended with
the same conditional writes and never twice for one move (each carries its move's number).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from runfolder import layout
from runfolder.storage import NotFound, PreconditionFailed, Store, WriteConflict

# A conditional write that met another write in flight (409) decided nothing: read and try again.
CONFLICT_TRIES = 4


def iso(epoch: float) -> str:
    """``2026-12-01T21:38:39.123Z``: the run folder's time stamps."""
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_of(stamp: object) -> float | None:
    """Seconds since the epoch of an ISO time stamp; None for anything else."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


@dataclass
class Record:
    """One state of ``placement.json``."""

    active: int = 0
    since: str | None = None
    moves: list[dict] = field(default_factory=list)
    failed_at: dict[str, float] = field(default_factory=dict)
    nonce: str = ""
    broken: dict[str, dict] = field(default_factory=dict)
    hung: dict[str, list[float]] = field(default_factory=dict)
    seen: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes) -> Record:
        """The record in ``data``; raises ValueError (naming the key) for something that is not one."""
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError(f"{layout.PLACEMENT_KEY}: expected a JSON object")
        active = doc.get("active", 0)
        if isinstance(active, bool) or not isinstance(active, int) or active < 0:
            raise ValueError(f"{layout.PLACEMENT_KEY}: active: expected a placement index, got {active!r}")
        moves = doc.get("moves") or []
        if not isinstance(moves, list) or not all(isinstance(m, dict) for m in moves):
            raise ValueError(f"{layout.PLACEMENT_KEY}: moves: expected a list of objects")
        failed = doc.get("failed_at") or {}
        if not isinstance(failed, dict):
            raise ValueError(f"{layout.PLACEMENT_KEY}: failed_at: expected an object")
        broken = doc.get("broken") or {}
        if not isinstance(broken, dict) or not all(isinstance(v, dict) for v in broken.values()):
            raise ValueError(f"{layout.PLACEMENT_KEY}: broken: expected an object of objects")
        hung = doc.get("hung") or {}
        if not isinstance(hung, dict) or not all(isinstance(v, list) for v in hung.values()):
            raise ValueError(f"{layout.PLACEMENT_KEY}: hung: expected an object of lists")
        seen = doc.get("seen") or {}
        if not isinstance(seen, dict) or not all(isinstance(v, dict) for v in seen.values()):
            raise ValueError(f"{layout.PLACEMENT_KEY}: seen: expected an object of objects")
        return cls(active=active, since=doc.get("since"), moves=[dict(m) for m in moves],
                   failed_at={str(k): float(v) for k, v in failed.items()}, nonce=str(doc.get("nonce", "")),
                   broken={str(k): dict(v) for k, v in broken.items()},
                   hung={str(k): [float(t) for t in v] for k, v in hung.items()},
                   seen={str(k): dict(v) for k, v in seen.items()})

    def dump(self) -> bytes:
        return json.dumps({"active": self.active, "since": self.since, "moves": self.moves,
                           "failed_at": self.failed_at, "nonce": self.nonce,
                           **({"broken": self.broken} if self.broken else {}),
                           **({"hung": self.hung} if self.hung else {}),
                           **({"seen": self.seen} if self.seen else {})}, indent=1).encode()

    @property
    def pending(self) -> dict | None:
        """The last move, while it is not carried out yet."""
        return self.moves[-1] if self.moves and not self.moves[-1].get("done") else None


def read(store: Store) -> tuple[Record, str | None]:
    """The record and its version (None: absent, placement 0 active)."""
    try:
        data, version = store.get_versioned(layout.PLACEMENT_KEY)
    except NotFound:
        return Record(), None
    return Record.parse(data), version


def write(store: Store, record: Record, version: str | None) -> str:
    """Write ``record`` only if ``placement.json`` is still at ``version``; returns the new version.

    Raises :class:`PreconditionFailed` when another writer's write came first. A write whose answer
    was lost and whose retry then met its own write is told apart by the record's nonce.
    """
    record.nonce = uuid.uuid4().hex
    data = record.dump()
    for _ in range(CONFLICT_TRIES):
        try:
            return store.put_bytes_if(layout.PLACEMENT_KEY, data, version=version)
        except WriteConflict:
            current, current_version = read(store)
            if current_version != version:
                if current.nonce == record.nonce:
                    return current_version  # type: ignore[return-value]
                raise PreconditionFailed(f"{layout.PLACEMENT_KEY} changed while it was written") from None
        except PreconditionFailed:
            current, current_version = read(store)
            if current.nonce == record.nonce:
                return current_version  # type: ignore[return-value]
            raise
    raise PreconditionFailed(f"{layout.PLACEMENT_KEY}: another write stayed in flight {CONFLICT_TRIES} times")


def read_events(store: Store) -> tuple[list[dict], str | None]:
    """The controller's events and the object's version (None: none yet)."""
    try:
        data, version = store.get_versioned(layout.PLACEMENT_EVENTS_KEY)
    except NotFound:
        return [], None
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out, version


def _append_unless(store: Store, event: dict, there: Callable[[list[dict]], bool], tries: int) -> bool | None:
    """Append ``event`` to the controller's events unless ``there(events)``: True if this call wrote it,
    False if it was there, None if another writer kept appending for ``tries`` reads."""
    for _ in range(tries):
        events, version = read_events(store)
        if there(events):
            return False
        body = "".join(json.dumps(e) + "\n" for e in [*events, event]).encode()
        try:
            store.put_bytes_if(layout.PLACEMENT_EVENTS_KEY, body, version=version)
            return True
        except (PreconditionFailed, WriteConflict):
            continue  # another writer appended meanwhile: read again (it may be this very event)
    return None


def note_waiting(store: Store, event: dict, *, tries: int = 4, after: float | None = None) -> bool:
    """Append the controller's ``waiting`` event unless the newest event already says the same (its
    ``key``) since ``after`` (the run's newest sign of training): what holds the run is written once
    per episode, not each minute, and again when it holds the run again later. True if this call wrote it."""

    def said(events: list[dict]) -> bool:
        last = events[-1] if events else {}
        when = epoch_of(last.get(layout.TIME))
        return (last.get(layout.EVENT) == layout.CONTROLLER_WAITING and last.get("key") == event["key"]
                and (after is None or (when is not None and when >= after)))

    return bool(_append_unless(store, event, said, tries))  # None: the next tick says it


def append_moved_once(store: Store, event: dict, *, tries: int = 8) -> bool:
    """Append the ``moved`` event of move ``event["move"]`` unless it is there; True if this call wrote it."""
    wrote = _append_unless(store, event, lambda events: any(
        e.get(layout.EVENT) == layout.MOVED and e.get("move") == event["move"] for e in events), tries)
    if wrote is None:
        raise PreconditionFailed(f"{layout.PLACEMENT_EVENTS_KEY}: could not append after {tries} tries")
    return wrote
