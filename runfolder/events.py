"""The event contract as readers see it: the run's JSON-lines events, their times, and what they add up to.

Every event is one JSON object per line in `<run-uri>/events.jsonl` (and in each machine's
`events/<host>.jsonl`), with `event`, `time` (UTC, ISO 8601) and `attempt`; the names, keys and
fields are `runfolder.layout`'s. The trainer writes them (`trainer.events.EventLog`); the trainer's
end record, `ops status` and the cost arithmetic read them with these functions.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from runfolder import exits, layout
from runfolder.storage import NotFound


def utc_now() -> str:
    """Current UTC time as ISO 8601 with milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def parse_time(text: str) -> float:
    """An event's `time` back to a POSIX timestamp."""
    return datetime.fromisoformat(text).timestamp()


def read_events(store) -> list[dict]:
    """The run's events so far (an unreadable line is skipped: it cannot be trusted)."""
    return read_jsonl(store, layout.EVENTS_KEY)


def read_jsonl(store, key: str) -> list[dict]:
    """The JSON objects of a JSON-lines object of the run; a torn or foreign line is skipped."""
    try:
        raw = store.get_bytes(key).decode("utf-8", "replace")
    except NotFound:
        return []
    out = []
    for line in raw.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        # A line whose `event` is not a name is foreign too: every reader matches it against
        # names (sets of them included, where a list or an object would raise).
        if isinstance(ev, dict) and isinstance(ev.get(layout.EVENT, ""), str):
            out.append(ev)
    return out




def seconds_lost(events: list[dict]) -> float:
    """Time the run stood still because machines were taken: from each interrupted attempt's end to the next `resumed`.

    An attempt is interrupted when it ends with `preempted`, with a `failed` event whose
    `exit_code` says a peer was missing or lost (`exits.NO_CLUSTER`, `exits.PEER_LOST`),
    or with nothing at all: a machine reclaimed without notice (SIGKILL) writes no last
    event, so the attempt's last event is the last moment it is known to have run.
    A failure of the attempt's own (any other `failed`) is not preemption and not counted.
    """
    peer_codes = (exits.NO_CLUSTER, exits.PEER_LOST)
    lost, since, last, ended, current = 0.0, None, None, True, None
    for ev in events:
        kind = ev.get(layout.EVENT)
        try:
            t = parse_time(ev[layout.TIME])
        except (KeyError, TypeError, ValueError):
            continue
        attempt = ev.get(layout.ATTEMPT)
        # A new attempt speaks (its `started`, or an event before it such as a start-up `failed`).
        if kind == layout.STARTED or (attempt is not None and attempt != current):
            if not ended and since is None and last is not None:
                since = last  # the previous attempt stopped without a word: killed
            ended, current = False, attempt
        if kind == layout.PREEMPTED or (kind == layout.FAILED_EVENT and ev.get("exit_code") in peer_codes):
            since = t if since is None else since
            ended = True
        elif kind in (layout.FINISHED, layout.FAILED_EVENT, layout.CANCELLED_EVENT):
            ended = True
        elif kind == layout.RESUMED and since is not None:
            lost += max(0.0, t - since)
            since = None
        last = t
    return round(lost, 3)
