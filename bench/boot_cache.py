"""Benchmark: power-on → first training step, for a stack's first machine and for a later one.

Both machines boot the rendered user data in the boot sandbox (`devtools/sandbox.py`: the
real `userdata/` scripts, fake machine commands, moto_server as S3, the fake metadata service),
with the store behind a link throttled to `--store-mib-s` both ways (`devtools/fault_proxy.py`)
and the package index (what the fake `pip` downloads: `--wheels-mib` of incompressible bytes
standing in for the NVIDIA wheels) behind a link throttled to `--index-mib-s`. The trainer in the
container is `bench.probe`, which marks its first step.

- **first**: an empty cache: pip downloads the wheels from the index; the machine archives them
  to `cache/pip/<key>/` in the background once its trainer starts (the upload's own time is
  reported apart).
- **later**: a fresh disk (a spot replacement, or a machine of the stack's next run) in the
  same bucket: the packages come from the bucket's cache, unpacked as they download.

Each machine trains a run of its own (a replacement of the same run would first wait out the
lease of the machine it replaces, which this does not measure). `--data-mib` adds a TFRecord
data set in the bucket that both machines stage before their first step (`trainer/data.py`:
the data is read from where `run.dataUri` points, the stack's bucket here; no second copy).
The docker image pull is not modelled (the fake `docker pull` returns at once): on a real
machine it costs both machines the same, or the later one nothing when the image is baked in.
See docs/boot.md for the paper budget at real sizes.

`--data-files` splits the data set into that many files: the trainer streams them (the first
step waits for the files its first batches read, `trainer/staging.py`). `--trees before=PATH,after=.`
boots both machines once per code tree (the trainer code archive packed from each tree's
`trainer/`), each tree in a bucket of its own, so one run measures before and after a change.

Usage: python -m bench.boot_cache [--store-mib-s 16] [--index-mib-s 2] [--wheels-mib 48]
       [--data-mib 0] [--data-files 16] [--trees name=path,...] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MIB = 1024 * 1024


class _Index:
    """A one-file package index on 127.0.0.1: GET / answers `size` random bytes."""

    def __init__(self, size: int) -> None:
        blob = os.urandom(size)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                self.wfile.write(blob)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _mlp_records(folder: Path, size: int, files: int) -> int:
    """TFRecords the `mlp` model reads (784 floats and a label each), about `size` bytes in `files` files; how many."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    per_file = max(1, size // 3200 // files)  # ~3.2 KB a record
    for f in range(files):
        with tf.io.TFRecordWriter(str(folder / f"train-{f:05d}.tfrecord")) as w:
            for _ in range(per_file):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(784, dtype=np.float32))),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(rng.integers(10))]))}))
                w.write(ex.SerializeToString())
    return per_file * files


def _wait(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def _data_at_first_step(entry: dict, admin, bucket: str, name: str) -> None:
    """What was on disk at the first step (a tree that streams its data says so in an event)."""
    from runfolder import layout

    def first_step_event(key=f"runs/{name}/{layout.EVENTS_KEY}"):
        with contextlib.suppress(admin.exceptions.NoSuchKey):
            lines = admin.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines()
            found = [json.loads(x) for x in lines if '"data_first_step"' in x]
            return found[0] if found else None
        return None

    with contextlib.suppress(TimeoutError):
        ev = _wait(first_step_event, 30, "the data_first_step event")
        entry["data_at_first_step"] = {k: ev[k] for k in ("files", "files_total", "bytes",
                                                          "bytes_total")}


def _cache_committed(entry: dict, admin, bucket: str, t0: float) -> None:
    """The archive's upload, in the background while the trainer starts: when it committed, and its size."""
    from runfolder import layout

    def committed():
        keys = [o["Key"] for o in admin.list_objects_v2(Bucket=bucket, Prefix=layout.CACHE_PREFIX)
                .get("Contents", [])]
        return [k for k in keys if k.endswith("/" + layout.COMMITTED)]
    _wait(committed, 600, "the package cache's commit")
    entry["boot_to_cache_committed_s"] = round(time.time() - t0, 2)
    sizes = [o["Size"] for o in admin.list_objects_v2(Bucket=bucket, Prefix=layout.CACHE_PREFIX)
             ["Contents"] if o["Key"].endswith(".tar.gz")]
    entry["cache_archive_mib"] = round(sizes[0] / MIB, 2)


def run(*, store_mib_s: float, index_mib_s: float, wheels_mib: float, data_mib: float = 0.0, data_files: int = 16,
        tree: Path | None = None) -> dict:
    import boto3

    from components.aws.code import archive_key, pack
    from devtools.fault_proxy import FaultProxy
    from devtools.metadata import MetadataServer
    from devtools.sandbox import Sandbox, make_group, settings_for
    from devtools.servers import AWS_VARS, Run, start_moto_server

    os.environ.update(AWS_VARS)  # the sandbox's clients (make_group, the fake CLIs) take their keys from the environment
    out: dict = {"store_mib_s": store_mib_s, "index_mib_s": index_mib_s, "wheels_mib": wheels_mib,
                 "data_mib": data_mib, "data_files": data_files if data_mib else 0}
    with contextlib.ExitStack() as stack:
        moto = start_moto_server()
        stack.callback(moto.close)
        store = stack.enter_context(FaultProxy(moto.url))
        index = _Index(int(wheels_mib * MIB))
        stack.callback(index.close)
        index_link = stack.enter_context(FaultProxy(index.url))
        metadata = MetadataServer()
        stack.callback(metadata.close)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-boot-")))

        admin = boto3.session.Session().client("s3", endpoint_url=moto.url, region_name="us-east-1",
                                               aws_access_key_id="testing", aws_secret_access_key="testing")
        bucket = "trainstack-bench-boot"
        admin.create_bucket(Bucket=bucket)
        code = pack(tree / "trainer") if tree is not None else pack()
        code_key = archive_key(code)
        admin.put_object(Bucket=bucket, Key=code_key, Body=code)
        run_extra: dict = {"steps": 1_000_000, "checkpointEverySteps": 1_000_000, "checkpointEverySeconds": 3600}
        if data_mib:
            folder = tmp / "corpus"
            out["data_records"] = _mlp_records(folder, int(data_mib * MIB), data_files)
            for f in sorted(folder.iterdir()):
                admin.upload_file(str(f), bucket, f"corpus/mnist/{f.name}")
            run_extra.update(synthetic=False, dataUri=f"s3://{bucket}/corpus/mnist/")
        vars_ = {"AWS_ENDPOINT_URL": store.url, **AWS_VARS}
        group = make_group(Run(uri="", bucket=bucket, vars={"AWS_ENDPOINT_URL": moto.url, **AWS_VARS}), 1)
        # The links, from here on.
        store.throttle(store_mib_s * MIB)
        store.throttle_answers(store_mib_s * MIB)
        index_link.throttle_answers(index_mib_s * MIB)

        for name in ("first", "later"):
            run = Run(uri=f"s3://{bucket}/runs/{name}", bucket=bucket, vars=vars_)
            box = Sandbox(tmp / name, run, metadata, group, f"s3://{bucket}/{code_key}",
                          settings=settings_for("aws", **run_extra))
            marks = tmp / f"{name}-marks.json"
            t0 = time.time()
            box.env.update({"FAKE_TRAINER_MODULE": "bench.probe", "FAKE_TRAINER_PATH": str(REPO),
                            "FAKE_PIP_INDEX_URL": index_link.url, "BENCH_T0": str(t0), "BENCH_MARKS": str(marks)})
            try:
                box.boot()
                first = _wait(lambda m=marks: m.exists() and json.loads(m.read_text()).get("first_step"), 600,
                              f"the {name} machine's first step")
                log = (tmp / name / "journal-trainer.log").read_text(errors="replace")
                if os.environ.get("BENCH_BOOT_JOURNALS"):  # where to keep each machine's journal
                    Path(os.environ["BENCH_BOOT_JOURNALS"], f"{name}.log").write_text(log)
                steps = {m[1]: int(m[2]) for m in re.finditer(r"bootstrap\.sh\[\d+\]: step (\w+) done in (\d+)s", log)}
                # The trainer container's `docker run` (the fake records each call's time).
                started = next(c["t"] for c in box.calls("docker") if c["argv"][0] == "run" and c["argv"][-1] == "trainer")
                entry = {"boot_to_first_step_s": round(first, 2), "boot_to_trainer_start_s": round(started - t0, 2),
                         "trainer_start_to_first_step_s": round(first - (started - t0), 2), "bootstrap_steps_s": steps,
                         "from_cache": "from the bucket's cache" in log,
                         "pip_from_index": "installing the trainer's requirements" in log}
                if data_mib:
                    _data_at_first_step(entry, admin, bucket, name)
                if name == "first":
                    _cache_committed(entry, admin, bucket, t0)
                out[name] = entry
            finally:
                box.power_off()
    for what in ("boot_to_first_step_s", "boot_to_trainer_start_s"):
        out[f"later_over_first_{what.removesuffix('_s')}"] = round(out["later"][what] / out["first"][what], 3)
    return out


def run_trees(trees: list[tuple[str, Path]], **kw) -> dict:
    """`run` once per code tree, in order; the later ÷ first ratios side by side."""
    out: dict = {"trees": {}}
    for name, path in trees:
        out["trees"][name] = run(tree=path, **kw)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store-mib-s", type=float, default=16.0, help="the store's link, MiB/s each way")
    p.add_argument("--index-mib-s", type=float, default=2.0, help="the package index's link, MiB/s")
    p.add_argument("--wheels-mib", type=float, default=48.0, help="bytes the index serves (the wheels), MiB")
    p.add_argument("--data-mib", type=float, default=0.0, help="a TFRecord data set in the bucket, MiB (0: synthetic)")
    p.add_argument("--data-files", type=int, default=16, help="the data set's number of files")
    p.add_argument("--trees", default=None, help="name=path,...: code trees to measure one after the other")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args(argv)
    # A SIGTERM (a timeout) unwinds like Ctrl-C: the sandboxes are powered off, the servers stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kw = {"store_mib_s": a.store_mib_s, "index_mib_s": a.index_mib_s, "wheels_mib": a.wheels_mib,
          "data_mib": a.data_mib, "data_files": a.data_files}
    if a.trees:
        trees = [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in a.trees.split(","))]
        res = run_trees(trees, **kw)
        print(json.dumps(res, indent=2))
        return 0
    res = run(**kw)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"store {a.store_mib_s} MiB/s, index {a.index_mib_s} MiB/s, wheels {a.wheels_mib} MiB, data {a.data_mib} MiB")
    for name in ("first", "later"):
        e = res[name]
        print(f"{name:6s} boot → trainer start {e['boot_to_trainer_start_s']:7.2f} s, → first step "
              f"{e['boot_to_first_step_s']:7.2f} s; bootstrap steps {e['bootstrap_steps_s']}")
    print(f"later ÷ first: trainer start {res['later_over_first_boot_to_trainer_start']}, first step "
          f"{res['later_over_first_boot_to_first_step']} (cache committed {res['first']['boot_to_cache_committed_s']} s "
          f"after the first machine's boot; archive {res['first']['cache_archive_mib']} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
