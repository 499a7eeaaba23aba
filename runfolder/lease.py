"""The run's single-writer lease: at most one trainer commits to a run folder at a time.

Two machines can train the same run at once: a cloud replacement that boots while the old
machine is still committing after its notice, a group briefly above its size, two stacks
given the same run id. Each would commit checkpoints and prune the other's. So the chief
takes a lease before it writes anything to the run, and every commit proves it still holds
it.

The lease is one small JSON object, ``<run>/lease.json`` (:data:`runfolder.layout.LEASE_KEY`)::

    {"format": 1, "holder": "host/pid", "token": "...", "epoch": 7, "ttl_s": 60,
     "expires": 1767225600.0, "released": false, "nonce": "..."}

and every change to it is a conditional write the store decides atomically
(:meth:`runfolder.storage.Store.put_bytes_if`: S3 ``If-None-Match: *`` / ``If-Match`` on the
ETag, GCS ``ifGenerationMatch``), against the version this trainer read. Of two trainers
racing for it, exactly one wins; the other reads again.

- **Taking it**: free (absent or released), expired, ours, or left on this very machine by
  an attempt that was killed (one trainer runs per machine at a time) -> a conditional
  write with ``epoch + 1``. Expired means either its ``expires`` is :data:`CLOCK_SKEW_S`
  behind our wall clock, or we saw the very same version for ``ttl_s`` on our own
  monotonic clock (the holder stopped renewing; no clock agreement needed). Held by a live
  holder -> poll until ``wait_s`` runs out, then :class:`LeaseHeld`.
- **Holding it**: a thread renews it every ``ttl_s / 4`` (conditional on our last version).
  A renewal refused (412: the object is at another version) means someone took it: the lease
  is lost, every later :meth:`RunLease.check` raises :class:`LeaseLost`, and
  ``on_lost(reason)`` is called (the trainer stops its loop). A renewal that met another
  write in flight (409: S3 ``ConditionalRequestConflict``, GCS ``Conflict``) was not
  refused: the lease is read again and, while it is still ours at our version, written
  again (:data:`CONFLICT_TRIES`); only if the other write won is it lost.
- **Fencing**: :meth:`RunLease.fence` renews synchronously and is called right before a
  checkpoint's COMMITTED marker is written; the marker goes out only if that conditional
  write succeeded, well inside the time no one else can take the lease (``ttl_s`` minus
  :data:`SAFETY_S` after the renewal was sent). :meth:`RunLease.check` (no request) guards
  pruning the same way. The marker records the lease's epoch (``lease_epoch``). One case
  remains that no object store lets a client exclude (it has no condition across two
  objects): a machine frozen for longer than the TTL between that renewal and the marker
  write it was meant for.
- **Letting go**: :meth:`RunLease.release` marks it released (conditional again), so a
  replacement booting after a preemption takes it at once instead of waiting for expiry.

The lease's own writes are the only thing a waiting trainer writes: it adds nothing to
``events.jsonl`` (appends are read-modify-write, and the holder is appending).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from runfolder import environment, layout
from runfolder.storage import NotFound, PreconditionFailed, Store, WriteConflict

LEASE_FORMAT = 1
DEFAULT_TTL_S = 60.0
# A lease whose `expires` is this far behind our wall clock is taken without waiting: cloud
# machines keep NTP time to well under a second; this covers a badly drifting one.
CLOCK_SKEW_S = 15.0
# The holder stops trusting its lease this long before the TTL ends (request latency, a
# paused process), and a fenced write must go out within that window.
SAFETY_S = 10.0
POLL_S = 5.0
# A conditional write that met another write in flight (S3/GCS 409) decided nothing: read
# again and, while the lease is still ours at the version we hold, write again, this many
# times, pausing CONFLICT_PAUSE_S x try (a few seconds in all, well inside SAFETY_S).
CONFLICT_TRIES = 4
CONFLICT_PAUSE_S = 0.25


class LeaseBusy(RuntimeError):
    """The store kept answering 409 (another write in flight) to our renewal: not lost, not renewed."""


class LeaseHeld(RuntimeError):
    """Another trainer holds the run's lease and kept renewing it while we waited."""

    def __init__(self, reason: str, details: dict) -> None:
        super().__init__(reason)
        self.details = details


class LeaseLost(RuntimeError):
    """This trainer no longer holds the run's lease (taken over, or not renewed in time)."""


@dataclass(frozen=True)
class LeaseRecord:
    """One state of the lease object."""

    holder: str
    token: str
    epoch: int
    ttl_s: float
    expires: float
    released: bool
    nonce: str

    @classmethod
    def parse(cls, data: bytes) -> LeaseRecord | None:
        """The record in ``data``; None for something that is not a lease (then it is taken over)."""
        try:
            doc = json.loads(data)
            return cls(holder=str(doc["holder"]), token=str(doc["token"]), epoch=int(doc["epoch"]),
                       ttl_s=float(doc["ttl_s"]), expires=float(doc["expires"]),
                       released=bool(doc.get("released", False)), nonce=str(doc.get("nonce", "")))
        except (ValueError, KeyError, TypeError):
            return None

    def dump(self) -> bytes:
        return json.dumps({"format": LEASE_FORMAT, "holder": self.holder, "token": self.token,
                           "epoch": self.epoch, "ttl_s": self.ttl_s, "expires": round(self.expires, 3),
                           "released": self.released, "nonce": self.nonce}, indent=1).encode()


def machine_id() -> str:
    """This machine: ``TRAINSTACK_MACHINE_ID`` (the instance, set by the machine's boot), else the host name."""
    return os.environ.get(environment.MACHINE_ID) or socket.gethostname()


def default_holder() -> str:
    """``machine/pid``: who holds the lease, as an operator reads it."""
    return f"{machine_id()}/{os.getpid()}"


def _machine_of(holder: str) -> str:
    return holder.rsplit("/", 1)[0]


class RunLease:
    """The single-writer lease of one run folder (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        holder: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        wait_s: float | None = None,
        poll_s: float = POLL_S,
        safety_s: float = SAFETY_S,
        skew_s: float = CLOCK_SKEW_S,
        on_lost: Callable[[str], None] | None = None,
        same_machine_takes_over: bool = True,
        emit: Callable[[str, dict], None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if ttl_s <= safety_s:
            raise ValueError(f"lease ttl_s must exceed {safety_s} s (the holder's safety margin), got {ttl_s}")
        self.store = store
        self.key = layout.LEASE_KEY
        self.holder = holder or default_holder()
        self.token = uuid.uuid4().hex
        self.ttl_s = float(ttl_s)
        # Long enough for a dead holder's lease to expire (by its clock or by watching it).
        self.wait_s = float(wait_s) if wait_s is not None else self.ttl_s + skew_s + 2 * poll_s
        self.poll_s = poll_s
        self.safety_s, self.skew_s = safety_s, skew_s
        self.on_lost = on_lost
        self.same_machine_takes_over = same_machine_takes_over
        self.emit = emit
        self._clock, self._mono, self._sleep = clock, monotonic, sleep
        self.epoch: int | None = None
        self._version: str | None = None
        self._valid_until = 0.0  # monotonic: until when our last successful write lets us write
        self._lost: str | None = None
        self._lock = threading.Lock()  # one lease write at a time from this process
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading and writing the object -------------------------------------------------

    def _read(self) -> tuple[LeaseRecord | None, str | None, bool]:
        """(record, version, exists); an unreadable object is (None, version, True)."""
        try:
            data, version = self.store.get_versioned(self.key)
        except NotFound:
            return None, None, False
        return LeaseRecord.parse(data), version, True

    def _write(self, epoch: int, version: str | None, *, released: bool = False) -> None:
        """Write our record conditionally on ``version``; on success we hold (or released) it."""
        sent = self._mono()
        rec = LeaseRecord(holder=self.holder, token=self.token, epoch=epoch, ttl_s=self.ttl_s,
                          expires=self._clock() + self.ttl_s, released=released, nonce=uuid.uuid4().hex)
        try:
            new_version = self.store.put_bytes_if(self.key, rec.dump(), version=version)
        except PreconditionFailed:
            # A retried write whose first try reached the store but lost its answer also ends
            # here: the object then holds our nonce, and it is ours after all.
            current, current_version, _ = self._read()
            if current is None or current.nonce != rec.nonce:
                raise
            new_version = current_version
        self.epoch, self._version = epoch, new_version
        self._valid_until = sent + self.ttl_s - self.safety_s

    def _say(self, kind: str, **fields) -> None:
        if self.emit is not None:
            with contextlib.suppress(Exception):
                self.emit(kind, fields)

    # -- taking it ----------------------------------------------------------------------

    def acquire(self) -> int:
        """Take the lease, waiting up to ``wait_s`` for a live holder; returns our epoch.

        Raises :class:`LeaseHeld` when another holder kept renewing it all that time.
        """
        started = self._mono()
        seen: tuple[str | None, float] | None = None  # (version, when first seen) of another's lease
        told = False
        while True:
            rec, version, exists = self._read()
            now = self._mono()
            if not exists:
                free, why = True, "no lease"
            elif rec is None:
                free, why = True, "unreadable lease"
            elif rec.released or rec.token == self.token:
                free, why = True, "released" if rec.released else "ours"
            elif self.same_machine_takes_over and _machine_of(rec.holder) == _machine_of(self.holder):
                # One trainer runs on a machine at a time (its supervisor starts the next only
                # after the last exited): a lease of this machine's is left by a killed attempt.
                free, why = True, f"left by an earlier attempt on this machine ({rec.holder})"
            elif rec.expires + self.skew_s < self._clock():
                free, why = True, f"expired ({rec.holder} stopped renewing)"
            else:
                if seen is None or seen[0] != version:
                    seen = (version, now)
                # Unchanged for a whole TTL by our own clock: its holder stopped renewing.
                free = now - seen[1] >= rec.ttl_s
                why = f"not renewed for {rec.ttl_s:.0f} s ({rec.holder})"
            if free:
                epoch = (rec.epoch + 1) if rec is not None else 1
                try:
                    with self._lock:
                        self._write(epoch, version if exists else None)
                except WriteConflict:
                    self._sleep(CONFLICT_PAUSE_S)  # another write in flight: look again shortly
                    continue
                except PreconditionFailed:
                    continue  # someone else wrote it first: look again
                self._lost = None
                if told or rec is not None and not rec.released and rec.token != self.token:
                    # Worth a line only when it waited or took a lease over from someone.
                    self._say(layout.LEASE_TAKEN, epoch=epoch, holder=self.holder, reason=why)
                return epoch
            waited = now - started
            details = {"holder": rec.holder, "epoch": rec.epoch, "expires": rec.expires, "waited_s": round(waited, 1)}
            if waited >= self.wait_s:
                raise LeaseHeld(
                    f"another trainer ({rec.holder}, lease epoch {rec.epoch}) holds this run's lease and kept renewing "
                    f"it for the {self.wait_s:.0f} s this one waited: two machines are training the same run. This "
                    "one stops without writing to the run; if no other machine should train it, stop that one "
                    "(or use another run id)", details)
            if not told:
                told = True
                self._say(layout.LEASE_WAIT, **details, wait_s=round(self.wait_s, 1))
            self._sleep(min(self.poll_s, max(0.0, self.wait_s - waited)))

    # -- holding it -----------------------------------------------------------------------

    def renew(self) -> None:
        """Extend the lease now (a conditional write); raises :class:`LeaseLost` if it was taken."""
        with self._lock:
            if self._lost:
                raise LeaseLost(self._lost)
            if self.epoch is None:
                raise LeaseLost("this trainer never took the run's lease")
            for tries in range(1, CONFLICT_TRIES + 1):
                try:
                    self._write(self.epoch, self._version)
                    return
                except WriteConflict:
                    rec, version, _ = self._read()
                    if rec is None or rec.token != self.token:
                        break  # the write in flight was another's, and it won: lost (below)
                    self._version = version  # still ours: write again against what is there
                    if tries == CONFLICT_TRIES:
                        raise LeaseBusy(f"the run's lease (epoch {self.epoch}) met another write in flight "
                                        f"{tries} times in a row; still ours, not renewed") from None
                    self._sleep(CONFLICT_PAUSE_S * tries)
                except PreconditionFailed:
                    break
            rec, _, _ = self._read()
            who = f"{rec.holder}, epoch {rec.epoch}" if rec else "the lease is gone"
            self._lost = (f"the run's lease was taken over ({who}) while this trainer (epoch {self.epoch}) "
                          "held it: another machine is training this run; this one stops committing")
            if self.on_lost is not None:
                with contextlib.suppress(Exception):
                    self.on_lost(self._lost)
            raise LeaseLost(self._lost)

    def fence(self) -> None:
        """Prove we hold the lease right before a commit: renew it, raising :class:`LeaseLost` if not."""
        self.renew()

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless our last renewal still covers a write now (no request)."""
        if self._lost:
            raise LeaseLost(self._lost)
        if self.epoch is None or self._mono() >= self._valid_until:
            raise LeaseLost(f"this trainer's lease (epoch {self.epoch}) was not renewed in time; not writing")

    @property
    def lost(self) -> str | None:
        """Why the lease was lost, or None while it is held."""
        return self._lost

    def start(self) -> None:
        """Renew in the background every ``ttl_s / 4`` until :meth:`release` (transient errors retried)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="run-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        every = self.ttl_s / 4
        while not self._stop.wait(every):
            try:
                self.renew()
            except LeaseLost as e:
                self._say(layout.LEASE_LOST, reason=str(e))
                return
            except Exception:  # noqa: BLE001, S112 - the store's own retries gave up; try again next round
                continue

    # -- letting go -----------------------------------------------------------------------

    def release(self) -> None:
        """Stop renewing and mark the lease released, if we still hold it (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._lock:
            if self.epoch is None or self._lost:
                return
            with contextlib.suppress(Exception):  # taken meanwhile, or the store is down: it expires
                self._write(self.epoch, self._version, released=True)
            self._lost = "released"
