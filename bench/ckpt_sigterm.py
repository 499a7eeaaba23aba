"""SIGTERM → committed during a background checkpoint save, for several code trees back to back.

The case of `bench.ckpt_stall`'s SIGTERM figure, alone: a background save of one step
(`Checkpointer.save(sync=False)`), one update of every variable (the loop trains on until the
stop comes), then the stop's synchronous save of the next step: seconds until it is
committed (`sigterm_s`), then the wait for what was left running beside it (`wait_s`:
`Checkpointer.wait_uploads`, as the loop does before it exits), and the peak resident memory
above the process's before the background save (`VmHWM`, reset). Checks that the stop's step
is the one committed last and the older one never after it.

Each tree (a checkout of this repository: ``name=path``) is measured in a process of its own
with its ``trainer`` first on the path, against one moto_server this command starts (as
``python -m bench`` does), in the order given and then in reverse, ``--rounds`` times, so
that a drift of the shared machine's load falls on every tree alike.

Usage: python -m bench.ckpt_sigterm --size-mb 1000 --trees before=/tmp/main,after=.
Prints one JSON line per measurement, then a summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_CHUNK_FLOATS = 16 * 1024 * 1024  # 64 MiB per variable, as bench.ckpt_stall makes them


# Defined here, not imported: this file runs with another code tree first on the path (--trees),
# whose bench/ may not have a shared module. bench.ckpt_stall imports it from here.
def status_mib(field: str) -> float:
    """A memory figure of this process in MiB (`VmRSS`, `VmHWM`: /proc/self/status), NaN where absent."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(size_mb: float, bucket: str, prefix: str) -> dict:
    """One measurement with the `trainer` found first on the path."""
    import shutil

    import tensorflow as tf

    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore
    from trainer.tf_checkpoint import Checkpointer

    floats, variables = max(1, int(size_mb * 1e6) // 4), []
    while floats > 0:
        n = min(floats, _CHUNK_FLOATS)
        variables.append(tf.Variable(tf.random.uniform([n], seed=len(variables)), name=f"w{len(variables)}"))
        floats -= n

    @tf.function
    def update():
        for v in variables:
            v.assign_add(tf.fill(tf.shape(v), 1e-7))

    store = open_store(f"s3://{bucket}/{prefix}")
    committed: list[dict] = []
    ckstore = CheckpointStore(store, keep=1, on_commit=committed.append)
    work = tempfile.mkdtemp(prefix="bench-sigterm-")
    try:
        cp = Checkpointer(ckstore, work=work, chief=True, variables=variables, model="bench",
                          checkpoint_of=lambda values: tf.train.Checkpoint(v=list(values)), background=True)
        update()  # traced before the measurement
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # the peak from here
        rss_before = status_mib("VmRSS")
        cp.save(1, {"step": 1, "batches_seen": 1, "examples_seen": 1}, sync=False)
        update()
        s0 = time.perf_counter()
        cp.save(2, {"step": 2, "batches_seen": 2, "examples_seen": 2}, sync=True)
        sigterm_s = time.perf_counter() - s0
        steps_at_stop = [c["step"] for c in committed]
        w0 = time.perf_counter()
        error = cp.wait_uploads()
        wait_s = time.perf_counter() - w0
        peak = status_mib("VmHWM") - rss_before
        steps = [c["step"] for c in committed]
        if error is not None or not steps_at_stop or steps_at_stop[-1] != 2 or steps[-1] != 2:
            raise RuntimeError(f"the stop's checkpoint 2 was not the one committed last: {steps} ({error!r})")
        store.delete_prefix("checkpoints/")  # moto keeps objects in memory
        return {"size_mb": size_mb, "sigterm_s": round(sigterm_s, 2), "wait_s": round(wait_s, 2),
                "upload_s": committed[-1]["seconds"], "peak_mib": round(peak), "committed": steps}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    """CLI: see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=1000.0)
    p.add_argument("--trees", required=True, help="name=path,name=path: checkouts to compare")
    p.add_argument("--rounds", type=int, default=1, help="each round measures every tree twice (order, then reverse)")
    p.add_argument("--measure", nargs=2, metavar=("BUCKET", "PREFIX"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.measure:
        print(json.dumps(measure(a.size_mb, *a.measure)), flush=True)
        return
    trees = [tuple(t.split("=", 1)) for t in a.trees.split(",")]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, repo)
    import boto3

    from devtools.servers import start_moto_server

    server = start_moto_server()
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    try:
        env = {**os.environ, "AWS_ENDPOINT_URL": server.url, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        boto3.session.Session().client("s3", endpoint_url=server.url, region_name="us-east-1",
                                       aws_access_key_id="testing", aws_secret_access_key="testing"
                                       ).create_bucket(Bucket=bucket)
        order = [t for _ in range(a.rounds) for t in (*trees, *reversed(trees))]
        for i, (name, path) in enumerate(order):
            path = os.path.abspath(path)
            load = os.getloadavg()[0]
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--size-mb", str(a.size_mb), "--trees", a.trees,
                 "--measure", bucket, f"runs/sigterm-{name}-{i}"],
                cwd=path, env={**env, "PYTHONPATH": path}, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"{name}: {out.stderr[-3000:]}")
            row = {"tree": name, "load_before": round(load, 1), **json.loads(out.stdout.strip().splitlines()[-1])}
            results[name].append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.close()
    print(json.dumps({"summary": {name: {"sigterm_s": [r["sigterm_s"] for r in rows],
                                         "peak_mib": [r["peak_mib"] for r in rows]}
                                  for name, rows in results.items()}}), flush=True)


if __name__ == "__main__":
    main()
