"""`ops stop`, `ops runs` and `ops pull`: end a run early, list a bucket's runs, fetch a run's model.

All three work on the run folders in the bucket only (names from ``runfolder/layout.py``),
so they need no machine and no SSH:

- ``stop`` writes the run's ``STOP`` request. The trainer polls for it, commits a
  checkpoint and ends the run as ``CANCELLED``; the machine's finish path then scales
  the group to zero and shuts the machine down, and a machine the group starts later
  finishes at once (``CANCELLED`` is an end marker). When no trainer holds a cloud run's lease
  (none trains: preempted, waiting for capacity, not started), ``stop`` writes ``CANCELLED``
  itself, as the placement controller does at its next tick (``controller.tick.stop_unheeded``):
  a stop asked is a stop, not a wait for the deadline.
- ``runs`` reads every ``runs/<id>/`` folder of the bucket with ``ops status``'s reader:
  state, step/total, age (since the folder last changed), attempts. The folders are named
  by one delimited listing, then each is listed and read on its own, 16 at once
  (``read_runs``, which ``ops dashboard``'s table uses too).
- ``pull`` downloads the model (``model/``: a SavedModel, or a script's ``.keras`` file) and names
  the call that loads it; with ``--outputs`` what a script kept in
  ``outputs/`` (``fit.output_dir()``), and with ``--checkpoint`` the newest committed checkpoint.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from ops import runstate
from ops.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK, OpsError, positive_float, run_uri
from runfolder import layout

DEFAULT_WAIT_S = 900.0


def bucket_uri_of(run_uri: str) -> str:
    """The bucket (or local root) a run URI lives in: ``s3://B/runs/ID`` -> ``s3://B``."""
    marker = "/" + layout.RUNS_PREFIX
    head, sep, _tail = run_uri.rstrip("/").rpartition(marker)
    if not sep:
        raise OpsError(f"run URI {run_uri!r} is not of the form <bucket>/{layout.RUNS_PREFIX}<id>; pass --bucket-uri")
    return head


def bucket_of(uri: str) -> str:
    """The bucket a ``--bucket-uri`` names: the bucket itself, or its ``runs/`` folder (``file://./runs``, where
    the README's demo writes ``runs/demo``), which is taken as its bucket."""
    uri = uri.rstrip("/")
    folder = "/" + layout.RUNS_PREFIX.rstrip("/")
    parent = uri[: -len(folder)] if uri.endswith(folder) else uri
    return uri if parent.endswith("/") else parent  # `s3://runs`: a bucket named runs


def open_bucket(bucket_uri: str | None, stack: str | None):
    """``(bucket, store)`` for ``--bucket-uri`` or ``--stack``: one rule for ``ops runs`` and ``ops dashboard``.

    ``--bucket-uri`` names the bucket or its ``runs/`` folder (:func:`bucket_of`); ``--stack``, the
    bucket of the stack's run. A local folder that is not there raises :class:`OpsError` (one
    line) rather than showing no runs: it is a mistyped path far more often than an empty bucket.
    """
    from ops import hosts
    from runfolder.storage import FileStore, open_store

    bucket = bucket_of(bucket_uri) if bucket_uri else bucket_uri_of(hosts.run_uri_for_stack(stack))
    store = open_store(bucket)
    if isinstance(store, FileStore) and not os.path.isdir(store.root):
        raise OpsError(f"no folder {store.root} ({bucket_uri or bucket}): give the bucket's folder or its "
                       f"{layout.RUNS_PREFIX} folder")
    return bucket, store


class _Under:
    """A read-only view of a store under one prefix: a run folder inside a bucket's store.

    ``ops runs`` opens one client for the whole bucket instead of one per run (an S3
    client costs most of a second to open).
    """

    def __init__(self, store, prefix: str) -> None:
        self.store, self.prefix = store, prefix
        self.uri = store.uri.rstrip("/") + "/" + prefix.rstrip("/")

    def get_bytes(self, key: str) -> bytes:
        return self.store.get_bytes(self.prefix + key)

    def get_range(self, key: str, start: int, end: int | None = None) -> bytes:
        return self.store.get_range(self.prefix + key, start, end)

    def stat(self, prefix: str = "") -> dict:
        n = len(self.prefix)
        return {k[n:]: v for k, v in self.store.stat(self.prefix + prefix).items()}

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self.stat(prefix))

    def exists(self, key: str) -> bool:
        return self.store.exists(self.prefix + key)


# -- stop ------------------------------------------------------------------------------


def request_stop(run_uri: str, *, reason: str = "", store=None, now: float | None = None) -> dict:
    """Write the run's ``STOP`` request; returns what was written (or the request already there).

    Raises :class:`OpsError` for a run that has already ended or does not exist.
    """
    from ops import status
    from runfolder.storage import NotFound, open_store

    store = open_store(run_uri) if store is None else store
    st = status.read_status(run_uri, store=store, events=0, must_exist=True)
    if st.final:
        raise OpsError(f"the run has already ended: {st.state}{'  ' + st.detail if st.detail else ''}")
    try:
        existing = json.loads(store.get_bytes(layout.STOP_KEY))
        return {"already": True, **(existing if isinstance(existing, dict) else {})}
    except NotFound:
        pass
    except ValueError:
        return {"already": True}
    stamp = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC).isoformat(timespec="milliseconds")
    doc = {"requested": stamp, "by": f"{getpass.getuser()}@{socket.gethostname()}",
           layout.MARKER_REASON: reason or "asked to stop with ops stop", "state": st.state}
    store.put_bytes(layout.STOP_KEY, json.dumps(doc).encode())
    return doc


def end_unheeded(run_uri: str, *, store=None, now: float | None = None) -> str | None:
    """After a stop was asked: when no trainer can heed it (none holds the lease), write ``CANCELLED``
    (create-if-absent, ``instance``: ops stop) and return why; None while a trainer may heed it."""
    from controller.tick import read_run, stop_unheeded, write_end
    from runfolder.storage import open_store

    store = open_store(run_uri) if store is None else store
    now = time.time() if now is None else now
    run = read_run(store)
    why = None if run.ended else stop_unheeded(store, run, now)
    if why is None or not write_end(store, layout.CANCELLED, why, run, now, instance="ops stop"):
        return None
    return why


def cmd_stop(args: argparse.Namespace) -> int:
    """``ops stop``: ask the run to end as CANCELLED (``--wait``: until it has); on a SageMaker stack, also stop
    its training job; on a Vertex AI stack, cancel its custom job."""
    from ops import hosts, jobs, status

    try:
        uri = run_uri(args)
        doc = request_stop(uri, reason=args.reason or "")
    except (hosts.HostsError, OpsError, status.NoRun, ValueError) as e:
        print(f"ops stop: {e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        from runfolder.storage import open_store

        store = open_store(uri)
        service = "Vertex AI" if (jobs.read_record(store) or {}).get("scheduler") == "vertex" else "SageMaker"
        stopped = jobs.stop_job(store)
    except jobs.service_errors() as e:
        print(f"ops stop: the STOP request is written, but the service did not stop the job: {' '.join(str(e).split())}; "
              "run ops stop again", file=sys.stderr)
        return EXIT_ERROR
    try:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException
        from urllib3.exceptions import HTTPError

        from components.settings import ConfigError
        from ops import kube

        done = kube.stop_for_stack(args.stack, open_store(uri))
    # The cluster refused or did not answer; its kubeconfig secret was not read (the pulumi CLI's error).
    except (ApiException, ConfigException, ConfigError, HTTPError, hosts.HostsError, OSError) as e:
        print(f"ops stop: the STOP request is written, but the Job was not suspended: {' '.join(str(e).split())}; "
              "run ops stop again", file=sys.stderr)
        return EXIT_ERROR
    if done == "suspended":
        print("suspended the Job: its pods get their grace period and the trainer commits a checkpoint; "
              "kubectl patch job train -p '{\"spec\":{\"suspend\":false}}' resumes it")
    elif done == "deleted":
        print("deleted the finished Job and its pods (the run folder keeps everything)")
    for name in stopped:
        what = "cancelled Vertex AI custom job" if service == "Vertex AI" else "stopped SageMaker training job"
        print(f"{what} {name}: SIGTERM to the trainer, which commits a checkpoint; the run "
              "ends CANCELLED (ops status records it once the job has stopped)")
    from ops.runstate import is_local

    try:  # a local run has no machine to wait for: starting its command once more ends it
        ended = None if is_local(uri) else end_unheeded(uri)
    except (OSError, ValueError) as e:  # the request stands: a trainer, or the controller, ends the run
        print(f"ops stop: could not end the run here ({e}); the next trainer or the controller ends it", file=sys.stderr)
        ended = None
    if ended:
        print(f"asked {uri} to stop: no machine is training, so it ends CANCELLED now ({ended});")
        print("  a machine the group starts later finishes at once and puts its group to zero")
    elif doc.get("already"):
        print(f"ops stop: {uri} was already asked to stop ({doc.get('requested', 'earlier')}); waiting for the trainer")
    else:
        print(f"asked {uri} to stop: the trainer commits a checkpoint and ends the run as CANCELLED;")
        if doc["state"] == status.STOPPED:
            print("  the run is not running here: start the same command once more and it ends at once")
        elif doc["state"] in (status.PREEMPTED, status.NOT_STARTED):
            print("  no trainer runs now: the next machine's trainer ends it; its group then goes to zero")
        else:
            print("  then the machine scales its group to zero and shuts down")
    if not args.wait:
        print(f"follow it: python -m ops status --run-uri {uri} --watch")
        return EXIT_OK
    deadline = time.monotonic() + args.timeout
    st = status.read_status(uri, events=0)
    while not st.final and time.monotonic() < deadline:
        time.sleep(args.interval)
        st = status.read_status(uri, events=0)
    if not st.final:
        print(f"ops stop: the run has not ended after {args.timeout:.0f}s (state {st.state}); "
              f"see python -m ops status --run-uri {uri}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{st.state}{'  ' + st.detail if st.detail else ''}")
    return EXIT_OK if st.state in (layout.CANCELLED, layout.COMPLETE) else EXIT_FAILED


# -- runs ------------------------------------------------------------------------------


# Runs read at once: an object store's latency, not its bandwidth, is the cost (a run is one listing
# and about ten small requests), so this many requests are in flight (the S3 client keeps 32 connections).
READERS = 16
# Objects up to this size are kept between a dashboard's refreshes (a long run's events.jsonl: ~2 MB).
CACHED_BYTES = 8 << 20


class Listed:
    """A run's folder read through its own listing: what the listing lacks is not asked for.

    Reading a run asks for a dozen objects, most of them absent (three of the four end markers, a
    worker's events): on an object store each is a request. With the listing in hand, only the
    objects that are there are fetched, and the folder's listings are answered from it. An object
    written after the listing is seen on the next read. ``objects`` (a dict kept by the caller):
    an object the listing shows unchanged since it was last fetched (same size and time) is
    not fetched again, so a dashboard's refresh asks only for what was written since.
    """

    def __init__(self, view, keys: dict, objects: dict | None = None) -> None:
        self.view, self.keys, self.uri = view, keys, view.uri
        self.objects = objects

    def get_bytes(self, key: str) -> bytes:
        from runfolder.storage import NotFound

        info = self.keys.get(key)
        if info is None:
            raise NotFound(key)
        if self.objects is None or info.size > CACHED_BYTES:
            return self.view.get_bytes(key)
        name, sig = self.uri + "/" + key, (info.size, info.modified)
        kept = self.objects.get(name)
        if kept is not None and kept[0] == sig:
            return kept[1]
        data = self.view.get_bytes(key)
        self.objects[name] = (sig, data)
        return data

    def get_range(self, key: str, start: int, end: int | None = None) -> bytes:
        """Part of an object the listing shows (see ``Store.get_range``); never kept."""
        from runfolder.storage import NotFound

        if key not in self.keys:
            raise NotFound(key)
        return self.view.get_range(key, start, end)

    def stat(self, prefix: str = "") -> dict:
        return {k: v for k, v in self.keys.items() if k.startswith(prefix)}

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self.stat(prefix))

    def exists(self, key: str) -> bool:
        return key in self.keys


def run_ids(store) -> list[str]:
    """The id of every run folder of a bucket's store (``runs/<id>/``): one delimited listing, which
    names the folders without listing what is inside them (a file beside them is no run)."""
    return [f[len(layout.RUNS_PREFIX):-1] for f in store.folders(layout.RUNS_PREFIX)]


def run_listings(store) -> dict[str, dict]:
    """Every ``runs/<id>/`` folder of a bucket's store: id -> {key in the run: ObjectInfo}.

    Each run's folder is listed on its own, side by side: a bucket of many runs with long
    histories is thousands of objects, which one listing of ``runs/`` would page through a
    thousand at a time, one page after another.
    """
    from concurrent.futures import ThreadPoolExecutor

    ids = run_ids(store)
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        listed = pool.map(lambda r: run_view(store, r).stat(""), ids)
        return {r: keys for r, keys in zip(ids, listed, strict=True) if keys}


def changed_at(keys: dict) -> float:
    """When anything in a run's listing last changed (epoch seconds)."""
    return max(i.modified.timestamp() for i in keys.values())


def run_view(store, run_id: str) -> _Under:
    """One run's folder as a read-only store inside the bucket's ``store`` (its ``uri`` is the run URI)."""
    return _Under(store, layout.run_prefix(run_id))


def read_runs(store, read, known=None) -> list:
    """``read(run_id, view, keys, changed)`` for every run of a bucket's ``store``, newest first.

    Each run's folder is listed and read by one of :data:`READERS` threads (its listing, then its
    objects, best through ``Listed(view, keys)``), so a run's requests follow one another while the
    others' are in flight. ``view``: the run's folder (:func:`run_view`); ``keys``: its listing;
    ``changed``: when anything in it last changed. A folder emptied since the bucket's listing is
    left out. ``known(run_id)``: ``(changed, result)`` for a run the caller need not list again
    (an ended run a dashboard read lately), else None.
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(run_id: str):
        if known is not None and (got := known(run_id)) is not None:
            return got
        view = run_view(store, run_id)
        keys = view.stat("")
        if not keys:
            return None
        changed = changed_at(keys)
        return changed, read(run_id, view, keys, changed)

    with ThreadPoolExecutor(max_workers=READERS) as pool:
        got = [g for g in pool.map(one, run_ids(store)) if g is not None]
    return [r for _changed, r in sorted(got, key=lambda g: -g[0])]


def list_runs(bucket_uri: str, *, now: float | None = None, store=None) -> list[dict]:
    """Every run under ``<bucket>/runs/``: id, uri, state, step, total, age_seconds, attempts, machine_hours,
    cost_usd, cost_note, goodput (kept / paid machine time, ``runfolder.goodput``), detail; newest first."""
    from ops import status
    from runfolder.storage import open_store

    now = time.time() if now is None else now
    store = open_store(bucket_uri) if store is None else store

    def read(run_id: str, view, keys: dict, changed: float) -> dict:
        st = status.read_status(view.uri, store=Listed(view, keys), events=0, now=now, checkpoint_marker=False)
        return {"id": run_id, "uri": view.uri, "state": st.state, "step": st.step, "total": st.total,
                "age_seconds": round(max(0.0, now - changed), 1), "attempts": st.attempts,
                "machine_hours": st.machine_hours, "cost_usd": st.cost_usd, "cost_note": st.cost_note,
                "goodput": (st.goodput or {}).get("goodput"), "detail": st.detail}

    return read_runs(store, read)


def cmd_runs(args: argparse.Namespace) -> int:
    """``ops runs``: a table (or JSON) of the bucket's runs."""
    from rich.console import Console
    from rich.table import Table

    from ops import hosts, status

    try:
        bucket, store = open_bucket(args.bucket_uri, args.stack)
        runs = list_runs(bucket, store=store)
    except (hosts.HostsError, OpsError, ValueError) as e:
        print(f"ops runs: {e}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - storage clients raise many types; each gets the same one line
        print(f"ops runs: cannot list the runs in {args.bucket_uri or args.stack}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(runs))
        return EXIT_OK
    if not runs:
        print(f"no runs in {bucket}/{layout.RUNS_PREFIX}")
        return EXIT_OK
    table = Table(title=f"runs in {bucket}", title_justify="left")
    for col in ("run", "state", "step", "age", "attempts", "cost", "goodput", "detail"):
        table.add_column(col, no_wrap=col != "detail",
                         justify="right" if col in ("step", "attempts", "cost", "goodput") else "left")
    notes = set()
    for r in runs:
        step = "-" if r["step"] is None else f"{r['step']}/{r['total']}" if r["total"] else str(r["step"])
        cost = "-" if r["cost_usd"] is None else f"${r['cost_usd']:,.2f}"
        if r["cost_note"]:
            notes.add(r["cost_note"])
        table.add_row(r["id"], f"[{status.STYLES.get(r['state'], '')}]{r['state']}", step,
                      runstate.duration(r["age_seconds"]), str(r["attempts"]), cost,
                      "-" if r["goodput"] is None else f"{r['goodput']:.0%}", r["detail"])
    console = Console()
    console.print(table)
    for note in sorted(notes):
        console.print(f"cost: machine time x nodes x {note}", style="dim")
    return EXIT_OK


# -- pull ------------------------------------------------------------------------------


def _download_prefix(store, prefix: str, dest: Path) -> int:
    """Every key under ``prefix`` to ``dest`` (folders made), all or nothing; returns the count."""
    from runfolder.storage import download_many

    keys = store.list(prefix)
    if keys:
        if dest.exists():
            raise OpsError(f"{dest} exists already; remove it or pull into another folder")
        tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            download_many(store, {k: str(tmp / k[len(prefix):]) for k in keys}, skip_existing=False)
            tmp.rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return len(keys)


# Files a Keras model is saved as; Keras loads each with `keras.models.load_model`.
KERAS_MODEL_SUFFIXES = (".keras", ".h5", ".hdf5")


def loader_of(model: Path) -> str | None:
    """The call that loads the model pulled to ``model``: a SavedModel (``saved_model.pb``) with
    ``tf.saved_model.load``, a lone Keras file (``model.save("x.keras")``) with
    ``keras.models.load_model``; None when the folder holds neither, or several Keras files."""
    if (model / "saved_model.pb").is_file():
        return f"tf.saved_model.load({str(model)!r})"
    files = sorted(p for p in model.rglob("*") if p.is_file() and p.name.endswith(KERAS_MODEL_SUFFIXES))
    if len(files) == 1:
        return f"keras.models.load_model({str(files[0])!r})"
    return None


def pull(run_uri: str, dest: Path, *, checkpoint: bool = False, outputs: bool = False, store=None) -> dict:
    """Download ``model/`` to ``dest/model`` (and the newest committed checkpoint to
    ``dest/checkpoints/ckpt-<step>`` with ``checkpoint``, a script's ``outputs/`` to
    ``dest/outputs`` with ``outputs``); returns what was fetched."""
    from ops import status
    from runfolder.checkpoints import committed_steps
    from runfolder.storage import open_store

    store = open_store(run_uri) if store is None else store
    st = status.read_status(run_uri, store=store, events=0, must_exist=True)
    dest.mkdir(parents=True, exist_ok=True)
    out: dict = {"state": st.state}
    files = _download_prefix(store, layout.MODEL_PREFIX, dest / layout.MODEL_PREFIX.rstrip("/"))
    if files:
        model = dest / layout.MODEL_PREFIX.rstrip("/")
        out["model"] = {"path": str(model), "files": files, "load": loader_of(model)}
    if checkpoint:
        steps = committed_steps(store)
        if steps:
            rel = layout.checkpoint_dir(steps[-1])
            n = _download_prefix(store, rel + "/", dest / rel)
            out["checkpoint"] = {"step": steps[-1], "path": str(dest / rel), "files": n}
    if outputs:
        n = _download_prefix(store, layout.OUTPUTS_PREFIX, dest / layout.OUTPUTS_PREFIX.rstrip("/"))
        if n:
            out["outputs"] = {"path": str(dest / layout.OUTPUTS_PREFIX.rstrip("/")), "files": n}
    if "model" not in out and st.state == layout.COMPLETE and (st.end or {}).get("model_files") == 0:
        note = str(st.end.get("model_note") or runstate.NO_SCRIPT_MODEL)
        if not {"checkpoint", "outputs"} & set(out):
            raise OpsError(f"no model in {run_uri}: {note}; --outputs fetches what it kept in outputs/")
        out["model_note"] = note
    if not {"model", "checkpoint", "outputs"} & set(out):
        what = "no model" + (" and no committed checkpoint" if checkpoint else "") + (
            " and no outputs" if outputs else "")
        hint = "" if checkpoint else "; --checkpoint fetches the newest committed checkpoint"
        raise OpsError(f"{what} in {run_uri} yet (the run is {st.state}: the trainer writes "
                       f"{layout.MODEL_PREFIX} when training ends){hint}")
    return out


def cmd_pull(args: argparse.Namespace) -> int:
    """``ops pull``: fetch the run's SavedModel (and its newest checkpoint)."""
    from ops import hosts, status

    try:
        uri = run_uri(args)
        got = pull(uri, Path(args.dest), checkpoint=args.checkpoint, outputs=args.outputs)
    except (hosts.HostsError, OpsError, status.NoRun, ValueError) as e:
        print(f"ops pull: {e}", file=sys.stderr)
        return EXIT_ERROR
    if "model" in got:
        load = got["model"]["load"]
        print(f"model ({got['model']['files']} files) -> {got['model']['path']}" + (f"  ({load})" if load else ""))
    elif "model_note" in got:
        print(f"ops pull: no model in {uri}: {got['model_note']}", file=sys.stderr)
    else:
        print(f"ops pull: no model in {uri} yet (the run is {got['state']})", file=sys.stderr)
    if "outputs" in got:
        print(f"outputs ({got['outputs']['files']} files) -> {got['outputs']['path']}")
    elif args.outputs:
        print(f"ops pull: no outputs in {uri} (the script wrote nothing to fit.output_dir())", file=sys.stderr)
    if "checkpoint" in got:
        c = got["checkpoint"]
        print(f"checkpoint step {c['step']} ({c['files']} files) -> {c['path']}")
    if got["state"] != layout.COMPLETE and "model" in got:
        print(f"note: the run is {got['state']}, not COMPLETE: the model may be from before its end", file=sys.stderr)
    return EXIT_OK


# -- the command line ------------------------------------------------------------------


def _where(p: argparse.ArgumentParser, *, bucket: bool = False) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="stack name: the run URI comes from its outputs (pulumi CLI)")
    if bucket:
        where.add_argument("--bucket-uri", help="the bucket: s3://BUCKET, gs://BUCKET or file:///...")
    else:
        where.add_argument("--run-uri", help="the run's URI: s3://B/runs/ID, gs://B/runs/ID or file:///...")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stop``, ``runs`` and ``pull`` to ``python -m ops``."""
    p = sub.add_parser("stop", help="end a run early: it checkpoints and ends as CANCELLED; the group goes to zero")
    _where(p)
    p.add_argument("--reason", help="recorded in the STOP request")
    p.add_argument("--wait", action="store_true", help="wait until the run has ended")
    p.add_argument("--timeout", type=positive_float, default=DEFAULT_WAIT_S,
                   help="seconds --wait waits (default: %(default)s)")
    p.add_argument("--interval", type=positive_float, default=5.0, help="seconds between checks with --wait")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("runs", help="every run in the stack's bucket: state, step/total, age, attempts")
    _where(p, bucket=True)
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("pull", help="download the run's SavedModel (model/) and, optionally, its newest checkpoint")
    _where(p)
    p.add_argument("dest", metavar="DEST", help="local folder: DEST/model/ (and DEST/checkpoints/ckpt-N/)")
    p.add_argument("--checkpoint", action="store_true", help="also the newest committed checkpoint")
    p.add_argument("--outputs", action="store_true",
                   help="also what a script wrote to fit.output_dir() (outputs/), to DEST/outputs/")
    p.set_defaults(func=cmd_pull)
