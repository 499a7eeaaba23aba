"""`ops tensorboard`: a run's TensorBoard on this computer, read from the bucket, with no SSH.

The trainer writes its event files on the machine and uploads them to the run's
``tensorboard/`` folder (``runfolder/layout.py``: ``TENSORBOARD_PREFIX``). TensorFlow 2.21 has no
``s3://`` filesystem, so TensorBoard cannot read the bucket itself: this command keeps a
local mirror of that folder fresh (a background thread, through the trainer's own store,
so S3, GCS and ``file://`` runs behave the same) and serves TensorBoard on the mirror. The
bucket is the only thing read, so it works while the machine is preempted and after the
run has ended.

TensorBoard keeps event files open and reads what is appended to them; a file replaced
under it (a new inode) is not read again. Event files only grow, so the mirror appends
what a newer upload added to the file TensorBoard has open, and replaces a file only when
the upload is not an extension of it.

TensorBoard listens on 127.0.0.1 only: flags after ``--`` that would make it listen
elsewhere (``--host``, ``--bind_all``) or read something else (``--logdir``) are refused.
TensorBoard itself is imported only when this command runs, so other commands do not pay for it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
from datetime import datetime
from pathlib import Path

from ops.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, OpsError, port_type, positive_float, run_uri
from runfolder import layout

HOST = "127.0.0.1"
DEFAULT_PORT = 6006
DEFAULT_INTERVAL_S = 30.0
# Flags this command sets itself; passing them after `--` would serve something else or elsewhere.
STAGING = ".ops-staging"
OWN_FLAGS = ("--logdir", "--logdir_spec", "--host", "--bind_all", "--port", "--db", "--db_import")


class Mirror:
    """A local copy of a run's ``tensorboard/`` folder that :meth:`sync` brings up to date.

    ``store`` is the run's store (``runfolder.storage.open_store(run_uri)``); ``dest`` the
    local folder TensorBoard reads. Objects are compared by size and modification time
    (what the stores report); only new or changed ones are downloaded.
    """

    def __init__(self, store, dest: str | os.PathLike, prefix: str = layout.TENSORBOARD_PREFIX) -> None:
        self.store = store
        self.dest = Path(dest).resolve()
        self.prefix = prefix
        self._seen: dict[str, tuple[int, datetime]] = {}
        self._lock = threading.Lock()
        self.dest.mkdir(parents=True, exist_ok=True)

    def _target(self, rel: str) -> Path | None:
        """The local path of a key relative to the prefix; None for one that would leave the mirror."""
        target = (self.dest / rel).resolve()
        return target if self.dest in target.parents else None

    def sync(self) -> int:
        """Download what is new or changed under the prefix; return how many files changed locally."""
        with self._lock:  # the thread and a caller never sync the same files at once
            changed = 0
            for key, info in sorted(self.store.stat(self.prefix).items()):
                rel = key[len(self.prefix):]
                target = self._target(rel)
                if not rel or target is None or rel.startswith(STAGING + "/"):
                    continue
                sig = (info.size, info.modified)
                seen = self._seen.get(key)
                local_size = target.stat().st_size if target.is_file() else None
                if seen == sig and local_size == info.size:
                    continue
                if seen is None and local_size == info.size:
                    # A mirror kept from an earlier session (--mirror): event files only
                    # grow, so an equal size is the same file.
                    self._seen[key] = sig
                    continue
                self._fetch(key, target)
                self._seen[key] = sig
                changed += 1
            return changed

    def _fetch(self, key: str, target: Path) -> None:
        # Inside the mirror (same filesystem, so the rename is atomic); TensorBoard reads only
        # files named like event files, so it never sees a half-downloaded one.
        staging = self.dest / STAGING
        staging.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging)
        os.close(fd)
        try:
            self.store.get_file(key, tmp)
            new = Path(tmp)
            if target.is_file():
                old = target.read_bytes()
                if new.stat().st_size >= len(old):
                    with new.open("rb") as f:
                        head = f.read(len(old))
                        if head == old:
                            # Append in place: TensorBoard keeps the file open and reads on from where it was.
                            with target.open("ab") as out:
                                shutil.copyfileobj(f, out)
                            return
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


class Syncer:
    """Runs :meth:`Mirror.sync` every ``interval`` seconds on a daemon thread until :meth:`stop`."""

    def __init__(self, mirror: Mirror, interval: float, *, err=None) -> None:
        self.mirror = mirror
        self.interval = interval
        self.err = err if err is not None else sys.stderr
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tensorboard-mirror", daemon=True)

    def start(self) -> Syncer:
        """Start the thread; returns self."""
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to end and wait for it (a sync under way finishes first)."""
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.mirror.sync()
            except Exception as e:  # noqa: BLE001 - a network hiccup must not end the mirror; the next round retries
                print(f"ops tensorboard: could not refresh the mirror ({type(e).__name__}: {e}); "
                      f"trying again in {self.interval:g}s", file=self.err)
            self.rounds += 1


def configure(mirror_dir: str | os.PathLike, port: int, extra: list[str]):
    """A configured ``tensorboard.program.TensorBoard`` on ``mirror_dir``, served on 127.0.0.1:``port``.

    ``extra`` are TensorBoard flags passed through; those this command sets itself are refused.
    """
    for arg in extra:
        name = arg.split("=", 1)[0]
        if name in OWN_FLAGS:
            raise OpsError(f"{name} cannot be passed to TensorBoard here: ops tensorboard serves the run's mirror "
                           f"on {HOST} only (use --port before `--` to choose the port; to reach it from "
                           "another computer, forward the port over SSH)")
    from tensorboard import program

    tb = program.TensorBoard()
    try:
        tb.configure(argv=["", "--logdir", str(mirror_dir), "--host", HOST, "--port", str(port), *extra])
    except SystemExit as e:  # argparse's own message is already printed
        raise OpsError(f"TensorBoard did not accept the flags after `--`: {' '.join(extra)}") from e
    flags = tb.flags
    # Belt and braces: whatever the passed-through flags did, it must still be the mirror on 127.0.0.1.
    if flags.host != HOST or flags.bind_all or flags.logdir != str(mirror_dir) or flags.logdir_spec:
        raise OpsError(f"TensorBoard would not serve the mirror on {HOST} only with {' '.join(extra)}")
    return tb


def cmd_tensorboard(args: argparse.Namespace) -> int:
    """``ops tensorboard``: mirror the run's event files and serve TensorBoard on them until Ctrl-C."""
    from ops import hosts
    from runfolder.storage import open_store

    try:
        uri = run_uri(args)
        store = open_store(uri)
    except (hosts.HostsError, ValueError) as e:
        print(f"ops tensorboard: {e}", file=sys.stderr)
        return EXIT_ERROR
    keep = args.mirror is not None
    mirror_dir = Path(args.mirror).expanduser() if keep else Path(tempfile.mkdtemp(prefix="trainstack-tensorboard-"))
    try:
        try:
            mirror = Mirror(store, mirror_dir)
        except OSError as e:
            print(f"ops tensorboard: cannot use {mirror_dir} as the mirror ({e}); give another --mirror DIR",
                  file=sys.stderr)
            return EXIT_ERROR
        try:
            tb = configure(mirror.dest, args.port, args.tb_args)
            got = mirror.sync()
            if not got and not any(mirror.dest.iterdir()):
                if args.run_uri and not store.list(""):
                    raise OpsError(f"no run at {uri}: nothing is stored there (check the URI)")
                print(f"ops tensorboard: no event files under {uri.rstrip('/')}/{layout.TENSORBOARD_PREFIX} yet; "
                      "they appear here once the run writes them", file=sys.stderr)
        except OpsError as e:
            print(f"ops tensorboard: {e}", file=sys.stderr)
            return EXIT_ERROR
        except Exception as e:  # noqa: BLE001 - storage clients raise many types; each gets the same one line
            print(f"ops tensorboard: cannot read {uri}: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_ERROR
        syncer = Syncer(mirror, args.interval).start()
        print(f"ops tensorboard: {uri} at http://{HOST}:{args.port}/ (mirror {mirror.dest}, "
              f"refreshed every {args.interval:g}s); Ctrl-C to stop", file=sys.stderr, flush=True)
        try:
            rc = tb.main()
        except KeyboardInterrupt:
            rc = 0
        finally:
            syncer.stop(timeout=5)
        if rc != 0:
            print(f"ops tensorboard: TensorBoard could not listen on {HOST}:{args.port} (its error is above); "
                  "choose another port with --port", file=sys.stderr)
            return EXIT_ERROR
        return EXIT_OK
    except KeyboardInterrupt:  # Ctrl-C before TensorBoard started (while the first sync ran)
        return EXIT_INTERRUPTED
    finally:
        if not keep:
            shutil.rmtree(mirror_dir, ignore_errors=True)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``tensorboard`` command to ``python -m ops``."""
    p = sub.add_parser(
        "tensorboard",
        help="the run's TensorBoard on 127.0.0.1, read from the bucket (no SSH)",
        description="Mirror the run's tensorboard/ folder from the bucket and serve TensorBoard on it, "
                    f"on {HOST} only. TensorBoard flags go after `--`, e.g. `-- --reload_interval 10`.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="stack name: the run URI comes from its outputs (pulumi CLI)")
    where.add_argument("--run-uri", help="the run's URI: s3://B/runs/ID, gs://B/runs/ID or file:///...")
    p.add_argument("--port", type=port_type(), default=DEFAULT_PORT, help="local port (default: %(default)s)")
    p.add_argument("--mirror", metavar="DIR",
                   help="keep the mirror in DIR (reused next time); default: a temporary folder removed at the end")
    p.add_argument("--interval", type=positive_float, default=DEFAULT_INTERVAL_S,
                   help="seconds between refreshes of the mirror (default: %(default)s)")
    p.add_argument("tb_args", nargs="*", metavar="-- TENSORBOARD_FLAGS", help="passed to TensorBoard")
    p.set_defaults(func=cmd_tensorboard)
