"""The run's lease (runfolder/lease.py) on a local run with an injected clock: every rule that decides
whether a lease is free, what the trainer is told, and what renewing, checking and releasing do.

No real time passes: `clock`, `monotonic` and `sleep` are one fake clock that `sleep` advances,
so the bounds (a TTL, the wait, the safety margin) are tested at their edges.
"""

from __future__ import annotations

import json

import pytest

from runfolder import layout
from runfolder.lease import LeaseHeld, LeaseLost, LeaseRecord, RunLease, default_holder, machine_id
from runfolder.storage import open_store


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


@pytest.fixture
def store(file_run):
    return open_store(file_run.uri)


@pytest.fixture
def clock():
    return Clock()


def lease(store, clock, said=None, **kw) -> RunLease:
    kw = {"ttl_s": 30.0, "safety_s": 10.0, "skew_s": 5.0, "poll_s": 2.0, "holder": "machine-a/1", **kw}
    emit = (lambda kind, fields: said.append((kind, fields))) if said is not None else None
    return RunLease(store, clock=clock, monotonic=clock, sleep=clock.sleep, emit=emit, **kw)


def record(store) -> dict:
    return json.loads(store.get_bytes(layout.LEASE_KEY))


def put_record(store, **fields) -> None:
    doc = {"holder": "machine-b/9", "token": "other", "epoch": 4, "ttl_s": 30.0, "expires": 0.0, **fields}
    store.put_bytes(layout.LEASE_KEY, json.dumps(doc).encode())


# -- the record --

def test_a_record_round_trips_with_its_format_and_a_rounded_expiry():
    rec = LeaseRecord(holder="m/1", token="t", epoch=3, ttl_s=30.0, expires=12.34567, released=True, nonce="n")
    doc = json.loads(rec.dump())
    assert doc == {"format": 1, "holder": "m/1", "token": "t", "epoch": 3, "ttl_s": 30.0, "expires": 12.346,
                   "released": True, "nonce": "n"}
    assert LeaseRecord.parse(rec.dump()) == LeaseRecord("m/1", "t", 3, 30.0, 12.346, True, "n")


def test_a_record_without_its_optional_fields_is_held_and_unnamed():
    rec = LeaseRecord.parse(b'{"holder": "m/1", "token": 7, "epoch": "2", "ttl_s": 3, "expires": "5.5"}')
    assert rec == LeaseRecord("m/1", "7", 2, 3.0, 5.5, False, "")


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"holder": "m"}', b'{"holder": "m", "token": "t", '
                                  b'"epoch": "x", "ttl_s": 1, "expires": 1}', b"null"])
def test_what_is_not_a_record_parses_to_none(data):
    assert LeaseRecord.parse(data) is None


def test_the_holder_is_the_machine_and_the_process(monkeypatch):
    import os
    import socket

    monkeypatch.setenv("TRAINSTACK_MACHINE_ID", "i-0abc")
    assert machine_id() == "i-0abc" and default_holder() == f"i-0abc/{os.getpid()}"
    monkeypatch.setenv("TRAINSTACK_MACHINE_ID", "")
    assert machine_id() == socket.gethostname()


def test_the_ttl_must_exceed_the_safety_margin(store, clock):
    with pytest.raises(ValueError, match=r"lease ttl_s must exceed 10.0 s \(the holder's safety margin\), got 10.0"):
        lease(store, clock, ttl_s=10.0)
    assert lease(store, clock, ttl_s=10.5).ttl_s == 10.5


def test_the_wait_is_long_enough_for_a_dead_holders_lease_to_run_out(store, clock):
    assert lease(store, clock).wait_s == 30.0 + 5.0 + 2 * 2.0
    assert lease(store, clock, wait_s=7).wait_s == 7.0


# -- taking it --

def test_no_lease_is_taken_at_once_quietly(store, clock):
    said = []
    a = lease(store, clock, said)
    assert a.acquire() == 1 and said == [] and clock.sleeps == []
    doc = record(store)
    assert (doc["holder"], doc["epoch"], doc["released"], doc["expires"]) == ("machine-a/1", 1, False, clock.t + 30.0)
    assert doc["token"] == a.token and doc["nonce"]


def test_a_released_lease_is_taken_with_the_next_epoch_quietly(store, clock):
    said = []
    put_record(store, released=True, expires=clock.t + 1000)
    assert lease(store, clock, said).acquire() == 5 and said == []


def test_an_unreadable_lease_is_taken_over(store, clock):
    said = []
    store.put_bytes(layout.LEASE_KEY, b"garbage")
    assert lease(store, clock, said).acquire() == 1 and said == []


def test_a_lease_of_an_earlier_attempt_on_this_machine_is_taken_over_and_said(store, clock):
    said = []
    put_record(store, holder="machine-a/7", expires=clock.t + 1000)
    assert lease(store, clock, said).acquire() == 5
    assert said == [(layout.LEASE_TAKEN, {"epoch": 5, "holder": "machine-a/1",
                                          "reason": "left by an earlier attempt on this machine (machine-a/7)"})]


@pytest.mark.parametrize(("expires_in", "free"), [(-5.001, True), (-5.0, False), (0.0, False)])
def test_an_expired_lease_is_taken_over_once_past_the_clock_skew(store, clock, expires_in, free):
    said = []
    put_record(store, expires=clock.t + expires_in)
    a = lease(store, clock, said, wait_s=0.0)
    if free:
        assert a.acquire() == 5
        assert said[-1] == (layout.LEASE_TAKEN, {"epoch": 5, "holder": "machine-a/1",
                                                 "reason": "expired (machine-b/9 stopped renewing)"})
    else:
        with pytest.raises(LeaseHeld):
            a.acquire()


def test_a_lease_of_this_machine_is_waited_for_when_the_machine_may_run_two(store, clock):
    put_record(store, holder="machine-a/7", expires=clock.t + 1000)
    with pytest.raises(LeaseHeld):
        lease(store, clock, same_machine_takes_over=False, wait_s=0.0).acquire()


def test_a_lease_unchanged_for_a_whole_ttl_by_our_clock_is_taken_over(store, clock):
    # Its expiry is far ahead by the holder's clock (a skewed clock), but nobody rewrites it.
    said = []
    put_record(store, expires=clock.t + 10_000, ttl_s=20.0)
    assert lease(store, clock, said, wait_s=100.0).acquire() == 5
    assert sum(clock.sleeps) == 20.0 and clock.sleeps == [2.0] * 10
    (waiting, details), (taken, fields) = said
    assert (waiting, taken) == (layout.LEASE_WAIT, layout.LEASE_TAKEN)
    assert details == {"holder": "machine-b/9", "epoch": 4, "expires": clock.t - 20.0 + 10_000, "waited_s": 0.0,
                       "wait_s": 100.0}
    assert fields["reason"] == "not renewed for 20 s (machine-b/9)"


def test_a_lease_its_holder_keeps_renewing_is_refused_after_the_wait(store, clock):
    said = []
    a = lease(store, clock, said, wait_s=5.0)

    def renewing(seconds):
        clock.sleep(seconds)
        put_record(store, expires=clock.t + 30.0)  # a new version every poll

    a._sleep = renewing
    put_record(store, expires=clock.t + 30.0)
    with pytest.raises(LeaseHeld) as held:
        a.acquire()
    assert clock.sleeps == [2.0, 2.0, 1.0]  # polls, the last one cut to the wait's end
    assert held.value.details == {"holder": "machine-b/9", "epoch": 4, "expires": clock.t + 30.0, "waited_s": 5.0}
    assert str(held.value) == (
        "another trainer (machine-b/9, lease epoch 4) holds this run's lease and kept renewing it for the 5 s this "
        "one waited: two machines are training the same run. This one stops without writing to the run; if no "
        "other machine should train it, stop that one (or use another run id)")
    assert [k for k, _ in said] == [layout.LEASE_WAIT]  # said once, not once a poll
    assert record(store)["holder"] == "machine-b/9"


# -- holding it --

def test_a_lease_covers_writes_until_its_ttl_less_the_safety_margin(store, clock):
    a = lease(store, clock)
    with pytest.raises(LeaseLost, match="was not renewed in time"):
        a.check()  # never taken
    a.acquire()
    clock.t += 19.999
    a.check()
    clock.t += 0.001
    with pytest.raises(LeaseLost, match=r"lease \(epoch 1\) was not renewed in time; not writing"):
        a.check()
    a.renew()
    a.check()
    assert a.lost is None and record(store)["expires"] == clock.t + 30.0


def test_renewing_a_lease_never_taken_says_so(store, clock):
    a = lease(store, clock)
    with pytest.raises(LeaseLost, match="^this trainer never took the run's lease$"):
        a.renew()
    assert a.lost is None  # never taken is not lost


def test_a_lease_taken_over_is_lost_for_good_and_the_trainer_told(store, clock):
    lost = []
    a = lease(store, clock, on_lost=lost.append)
    a.acquire()
    put_record(store, holder="machine-b/9", epoch=2)
    with pytest.raises(LeaseLost) as e:
        a.fence()
    why = str(e.value)
    assert why == ("the run's lease was taken over (machine-b/9, epoch 2) while this trainer (epoch 1) held it: "
                   "another machine is training this run; this one stops committing")
    assert lost == [why] and a.lost == why
    for call in (a.renew, a.check):
        with pytest.raises(LeaseLost, match="taken over"):
            call()
    assert record(store)["holder"] == "machine-b/9"  # nothing written over it


def test_a_lease_deleted_under_its_holder_is_lost(store, clock):
    a = lease(store, clock)
    a.acquire()
    store.delete_prefix(layout.LEASE_KEY)
    with pytest.raises(LeaseLost, match=r"taken over \(the lease is gone\)"):
        a.renew()


# -- letting go --

def test_release_marks_the_lease_released_once(store, clock):
    a = lease(store, clock)
    a.release()  # never taken: nothing to write
    assert not store.exists(layout.LEASE_KEY)
    a.acquire()
    a.release()
    doc = record(store)
    assert (doc["released"], doc["epoch"], doc["token"]) == (True, 1, a.token)
    assert a.lost == "released"
    with pytest.raises(LeaseLost, match="^released$"):
        a.check()
    b = lease(store, clock, holder="machine-b/2")
    assert b.acquire() == 2


def test_a_lost_lease_is_not_released_over_its_new_holder(store, clock):
    a = lease(store, clock)
    a.acquire()
    put_record(store, holder="machine-b/9", epoch=2)
    with pytest.raises(LeaseLost):
        a.renew()
    a.release()
    assert record(store)["holder"] == "machine-b/9" and "released" not in record(store)


# -- renewing in the background (real time, a short TTL) --

def _until(check, what: str, timeout: float = 10.0):
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.02)


def test_the_background_renewal_keeps_the_lease_and_says_when_it_is_lost(store):
    said = []
    # Renewed every second (ttl/4): a renewal late by 3.5 s would lose the lease by its own clock and say
    # another reason; with a 0.4 s TTL a loaded machine's 0.3 s pause did (the real clock, a real thread).
    a = RunLease(store, holder="machine-a/1", ttl_s=4.0, safety_s=0.5, skew_s=0.5, poll_s=0.05,
                 emit=lambda kind, fields: said.append((kind, fields)))
    a.acquire()
    first = record(store)["nonce"]
    a.start()
    thread = a._thread
    assert (thread.name, thread.daemon, thread.is_alive()) == ("run-lease", True, True)
    a.start()
    assert a._thread is thread  # one renewer
    # Renewed every ttl/4: a new record well within a few TTLs, however loaded the machine.
    _until(lambda: record(store)["nonce"] != first, "a renewal")
    put_record(store, holder="machine-b/9", epoch=2)
    _until(lambda: said, "the lost lease being said")
    (kind, fields), = said
    assert kind == layout.LEASE_LOST and fields["reason"].startswith("the run's lease was taken over (machine-b/9")
    _until(lambda: not thread.is_alive(), "the renewer ending")
    a.release()
    assert a._thread is None and record(store)["holder"] == "machine-b/9"


def test_release_stops_the_renewer_and_marks_the_lease_released(store):
    a = RunLease(store, holder="machine-a/1", ttl_s=0.4, safety_s=0.1, skew_s=0.1, poll_s=0.05)
    a.acquire()
    a.start()
    thread = a._thread
    a.release()
    assert not thread.is_alive() and a._thread is None
    assert record(store)["released"] is True


# -- more of what the trainer is told --

@pytest.mark.parametrize(("theirs", "taken"), [("rack/m-1/7", True), ("rack/m-2/7", False)])
def test_the_machine_is_all_of_the_holder_but_its_pid(store, clock, theirs, taken):
    put_record(store, holder=theirs, expires=clock.t + 1000)
    a = lease(store, clock, holder="rack/m-1/1", wait_s=0.0)
    if taken:
        assert a.acquire() == 5
    else:
        with pytest.raises(LeaseHeld):
            a.acquire()


@pytest.mark.parametrize(("change", "reason"), [
    (lambda store: put_record(store, released=True), "released"),
    (lambda store: store.delete_prefix(layout.LEASE_KEY), "no lease"),
    (lambda store: store.put_bytes(layout.LEASE_KEY, b"garbage"), "unreadable lease"),
])
def test_a_lease_freed_while_waiting_is_taken_saying_how(store, clock, change, reason):
    said = []
    put_record(store, expires=clock.t + 1000)
    a = lease(store, clock, said, wait_s=100.0)
    a._sleep = lambda seconds: (clock.sleep(seconds), change(store))
    a.acquire()
    assert [k for k, _ in said] == [layout.LEASE_WAIT, layout.LEASE_TAKEN]
    assert said[1][1]["reason"] == reason


def test_an_emit_that_fails_does_not_stop_the_lease(store, clock):
    def broken(kind, fields):
        raise RuntimeError("printer on fire")

    put_record(store, holder="machine-a/7", expires=clock.t + 1000)
    a = RunLease(store, holder="machine-a/1", ttl_s=30.0, clock=clock, monotonic=clock, sleep=clock.sleep, emit=broken)
    assert a.acquire() == 5


def test_release_with_the_store_down_leaves_the_lease_to_expire(store, clock, monkeypatch):
    a = lease(store, clock)
    a.acquire()

    def down(*args, **kwargs):
        raise ConnectionError("store down")

    monkeypatch.setattr(store, "put_bytes_if", down)
    a.release()  # no error: the lease runs out by itself
    assert record(store)["released"] is False and a.lost == "released"


# -- conflicts, lost answers, the renewal's rhythm --

def _conflicts(store, n: int | None):
    """Make the store answer the next `n` conditional writes (all, for None) with 409, as S3's
    ConditionalRequestConflict and GCS's Conflict do; the rest are written. Returns the calls."""
    from runfolder.storage import WriteConflict

    real = store.put_bytes_if
    calls = []

    def put_bytes_if(key, data, *, version):
        calls.append(version)
        if n is None or len(calls) <= n:
            raise WriteConflict(f"{key}: 409")
        return real(key, data, version=version)

    store.put_bytes_if = put_bytes_if
    return calls


def test_a_renewal_that_meets_writes_in_flight_tries_again_with_growing_pauses(store, clock):
    a = lease(store, clock)
    a.acquire()
    first = record(store)["nonce"]
    calls = _conflicts(store, 2)
    a.renew()
    assert len(calls) == 3 and clock.sleeps == [0.25, 0.5]
    assert record(store)["nonce"] != first and record(store)["token"] == a.token and a.lost is None


def test_a_renewal_that_keeps_meeting_writes_in_flight_gives_up_still_holding_the_lease(store, clock):
    from runfolder.lease import LeaseBusy

    a = lease(store, clock)
    a.acquire()
    calls = _conflicts(store, None)
    with pytest.raises(LeaseBusy) as busy:
        a.renew()
    assert str(busy.value) == ("the run's lease (epoch 1) met another write in flight 4 times in a row; "
                               "still ours, not renewed")
    assert len(calls) == 4 and clock.sleeps == [0.25, 0.5, 0.75]
    assert a.lost is None and record(store)["token"] == a.token


def test_a_lost_lease_is_lost_even_when_telling_the_trainer_fails(store, clock):
    def broken(reason):
        raise RuntimeError("on_lost failed")

    a = lease(store, clock, on_lost=broken)
    a.acquire()
    put_record(store, holder="machine-b/9", epoch=2)
    with pytest.raises(LeaseLost, match="taken over"):
        a.renew()
    assert a.lost and "taken over" in a.lost


def test_a_write_whose_answer_was_lost_is_ours_and_renewed_from_its_version(store, clock):
    """The conditional write reached the store but its answer did not: the retry is refused
    (412), the object holds our nonce, so the lease is ours at the version the store holds."""
    from runfolder.storage import PreconditionFailed

    real = store.put_bytes_if
    calls = []

    def answer_lost(key, data, *, version):
        calls.append(version)
        if len(calls) == 1:
            real(key, data, version=version)
            raise PreconditionFailed(f"{key}: 412")
        return real(key, data, version=version)

    store.put_bytes_if = answer_lost
    a = lease(store, clock)
    assert a.acquire() == 1 and calls == [None]
    a.check()
    a.renew()  # conditional on the version the store holds, not on "absent"
    _, version = store.get_versioned(layout.LEASE_KEY)
    assert calls[1] is not None and a._version == version and record(store)["token"] == a.token


def test_a_write_refused_for_another_writers_record_looks_again(store, clock):
    from runfolder.storage import PreconditionFailed

    real = store.put_bytes_if
    calls = []

    def raced(key, data, *, version):
        calls.append(version)
        if len(calls) == 1:  # another trainer wrote first, its own record
            put_record(store, holder="machine-b/9", epoch=1, expires=clock.t + 1000)
            raise PreconditionFailed(f"{key}: 412")
        return real(key, data, version=version)

    store.put_bytes_if = raced
    a = lease(store, clock, wait_s=0.0)
    with pytest.raises(LeaseHeld, match=r"machine-b/9, lease epoch 1"):
        a.acquire()
    assert calls == [None] and a.epoch is None and record(store)["holder"] == "machine-b/9"


class _Stop:
    """The renewer's stop event: records each wait and is set after `rounds` of them."""

    def __init__(self, rounds: int) -> None:
        self.rounds, self.waits = rounds, []

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return len(self.waits) > self.rounds


def test_the_renewer_renews_every_quarter_ttl_and_outlasts_a_failing_store(store, clock):
    a = lease(store, clock)
    a.acquire()
    a._stop = _Stop(rounds=3)
    renewals = []

    def renew():
        renewals.append(clock.t)
        if len(renewals) == 1:
            raise ConnectionError("store down")  # the store's own retries gave up: next round

    a.renew = renew
    a._renew_loop()
    assert a._stop.waits == [7.5] * 4 and len(renewals) == 3


def test_the_renewer_stops_once_the_lease_is_lost_and_says_so(store, clock):
    said = []
    a = lease(store, clock, said)
    a.acquire()
    a._stop = _Stop(rounds=5)
    put_record(store, holder="machine-b/9", epoch=2)
    a._renew_loop()
    assert len(a._stop.waits) == 1
    (kind, fields), = said
    assert kind == layout.LEASE_LOST and fields["reason"].startswith("the run's lease was taken over (machine-b/9")


def test_a_lease_that_turns_out_ours_while_waiting_is_taken_saying_so(store, clock):
    # Our own earlier write, landing late while we waited on another holder's record.
    said = []
    put_record(store, expires=clock.t + 1000)
    a = lease(store, clock, said, wait_s=100.0)
    a._sleep = lambda seconds: (clock.sleep(seconds), put_record(store, token=a.token, expires=clock.t + 1000))
    assert a.acquire() == 5
    assert [k for k, _ in said] == [layout.LEASE_WAIT, layout.LEASE_TAKEN] and said[1][1]["reason"] == "ours"


def test_taking_a_lease_that_meets_a_write_in_flight_looks_again_shortly(store, clock):
    calls = _conflicts(store, 1)
    a = lease(store, clock)
    assert a.acquire() == 1
    assert calls == [None, None] and clock.sleeps == [0.25] and record(store)["token"] == a.token


def test_the_wait_is_reported_to_the_tenth_of_a_second_and_its_last_pause_cut_to_it(store, clock):
    said = []
    put_record(store, expires=clock.t + 1000)
    with pytest.raises(LeaseHeld) as held:
        lease(store, clock, said, wait_s=0.26).acquire()
    assert clock.sleeps == [0.26] and held.value.details["waited_s"] == 0.3
    (kind, fields), = said
    assert kind == layout.LEASE_WAIT and (fields["wait_s"], fields["waited_s"]) == (0.3, 0.0)
