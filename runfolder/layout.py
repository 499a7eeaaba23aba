"""The run folder's contract: every name a run writes, and the events it tells, defined once.

A run lives at `<run-uri>` (`s3://B/runs/ID`, `gs://B/runs/ID` or `file:///...`). The
trainer, the operator CLI (`ops`), the Pulumi components (IAM prefixes, code keys), the
policy rules and the machine's boot scripts all speak of these names; this module is
their one definition. It imports nothing outside the standard library, so anything can
import it (the trainer's container, `ops` on a laptop, the Pulumi program).

The boot scripts in `userdata/` cannot import Python: `tests/userdata/test_layout_names.py`
keeps their spellings equal to the ones here.

One writer per object:
  trainer (chief)        events.jsonl, progress.json, checkpoints/, tensorboard/, model/, outputs/, COMPLETE,
                         CANCELLED (after a committed checkpoint, when it finds STOP)
  trainer (other worker) worker-events/<address>.jsonl (its own `failed` events)
  machine scripts        machine-events/<machine>.jsonl (each machine its own), logs/<machine>/,
                         deadline (first boot), FAILED / TIMED_OUT (finish path)
  ops                    STOP (a request the trainer polls)
  placement controller   placement.json (which placement is active, the moves; conditional writes
  and `ops move`         only, see controller/record.py), machine-events/placement.jsonl (its
                         `moved` events, appended only by the writer whose placement.json write won)
  placement controller   prices.json (the placements' spot prices with their as_of, controller/prices.py),
                         decisions/<time>.json (one table per decision, controller/table.py)
  the first machine to install a package key    <bucket>/cache/pip/<key>/ (trainer/pip_cache.sh;
                         COMMITTED by a create-if-absent write, so one machine's archive is named)
  the first trainer to count a data set    <bucket>/cache/data/<digest>.json (trainer/staging.py;
                         create-if-absent, so the first count is the one kept)
  trainer (chief) holding the run's lease    lease.json (taken, renewed and released by conditional
                         writes only; see runfolder/lease.py); whoever holds it is the one trainer
                         that may write the chief's objects above
"""

from __future__ import annotations

import datetime

# -- bucket-level prefixes (relative to the bucket root) --

RUNS_PREFIX = "runs/"
CODE_PREFIX = "code/"
# What one machine installs and every later machine of any run reuses (trainer/pip_cache.sh): the
# trainer's packages as one archive per (requirements, image) key, cache/pip/<key>/<sha256>.tar.gz,
# then cache/pip/<key>/COMMITTED (that sha256) written last and only once (create-if-absent).
CACHE_PREFIX = "cache/"
PIP_CACHE_DIR = "pip"  # cache/pip/<key>/
# The record counts of a --data-uri data set (trainer/staging.py): cache/data/<digest>.json, written
# once (create-if-absent) by the first trainer that counted every file; the digest names the listing.
DATA_INDEX_DIR = "data"  # cache/data/<digest>.json

# -- run-level keys (relative to the run folder) --

EVENTS_KEY = "events.jsonl"
PROGRESS_KEY = "progress.json"
CHECKPOINTS_PREFIX = "checkpoints/"
CHECKPOINT_DIR = "ckpt"  # checkpoints/ckpt-<step>/
COMMITTED = "COMMITTED"  # checkpoints/ckpt-<step>/COMMITTED, written last
TENSORBOARD_PREFIX = "tensorboard/"
MODEL_PREFIX = "model/"
# Script mode: what the command writes to fit.output_dir() (TRAINSTACK_OUTPUT_DIR), kept at each
# committed checkpoint and at the end (trainer/script.py); `ops pull --outputs` fetches it.
OUTPUTS_PREFIX = "outputs/"
LOGS_PREFIX = "logs/"
DEADLINE_KEY = "deadline"
MACHINE_EVENTS_PREFIX = "machine-events/"
STOP_KEY = "STOP"
RENDEZVOUS_PREFIX = "rendezvous/"  # several machines: membership records by generation
WORKER_EVENTS_PREFIX = "worker-events/"  # several machines: a non-chief worker's own `failed` events
LEASE_KEY = "lease.json"  # the single-writer lease (runfolder/lease.py)
# Several placements: which one is active and every move (controller/record.py). Absent:
# placement 0 (home) is active.
PLACEMENT_KEY = "placement.json"
# A managed scheduler's run (trainstack:scheduler sagemaker): which service runs it and its newest job, written
# by whoever submits the job (`ops start`, schedulers/), read by `ops status` and `ops stop`. Absent: the groups.
SCHEDULER_KEY = "scheduler.json"
# The placement controller's own events (`moved`), among the machines' so `ops status` shows them.
PLACEMENT_EVENTS_KEY = f"{MACHINE_EVENTS_PREFIX}placement.jsonl"
# The placements' spot prices as the controller last read them from each cloud, each with its as_of
# (controller/prices.py): the cache that spares a tick the clouds' price APIs, and says how old a price is.
PRICES_KEY = "prices.json"
# One object per placement decision: every placement's price, its age, rate, preemptions, transfer, expected
# cost to finish and feasibility (controller/table.py), decisions/<UTC time>.json, so they sort by time.
DECISIONS_PREFIX = "decisions/"

# -- how the bucket tells a checkpoint's objects from the rest (components/*/bucket.py) --

# Pruning a checkpoint leaves its bytes as noncurrent versions in the versioned bucket; a
# lifecycle rule removes those within days, while every other object keeps the bucket's longer
# noncurrent window. Lifecycle filters cannot match runs/<id>/checkpoints/ (a prefix after the
# run id), so the trainer marks each checkpoint object when it uploads it: an S3 object tag
# (lifecycle rules filter on tags) and, on GCS, the object's Custom-Time (rules have a
# daysSinceCustomTime condition, and nothing else the trainer sets is matched). Objects outside
# checkpoints/ never carry the mark.
CHECKPOINT_TAG_KEY = "trainstack-kind"
CHECKPOINT_TAG_VALUE = "checkpoint"
# Days a pruned checkpoint's bytes stay restorable (noncurrent) before the rule removes them.
CHECKPOINT_NONCURRENT_DAYS = 1

# -- terminal markers: exactly one ends a run; JSON documents at the top of the run folder --

COMPLETE = "COMPLETE"
FAILED = "FAILED"
TIMED_OUT = "TIMED_OUT"
CANCELLED = "CANCELLED"
END_MARKERS = (COMPLETE, FAILED, TIMED_OUT, CANCELLED)
FAILING_MARKERS = frozenset({FAILED, TIMED_OUT})

# Fields every end marker carries (others may follow: metrics, reason, totals).
MARKER_STEP = "step"
MARKER_ATTEMPTS = "attempts"
MARKER_REASON = "reason"

# -- events: one JSON object per line; every one has EVENT, TIME and ATTEMPT --

EVENT = "event"
TIME = "time"
ATTEMPT = "attempt"

STARTED = "started"
RESUMED = "resumed"
CHECKPOINT = "checkpoint"
PREEMPTED = "preempted"
FINISHED = "finished"
FAILED_EVENT = "failed"
# Informational: a checkpoint that could not be used or written, a retried transfer,
# a run found already complete (printed, never stored).
CHECKPOINT_SKIPPED = "checkpoint_skipped"
CHECKPOINT_FAILED = "checkpoint_failed"
UPLOAD_RETRY = "upload_retry"
ALREADY_COMPLETE = "complete"
ALREADY_CANCELLED = "already_cancelled"
# A validation pass (step, metrics as val_<name>, examples, seconds, the best so far), and the
# warning that it costs more than a tenth of the training time between two of them.
EVALUATED = "evaluated"
EVAL_SLOW = "eval_slow"
# A model's own make_dataset on resume: its pipeline state restored from the checkpoint
# (batches_seen, seconds, bytes), or the consumed batches skipped (batches, seconds, reason);
# and, once an attempt, why its checkpoints hold no pipeline state (step, reason).
DATA_RESTORED = "data_restored"
DATA_SKIPPED = "data_skipped"
DATA_STATE_UNSAVED = "data_state_unsaved"
# A --data-uri data set downloaded while training starts (trainer/staging.py): what was on disk when the
# first step ended (files, bytes, of files_total, bytes_total, seconds since staging began), and the end
# of staging (files, bytes, downloaded, records, counted, index, seconds).
DATA_FIRST_STEP = "data_first_step"
DATA_STAGED = "data_staged"
# The run ended early on request (ops stop wrote STOP): a checkpoint is committed, CANCELLED written.
CANCELLED_EVENT = "cancelled"
# The run's lease (printed, never stored: a trainer without the lease writes nothing to the run).
LEASE_TAKEN = "lease_taken"
LEASE_WAIT = "lease_wait"
LEASE_LOST = "lease_lost"
# The machine's own events (machine-events/<machine>.jsonl).
SPOT_NOTICE = "spot_notice"
REBALANCE = "rebalance"
MACHINE_FINISH = "finish"
# finish.sh could not scale the group to zero (with the CLI's error): the group will relaunch a machine.
MACHINE_SCALE_FAILED = "scale_failed"
# The machine stopped a trainer that made no progress for its bound and shut down for a fresh one (reason,
# committed: the newest committed step, key: the machine, or the generation with several machines).
MACHINE_STALLED = "stalled"
# A Job's pod began (trainer/pod.py; the pod is the machine: machine-events/<pod>.jsonl): instance (the pod),
# node, namespace, index (its completion index).
POD_STARTED = "pod"
# A machine of several has waited long for the others (generation, came, nodes, since, until).
WAITING_FOR_MACHINES = "waiting_for_machines"
# The run moved to another placement (controller/ or `ops move`): from, to (placement indexes), the
# reason and the newest committed step it resumes from.
MOVED = "moved"
# The placement controller finds that the run cannot train anywhere now (its active placement cannot
# launch and no other may be tried, or its launches fail for a reason no move fixes): the reason, the
# active placement and a key (the same key is written once in a row).
CONTROLLER_WAITING = "waiting"

# The fields each event carries besides EVENT, TIME and ATTEMPT (required ones).
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    STARTED: ("config", "workers", "worker", "replicas", "global_batch", "precision"),
    RESUMED: ("step", "examples_seen", "batches_seen"),
    CHECKPOINT: ("step", "seconds", "bytes"),
    PREEMPTED: ("step", "signal", "seconds", "examples_seen"),
    FINISHED: ("step", "metrics", "examples_seen"),
    FAILED_EVENT: ("reason",),
    CANCELLED_EVENT: ("step", "reason", "examples_seen"),
    EVALUATED: ("step", "metrics", "examples", "seconds", "train_seconds", "eval_seconds_total"),
    EVAL_SLOW: ("step", "seconds", "train_seconds", "share", "message"),
    CHECKPOINT_SKIPPED: ("step", "reason"),
    DATA_RESTORED: ("batches_seen", "seconds", "bytes"),
    DATA_SKIPPED: ("batches", "seconds", "reason"),
    DATA_STATE_UNSAVED: ("step", "reason"),
    DATA_FIRST_STEP: ("files", "bytes", "files_total", "bytes_total", "seconds"),
    DATA_STAGED: ("files", "bytes", "downloaded", "records", "index", "seconds"),
    CHECKPOINT_FAILED: ("reason",),
    UPLOAD_RETRY: ("retry", "error", "op", "key"),
    MOVED: ("from", "to", "reason", "step"),
    CONTROLLER_WAITING: ("reason", "placement", "key"),
}

# The events that change what a run is doing (the others are informational).
LIFECYCLE = frozenset({STARTED, RESUMED, PREEMPTED, FINISHED, FAILED_EVENT, CANCELLED_EVENT})


def run_prefix(run_id: str) -> str:
    """`runs/<run_id>/`: the run's folder relative to the bucket root."""
    return f"{RUNS_PREFIX}{run_id}/"


def checkpoint_dir(step: int) -> str:
    """`checkpoints/ckpt-<step>`: one checkpoint's folder relative to the run."""
    return f"{CHECKPOINTS_PREFIX}{CHECKPOINT_DIR}-{int(step)}"


def is_checkpoint_key(key: str) -> bool:
    """Whether a key relative to the run (`checkpoints/ckpt-10/ckpt.index`) is part of a checkpoint."""
    return key.startswith(CHECKPOINTS_PREFIX)


def checkpoint_key_step(key: str) -> tuple[int, str] | None:
    """`checkpoints/ckpt-<step>/<rest>` (relative to the run) as `(step, rest)`; None for any other key."""
    head = f"{CHECKPOINTS_PREFIX}{CHECKPOINT_DIR}-"
    if not key.startswith(head):
        return None
    number, slash, rest = key[len(head):].partition("/")
    if not slash or not rest or not number.isascii() or not number.isdigit():
        return None
    return int(number), rest


def committed_key(step: int) -> str:
    """`checkpoints/ckpt-<step>/COMMITTED`: the marker that makes a checkpoint count."""
    return f"{checkpoint_dir(step)}/{COMMITTED}"


def code_key(name: str, digest: str) -> str:
    """`code/<name>-<digest>.tar.gz`: a content-addressed code archive in the bucket."""
    return f"{CODE_PREFIX}{name}-{digest}.tar.gz"


def pip_cache_prefix(key: str) -> str:
    """`cache/pip/<key>/`: the packages installed for one (requirements, image) key, relative to the bucket root."""
    return f"{CACHE_PREFIX}{PIP_CACHE_DIR}/{key}/"


def data_index_key(digest: str) -> str:
    """`cache/data/<digest>.json`: a data set's record counts, relative to the bucket root."""
    return f"{CACHE_PREFIX}{DATA_INDEX_DIR}/{digest}.json"


def decision_key(epoch: float) -> str:
    """`decisions/<YYYYmmddTHHMMSS.ffffffZ>.json`: the decision table made at `epoch` (UTC, sorts by time)."""
    stamp = datetime.datetime.fromtimestamp(float(epoch), datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{DECISIONS_PREFIX}{stamp}.json"


def decision_time(key: str) -> float | None:
    """The epoch a decision table was made at, from its key (`decision_key`'s inverse); None for any other key."""
    name = key.removeprefix(DECISIONS_PREFIX)
    if name == key or not name.endswith(".json"):
        return None
    try:
        when = datetime.datetime.strptime(name[:-len(".json")], "%Y%m%dT%H%M%S.%fZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.UTC).timestamp()


def machine_events_key(machine: str) -> str:
    """`machine-events/<machine>.jsonl`: one machine's own events (that machine is its only writer)."""
    return f"{MACHINE_EVENTS_PREFIX}{machine}.jsonl"


def worker_events_key(address: str) -> str:
    """`worker-events/<host>-<port>.jsonl`: a non-chief worker's own events (that worker is its only writer)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in address)
    return f"{WORKER_EVENTS_PREFIX}{safe}.jsonl"


def attempts(events: list[dict]) -> int:
    """How many attempts a run has had: its `started` events (at least 1 once anything ran)."""
    return sum(1 for e in events if e.get(EVENT) == STARTED)
