"""`placement.json` and the controller's events under writers that meet: each conditional write's
outcome when the store answers 409 (in flight), 412 (changed, or our own write whose answer was
lost), the record's fields as read and written, and the events written once.

A `file://` run folder behind a store that answers as S3 and GCS do when writers meet.
"""

from __future__ import annotations

import json
import time

import pytest

from controller import record as records
from controller.record import CONFLICT_TRIES, Record, epoch_of, iso
from runfolder import layout
from runfolder.storage import PreconditionFailed, WriteConflict, open_store

WAITING = {layout.EVENT: layout.CONTROLLER_WAITING, layout.TIME: "t", layout.ATTEMPT: None, "reason": "r",
           "key": "0:capacity:nowhere"}


class Meeting:
    """A store whose next conditional writes to ``key`` meet another writer, as ``plan`` says, one
    entry a write: ``"conflict"`` (409, nothing written), ``"ours-conflict"`` (written, then 409),
    ``"lost"`` (written, the answer lost: 412 on the retry), ``"theirs"`` (another writer's write
    lands first: 412), ``"theirs-conflict"`` (another writer's write, then 409)."""

    def __init__(self, store, key: str, plan: list[str], theirs: bytes = b"") -> None:
        self._store, self.key, self.plan, self.theirs = store, key, list(plan), theirs
        self.tries = 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def put_bytes_if(self, key: str, data: bytes, *, version):
        if key != self.key:
            return self._store.put_bytes_if(key, data, version=version)
        self.tries += 1
        what = self.plan.pop(0) if self.plan else "ok"
        if what == "conflict":
            raise WriteConflict("409")
        if what in ("ours-conflict", "lost"):
            self._store.put_bytes_if(key, data, version=version)
            raise (WriteConflict if what == "ours-conflict" else PreconditionFailed)("answer lost")
        if what in ("theirs", "theirs-conflict"):
            self._store.put_bytes(key, self.theirs)
            raise (WriteConflict if what == "theirs-conflict" else PreconditionFailed)("another writer")
        return self._store.put_bytes_if(key, data, version=version)


def _stored(store) -> dict:
    return json.loads(store.get_bytes(layout.PLACEMENT_KEY))


@pytest.mark.parametrize("plan", [["conflict"], ["conflict"] * (CONFLICT_TRIES - 1)])
def test_a_write_that_met_another_in_flight_is_tried_again(file_run, plan):
    store = Meeting(open_store(file_run.uri), layout.PLACEMENT_KEY, plan)

    version = records.write(store, Record(active=1), None)

    assert store.tries == len(plan) + 1
    assert records.read(store) == (Record(active=1, nonce=_stored(store)["nonce"]), version)


def test_a_write_always_in_flight_gives_up_after_its_tries_and_says_so(file_run):
    store = Meeting(open_store(file_run.uri), layout.PLACEMENT_KEY, ["conflict"] * CONFLICT_TRIES)

    with pytest.raises(PreconditionFailed, match=f"another write stayed in flight {CONFLICT_TRIES} times"):
        records.write(store, Record(active=1), None)

    assert store.tries == CONFLICT_TRIES and not store.exists(layout.PLACEMENT_KEY)


@pytest.mark.parametrize("plan", [["ours-conflict"], ["lost"], ["conflict", "lost"]])
def test_our_own_write_whose_answer_was_lost_is_ours(file_run, plan):
    store = Meeting(open_store(file_run.uri), layout.PLACEMENT_KEY, plan)
    rec = Record(active=2, moves=[{"from": 0, "to": 2, "done": False}])

    version = records.write(store, rec, None)

    assert records.read(store) == (rec, version) and store.tries == len(plan)


@pytest.mark.parametrize(("plan", "says"), [(["theirs-conflict"], "changed while it was written"),
                                            (["theirs"], "another writer")])
def test_another_writers_write_refuses_ours(file_run, plan, says):
    theirs = Record(active=1, nonce="theirs").dump()
    store = Meeting(open_store(file_run.uri), layout.PLACEMENT_KEY, plan, theirs)

    with pytest.raises(PreconditionFailed, match=says):
        records.write(store, Record(active=2), None)

    assert store.get_bytes(layout.PLACEMENT_KEY) == theirs and store.tries == 1


def test_a_write_from_a_version_replaces_only_that_version(file_run):
    store = open_store(file_run.uri)
    first = records.write(store, Record(active=0), None)
    second = records.write(store, Record(active=1), first)

    with pytest.raises(PreconditionFailed):
        records.write(store, Record(active=2), first)

    assert records.read(store)[0].active == 1 and records.read(store)[1] == second != first


def test_a_record_reads_every_field_as_the_writers_put_it():
    rec = Record.parse(json.dumps({"active": 2, "since": "2026-12-01T00:00:00.000Z", "moves": [{"from": 1}],
                                   "failed_at": {"0": "12.5", 1: 3}, "nonce": 7}).encode())

    assert rec == Record(active=2, since="2026-12-01T00:00:00.000Z", moves=[{"from": 1}],
                         failed_at={"0": 12.5, "1": 3.0}, nonce="7")
    assert Record.parse(b'{"moves": null, "failed_at": null}') == Record()
    assert Record.parse(rec.dump()) == rec
    assert set(json.loads(rec.dump())) == {"active", "since", "moves", "failed_at", "nonce"}
    # One key a line, as an operator reads it in the bucket's console.
    assert rec.dump().decode().splitlines()[:3] == ["{", ' "active": 2,', ' "since": "2026-12-01T00:00:00.000Z",']


@pytest.mark.parametrize(("data", "named"), [
    (b'{"active": "1"}', "active: expected a placement index, got '1'"),
    (b'{"active": 1.0}', "active"),
    (b'{"moves": [{"from": 0}, 1]}', "moves: expected a list of objects"),
    (b'{"moves": "m"}', "moves"),
    (b'{"failed_at": "x"}', "failed_at: expected an object"),
])
def test_a_record_with_a_field_of_the_wrong_kind_names_it(data, named):
    with pytest.raises(ValueError, match=f"^placement.json: {named}"):
        Record.parse(data)


@pytest.mark.parametrize(("moves", "pending"), [
    ([], None), ([{"to": 1, "done": True}], None), ([{"to": 1}], {"to": 1}),
    ([{"to": 1}, {"to": 2, "done": True}], None), ([{"to": 1, "done": True}, {"to": 2, "done": False}],
                                                   {"to": 2, "done": False})])
def test_only_the_last_move_not_yet_done_is_pending(moves, pending):
    assert Record(moves=moves).pending == pending


def test_time_stamps_read_as_epoch_seconds_and_anything_else_as_none(monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")  # an operator's laptop: a stamp without a zone is still UTC
    time.tzset()
    assert iso(1_800_000_000.25) == "2027-01-15T08:00:00.250Z"
    assert epoch_of("2027-01-15T08:00:00.250Z") == 1_800_000_000.25
    assert epoch_of("2027-01-15T08:00:00.250") == 1_800_000_000.25  # no zone: UTC, as the machines write
    assert epoch_of("2027-01-15T10:00:00+02:00") == 1_800_000_000.0
    assert [epoch_of(x) for x in ("", "soon", None, 5)] == [None] * 4


@pytest.fixture(autouse=True)
def _local_zone_back():
    yield
    time.tzset()  # monkeypatch has put TZ back; the process's zone follows it


def test_the_controllers_events_skip_what_is_not_one(file_run):
    store = open_store(file_run.uri)
    assert records.read_events(store) == ([], None)
    store.put_bytes(layout.PLACEMENT_EVENTS_KEY, b'{"event": "a"}\n{"ev\xe2\x82\n[1]\n\n{"event": "b"}\n')

    events, version = records.read_events(store)

    assert events == [{"event": "a"}, {"event": "b"}] and version == store.get_versioned(layout.PLACEMENT_EVENTS_KEY)[1]


def test_the_waiting_event_is_written_once_per_cause(file_run):
    store = open_store(file_run.uri)

    assert records.note_waiting(store, WAITING) is True
    assert records.note_waiting(store, {**WAITING, "reason": "said again"}) is False
    other = {**WAITING, "key": "0:other"}
    assert records.note_waiting(store, other) is True
    moved = {layout.EVENT: layout.MOVED, "move": 1}
    assert records.append_moved_once(store, moved) is True
    assert records.note_waiting(store, other) is True  # a move came between: the same cause is news again

    assert records.read_events(store)[0] == [WAITING, other, moved, other]


def test_an_event_appended_while_another_writer_appends_is_read_again_not_doubled(file_run):
    theirs = (json.dumps({layout.EVENT: layout.MOVED, "move": 1}) + "\n").encode()
    store = Meeting(open_store(file_run.uri), layout.PLACEMENT_EVENTS_KEY, ["theirs", "conflict"], theirs)

    assert records.append_moved_once(store, {layout.EVENT: layout.MOVED, "move": 2}) is True

    assert store.tries == 3
    assert [e["move"] for e in records.read_events(store)[0]] == [1, 2]
    store.plan = ["theirs"]  # another writer wrote move 1 again meanwhile: it is there, not written twice
    assert records.append_moved_once(store, {layout.EVENT: layout.MOVED, "move": 1}) is False


def test_an_event_that_cannot_be_appended_fails_the_move_but_not_the_waiting_note(file_run):
    store = Meeting(open_store(file_run.uri), layout.PLACEMENT_EVENTS_KEY, ["conflict"] * 20)

    with pytest.raises(PreconditionFailed, match=f"^{layout.PLACEMENT_EVENTS_KEY}: could not append after 8 tries$"):
        records.append_moved_once(store, {layout.EVENT: layout.MOVED, "move": 1})
    assert store.tries == 8

    assert records.note_waiting(store, WAITING) is False  # the next tick says it
    assert store.tries == 8 + 4 and not store.exists(layout.PLACEMENT_EVENTS_KEY)
