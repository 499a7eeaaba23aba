"""`placement.json` itself: its reading, and a conditional write whose answer was lost."""

from __future__ import annotations

import pytest

from controller import record as records
from controller.record import Record
from runfolder.storage import PreconditionFailed, open_store


@pytest.mark.parametrize(("data", "named"), [
    (b'{"active": -1}', "active"),
    (b'{"active": true}', "active"),
    (b'{"moves": {"from": 0}}', "moves"),
    (b'{"failed_at": [1]}', "failed_at"),
    (b"[]", "expected a JSON object"),
])
def test_a_record_that_is_not_one_names_the_key(data, named):
    with pytest.raises(ValueError, match=f"placement.json: {named}"):
        Record.parse(data)


def test_a_record_reads_back_as_written(file_run):
    store = open_store(file_run.uri)
    assert records.read(store) == (Record(), None)
    rec = Record(active=1, since="2026-12-01T00:00:00.000Z", moves=[{"from": 0, "to": 1, "done": True}],
                 failed_at={"0": 1.5})
    version = records.write(store, rec, None)
    back, at = records.read(store)
    assert (back, at) == (rec, version)
    with pytest.raises(PreconditionFailed):
        records.write(store, Record(active=2), None)  # created already: If-None-Match refuses


@pytest.mark.slow
def test_a_write_whose_answer_was_lost_is_recognised_as_ours(faulty_s3):
    store = open_store(faulty_s3.uri)
    faulty_s3.proxy.fail_next(1, "lost")  # S3 writes it, the answer never comes; the retry meets our own write

    version = records.write(store, Record(active=1), None)

    assert faulty_s3.proxy.failed == 1
    assert records.read(store) == (Record(active=1, nonce=records.read(store)[0].nonce), version)
    with pytest.raises(PreconditionFailed):  # another writer's same write from "absent" is still refused
        records.write(store, Record(active=2), None)
