"""The run's single-writer lease: conditional writes as each store decides them, and two trainers on one run.

S3 runs on moto_server, which enforces `If-None-Match: *` and `If-Match` on PutObject (checked
below through the store). The GCS emulator ignores `ifGenerationMatch` (also checked below,
against the emulator itself); the GCS cases run behind `tests/fixtures/gcs_preconditions.py`,
which enforces it as GCS documents, deciding racing writes one at a time. moto decides a
condition and the write in two steps without a lock of its own, so the concurrent-race
test on S3 shows the store's API used rightly, not S3's atomicity, which only AWS provides.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from runfolder import exits, layout
from runfolder.lease import LeaseBusy, LeaseHeld, LeaseLost, RunLease
from runfolder.storage import PreconditionFailed, WriteConflict, open_store
from trainer.checkpoint_store import CheckpointStore

pytestmark = pytest.mark.slow

BACKENDS = ["file", "s3", "gs"]


@pytest.fixture(params=BACKENDS)
def run(request):
    """A fresh run on each store; GCS behind the precondition gate."""
    name = {"file": "file_run", "s3": "s3_run", "gs": "gs_run_enforced"}[request.param]
    return request.getfixturevalue(name)


def _lease(store, **kw) -> RunLease:
    # Short times, same rules: a 3 s lease trusted for 2 s after each renewal.
    kw = {"ttl_s": 3.0, "safety_s": 1.0, "skew_s": 1.0, "poll_s": 0.2, **kw}
    return RunLease(store, **kw)


def _dir(tmp_path, name: str, files: dict[str, bytes]) -> str:
    d = tmp_path / name
    d.mkdir()
    for rel, data in files.items():
        (d / rel).write_bytes(data)
    return str(d)


# -- what the stores enforce -------------------------------------------------------------


def test_the_gcs_emulator_ignores_generation_preconditions(gs_run):
    """Why the GCS cases need the gate: the emulator writes whatever ifGenerationMatch says."""
    from google.cloud import storage

    blob = storage.Client().bucket(gs_run.bucket).blob("probe")
    blob.upload_from_string(b"one", if_generation_match=0)
    blob.upload_from_string(b"two", if_generation_match=0)  # GCS answers 412 here
    assert blob.download_as_bytes() == b"two"


def test_conditional_writes_are_decided_by_the_store(run):
    store = open_store(run.uri)
    v1 = store.put_bytes_if("lease.json", b"one", version=None)
    with pytest.raises(PreconditionFailed):
        store.put_bytes_if("lease.json", b"again", version=None)  # create-only: it exists
    data, v = store.get_versioned("lease.json")
    assert (data, v) == (b"one", v1)
    v2 = store.put_bytes_if("lease.json", b"two", version=v1)
    assert v2 != v1
    with pytest.raises(PreconditionFailed):
        store.put_bytes_if("lease.json", b"stale", version=v1)  # changed since v1
    assert store.get_versioned("lease.json") == (b"two", v2)
    if run.proxy is not None:  # GCS: the gate decided (and refused) both conditional failures
        refused = [d for d in run.proxy.gate.decisions if d[4]]
        assert len(refused) == 2, run.proxy.gate.decisions


def test_of_racing_writers_from_one_version_exactly_one_wins(run):
    store = open_store(run.uri)
    base = store.put_bytes_if("lease.json", b"base", version=None)
    results: list[str] = []
    go = threading.Barrier(6)

    def writer(i: int) -> None:
        mine = open_store(run.uri)  # each its own client, as separate machines have
        go.wait(10)
        try:
            mine.put_bytes_if("lease.json", f"w{i}".encode(), version=base)
            results.append(f"w{i}")
        except PreconditionFailed:
            results.append("refused")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [r for r in results if r != "refused"]
    assert len(results) == 6 and len(winners) == 1, results
    assert store.get_bytes("lease.json").decode() == winners[0]


# -- the lease ----------------------------------------------------------------------------


def test_a_held_lease_is_waited_for_then_refused_and_a_released_one_taken_at_once(run):
    first = _lease(open_store(run.uri), holder="machine-a")
    assert first.acquire() == 1
    first.start()
    said, slept = [], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    second = _lease(open_store(run.uri), holder="machine-b", wait_s=4.0, emit=lambda k, f: said.append(k), sleep=sleep)
    t0 = time.monotonic()
    with pytest.raises(LeaseHeld, match=r"machine-a, lease epoch 1\) holds this run's lease") as held:
        second.acquire()
    # It waited its whole bound (longer than the TTL: a renewing holder is alive).
    assert time.monotonic() - t0 >= 4.0 and held.value.details["holder"] == "machine-a"
    assert said == [layout.LEASE_WAIT]
    first.check()  # still ours, renewed meanwhile
    assert slept, "it waited by polling"
    first.release()
    slept.clear()
    assert second.acquire() == 2  # released: taken at once, next epoch
    # At once: not one poll's pause and nothing said about waiting (a count, not a time, so a
    # loaded machine cannot fail it).
    assert slept == [] and said == [layout.LEASE_WAIT]
    doc = json.loads(open_store(run.uri).get_bytes(layout.LEASE_KEY))
    assert doc["holder"] == "machine-b" and doc["epoch"] == 2 and not doc["released"]


def test_a_lease_nobody_renews_is_taken_over_and_its_holder_fenced(run):
    frozen = _lease(open_store(run.uri), holder="frozen")
    # From before the frozen holder's write: its lease runs out 3 s (+1 s skew) after that write,
    # however long a loaded machine takes between the two acquires.
    t0 = time.monotonic()
    frozen.acquire()  # never renewed: a machine that stopped (or lost its network)
    lost = []
    frozen.on_lost = lost.append
    taker = _lease(open_store(run.uri), holder="taker")
    assert taker.acquire() == 2
    assert time.monotonic() - t0 >= 2.0  # only once the lease had run out
    with pytest.raises(LeaseLost, match=r"taken over \(taker, epoch 2\)"):
        frozen.fence()
    assert lost and "taken over" in lost[0]
    with pytest.raises(LeaseLost):
        frozen.check()
    frozen.release()  # does not release the taker's lease
    assert json.loads(open_store(run.uri).get_bytes(layout.LEASE_KEY))["holder"] == "taker"


def test_a_write_whose_answer_was_lost_still_takes_the_lease(faulty_s3):
    """The conditional PUT reached the store, its answer did not: the retry gets 412, and the
    lease finds its own nonce in the object rather than calling itself refused."""
    lease = _lease(open_store(faulty_s3.uri), holder="a")
    store = lease.store
    real = store._put_bytes_if
    calls = []

    def once_lost(key, data, version):
        calls.append(version)
        if len(calls) == 1:
            faulty_s3.proxy.fail_next(1, "lost")  # this PUT is carried out, its answer lost
        return real(key, data, version)

    store._put_bytes_if = once_lost
    assert lease.acquire() == 1
    assert faulty_s3.proxy.failed_by_mode["lost"] == 1 and calls == [None]  # botocore retried inside
    lease.check()
    assert json.loads(store.get_bytes(layout.LEASE_KEY))["token"] == lease.token


class _Conflicts:
    """A FaultProxy gate: the next ``n`` conditional writes of the lease are answered 409, the
    store's "another write to this object is in flight" (S3 ``ConditionalRequestConflict``; GCS's
    JSON 409), and nothing is written; the rest go on (through ``inner``, GCS's precondition gate)."""

    def __init__(self, backend: str, n: int, inner=None) -> None:
        self.backend, self.left, self.inner, self.answered = backend, n, inner, 0

    def applies(self, method: str, path: str, headers) -> bool:
        if self.backend == "s3":
            return method == "PUT" and path.split("?")[0].endswith("/" + layout.LEASE_KEY) and (
                "If-Match" in headers or "If-None-Match" in headers)
        return self.inner.applies(method, path, headers)

    def refuse(self, method: str, path: str, headers, body: bytes):
        if self.left > 0 and method in ("PUT", "POST"):
            self.left -= 1
            self.answered += 1
            if self.backend == "s3":
                return 409, "application/xml", (
                    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code>'
                    b"<Message>A conflicting conditional operation is currently in progress against this "
                    b"resource. Please try again.</Message></Error>")
            return 409, "application/json", json.dumps({"error": {
                "code": 409, "message": "The object was edited during the operation. Please try again.",
                "errors": [{"reason": "conflict", "domain": "global", "message": "Conflict"}]}}).encode()
        return None if self.inner is None else self.inner.refuse(method, path, headers, body)


@pytest.mark.parametrize("backend", ["s3", "gs"])
def test_a_renewal_that_meets_another_write_in_flight_reads_again_and_keeps_the_lease(backend, request):
    """S3 409 ConditionalRequestConflict / GCS 409: the store decided nothing about the renewal and
    says to retry. The lease is read again, is still ours, and is written again: not lost."""
    run = request.getfixturevalue({"s3": "faulty_s3", "gs": "gs_run_enforced"}[backend])
    lost: list[str] = []
    lease = _lease(open_store(run.uri), holder="a", on_lost=lost.append)
    assert lease.acquire() == 1
    gate = _Conflicts(backend, 2, inner=run.proxy.gate)
    run.proxy.gate = gate
    lease.renew()
    assert gate.answered == 2 and lost == [] and lease.lost is None
    lease.check()
    doc = json.loads(open_store(run.uri).get_bytes(layout.LEASE_KEY))
    assert (doc["holder"], doc["token"], doc["epoch"]) == ("a", lease.token, 1)
    # A refusal is still a refusal: another machine takes the lease over, the next renewal is lost.
    taker = _lease(open_store(run.uri), holder="b", wait_s=0.0)
    data, version = taker.store.get_versioned(layout.LEASE_KEY)
    taker.store.put_bytes_if(layout.LEASE_KEY, data.replace(lease.token.encode(), b"b" * 32), version=version)
    with pytest.raises(LeaseLost, match="taken over"):
        lease.renew()
    assert lost and "taken over" in lost[0]


def test_a_conflict_whose_other_write_won_is_a_lost_lease_and_endless_conflicts_are_bounded(file_run):
    store = open_store(file_run.uri)
    lease = _lease(store, holder="a")
    lease.acquire()
    real = store._put_bytes_if
    calls = []

    def conflict_then_taken(key, data, version):
        calls.append(version)
        # The write in flight was another machine's, and it won.
        other = json.loads(store.get_bytes(key))
        store.put_bytes(key, json.dumps({**other, "holder": "b", "token": "t-b"}).encode())
        raise WriteConflict(f"{key}: 409")

    store._put_bytes_if = conflict_then_taken
    with pytest.raises(LeaseLost, match=r"taken over \(b, epoch 1\)"):
        lease.renew()
    assert len(calls) == 1

    again = _lease(open_store(file_run.uri), holder="c", same_machine_takes_over=False)
    store2 = again.store
    store2.put_bytes(layout.LEASE_KEY, b"")  # an unreadable lease is taken over at once
    again.acquire()
    store2._put_bytes_if = lambda key, data, version: (_ for _ in ()).throw(WriteConflict(f"{key}: 409"))
    with pytest.raises(LeaseBusy):
        again.renew()  # a few tries, then neither renewed nor lost: the renewal loop tries next round
    assert again.lost is None
    store2._put_bytes_if = real.__func__.__get__(store2)
    again.renew()
    again.check()


# -- two trainers on one run -----------------------------------------------------------------


@pytest.mark.parametrize("run", ["s3", "gs"], indirect=True)
def test_a_second_trainer_on_the_run_commits_nothing_while_the_first_commits(run, tmp_path, monkeypatch):
    """Trainer A commits slowly (a large file on a slow link); trainer B starts on the same run
    meanwhile. B gets no lease, so it neither commits nor prunes; A's commit completes."""
    store_a = open_store(run.uri)
    lease_a = _lease(store_a, holder="machine-a")
    lease_a.acquire()
    lease_a.start()
    ck_a = CheckpointStore(store_a, lease=lease_a)
    uploading, let_go = threading.Event(), threading.Event()
    real_put = store_a.put_file

    def slow_put(key, path, **kw):
        uploading.set()
        let_go.wait(30)
        return real_put(key, path, **kw)

    monkeypatch.setattr(store_a, "put_file", slow_put)
    result = {}
    committing = threading.Thread(target=lambda: result.update(ck_a.commit(10, _dir(tmp_path, "a10", {"w": b"a" * 4096}))))
    committing.start()
    assert uploading.wait(10)

    store_b = open_store(run.uri)
    lease_b = _lease(store_b, holder="machine-b", wait_s=4.0)
    with pytest.raises(LeaseHeld):
        lease_b.acquire()  # A renews while it commits
    let_go.set()
    committing.join(30)
    assert result["step"] == 10 and result["lease_epoch"] == 1
    assert CheckpointStore(open_store(run.uri)).committed_steps() == [10]
    lease_a.release()
    # B's refusal wrote nothing: the lease is A's (released now), no checkpoint of B's.
    doc = json.loads(open_store(run.uri).get_bytes(layout.LEASE_KEY))
    assert doc["holder"] == "machine-a" and doc["epoch"] == 1


@pytest.mark.parametrize("run", ["s3", "gs"], indirect=True)
def test_a_trainer_whose_lease_was_taken_over_mid_commit_marks_nothing(run, tmp_path, monkeypatch):
    """A stalls mid-commit past its lease; B takes the run over and commits step 20; when A's
    upload resumes, its marker is refused by the fence and its prune deletes nothing of B's."""
    store_a = open_store(run.uri)
    lease_a = _lease(store_a, holder="machine-a")
    lease_a.acquire()  # A's renewals stop with it: no start()
    ck_a = CheckpointStore(store_a, lease=lease_a)
    uploading, let_go = threading.Event(), threading.Event()
    real_put = store_a.put_file

    def stalled_put(key, path, **kw):
        uploading.set()
        let_go.wait(30)
        return real_put(key, path, **kw)

    monkeypatch.setattr(store_a, "put_file", stalled_put)
    errors = []

    def commit_a() -> None:
        try:
            ck_a.commit(10, _dir(tmp_path, "a10", {"w": b"a" * 4096}))
        except LeaseLost as e:
            errors.append(e)

    committing = threading.Thread(target=commit_a)
    committing.start()
    assert uploading.wait(10)

    store_b = open_store(run.uri)
    lease_b = _lease(store_b, holder="machine-b")
    assert lease_b.acquire() == 2  # A's lease ran out
    ck_b = CheckpointStore(store_b, lease=lease_b, keep=1)
    ck_b.commit(20, _dir(tmp_path, "b20", {"w": b"b" * 4096}))
    let_go.set()
    committing.join(30)
    assert len(errors) == 1 and "taken over (machine-b, epoch 2)" in str(errors[0])
    check = CheckpointStore(open_store(run.uri))
    assert check.committed_steps() == [20]
    assert not open_store(run.uri).exists(layout.committed_key(10))
    ck_a.prune()  # A's prune after losing the lease: B's checkpoint stays
    assert check.committed_steps() == [20] and open_store(run.uri).exists("checkpoints/ckpt-20/w")


def test_the_lease_key_is_the_layouts(file_run):
    lease = _lease(open_store(file_run.uri))
    lease.acquire()
    assert os.path.isfile(os.path.join(file_run.uri.removeprefix("file://"), layout.LEASE_KEY))


def test_a_second_trainer_process_on_a_training_run_exits_77_and_writes_nothing(s3_run, tmp_path):
    """Two real trainers, two machines, one run: the second one started while the first commits
    checkpoints every few steps. It waits its bound, exits 77 with the holder named, and leaves
    the run's events and checkpoints alone; once the first stops (lease released), it takes over."""
    from tests.trainer.helpers import Trainer, kinds, run_trainer, store_events, trainer_env, waiting_model

    # Each batch 25 ms late: the first trainer commits every half second or so all the while the
    # second starts, at a small part of the CPU a full-speed loop would burn meanwhile.
    common = [*waiting_model(tmp_path / "code"), "--steps", "100000", "--batch-size", "32",
              "--checkpoint-every-steps", "20", "--log-every", "10", "--lease-ttl-s", "16"]
    first = Trainer(s3_run.uri, *common, env=trainer_env(s3_run.env, TRAINSTACK_MACHINE_ID="machine-a"))
    try:
        first.wait_event(layout.CHECKPOINT, timeout=180)
        before = store_events(s3_run.uri)
        rc, printed, _ = run_trainer(s3_run.uri, *common, "--lease-wait-s", "3",
                                     env=trainer_env(s3_run.env, TRAINSTACK_MACHINE_ID="machine-b"))
        assert rc == exits.LEASE_HELD, printed
        assert kinds(printed)[-1] == layout.FAILED_EVENT and layout.LEASE_WAIT in kinds(printed)
        assert "another trainer (machine-a/" in printed[-1]["reason"]
        after = store_events(s3_run.uri)
        # Nothing of the second trainer's in the run: one attempt started, all events the first's.
        assert kinds(after).count(layout.STARTED) == 1 and after[: len(before)] == before
        assert all(e.get(layout.ATTEMPT) == 1 for e in after)
        first.signal()
        assert first.wait(120) == exits.PREEMPTED
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    stopped_at = first.events[-1]["step"]
    assert json.loads(open_store(s3_run.uri).get_bytes(layout.LEASE_KEY))["released"] is True
    second = Trainer(s3_run.uri, *common, env=trainer_env(s3_run.env, TRAINSTACK_MACHINE_ID="machine-b"))
    try:
        resumed = second.wait_event(layout.RESUMED, timeout=180)
        assert resumed["step"] == stopped_at
        assert layout.LEASE_TAKEN not in kinds(second.events)  # a released lease is taken without a word
        doc = json.loads(open_store(s3_run.uri).get_bytes(layout.LEASE_KEY))
        assert (doc["holder"].split("/")[0], doc["epoch"], doc["released"]) == ("machine-b", 2, False)
        second.signal()
        assert second.wait(120) == exits.PREEMPTED
    finally:
        if second.proc.poll() is None:
            second.proc.kill()


def test_a_trainer_whose_lease_is_taken_over_stops_and_commits_nothing_more(s3_run, tmp_path):
    """Another machine takes the run over while this trainer trains: its next renewal finds the
    lease gone, it stops after the step, its final commit is refused by the fence, and it exits 77
    leaving the newest committed checkpoint the one from before the takeover."""
    from tests.trainer.helpers import Trainer, trainer_env, waiting_model

    # Each batch 25 ms late: it trains and commits until its renewal (every 4 s) finds the
    # takeover, at a small part of the CPU a full-speed loop would burn meanwhile.
    common = [*waiting_model(tmp_path / "code"), "--steps", "100000", "--batch-size", "32",
              "--checkpoint-every-steps", "20", "--log-every", "10", "--lease-ttl-s", "16"]
    trainer = Trainer(s3_run.uri, *common, env=trainer_env(s3_run.env, TRAINSTACK_MACHINE_ID="machine-a"))
    try:
        trainer.wait_event(layout.CHECKPOINT, timeout=180)
        store = open_store(s3_run.uri)
        # As another machine takes a lease: read, then write if unchanged. The trainer renews
        # every 4 s, and a renewal between the read and the write refuses the write (seen on
        # a loaded machine): read again then, as the other machine would.
        for _ in range(10):
            data, version = store.get_versioned(layout.LEASE_KEY)
            held = json.loads(data)
            taken = {**held, "holder": "machine-b/1", "token": "b", "epoch": held["epoch"] + 1, "nonce": "b",
                     "expires": time.time() + 600}
            try:
                store.put_bytes_if(layout.LEASE_KEY, json.dumps(taken).encode(), version=version)
                break
            except PreconditionFailed:
                continue
        else:
            pytest.fail("the lease could not be taken over in 10 tries")
        before = CheckpointStore(open_store(s3_run.uri)).committed_steps()
        rc = trainer.wait(120)  # a renewal every 4 s finds it
    finally:
        if trainer.proc.poll() is None:
            trainer.proc.kill()
    assert rc == exits.LEASE_HELD, trainer.events[-3:]
    assert trainer.events[-1]["event"] == layout.FAILED_EVENT and "taken over (machine-b/1" in trainer.events[-1]["reason"]
    after = CheckpointStore(open_store(s3_run.uri)).committed_steps()
    # At most a background commit already past its fence when the lease changed hands.
    assert max(after) <= max(before) + 20, (before, after)
    assert json.loads(open_store(s3_run.uri).get_bytes(layout.LEASE_KEY))["holder"] == "machine-b/1"
