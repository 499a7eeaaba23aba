"""Benchmark: the largest checkpoint a preempted machine can still commit within the cloud's notice.

On a notice the trainer finishes its step, saves the checkpoint to local disk, hashes it,
uploads it and writes the COMMITTED marker (renewing the run's lease first), all inside the
grace the machine gives it: 100 s on AWS (a two-minute notice; the container's stop timeout),
25 s on GCE (30 s until power is cut). What fits depends on the machine's bandwidth to the
bucket, which no test here can see, so this script reports two kinds of figure and keeps
them apart:

- **measured here**: a real synchronous commit (`CheckpointStore.commit`, lease fence included)
  of checkpoints of several sizes to moto_server (S3) and gcp-storage-emulator (GCS) on this
  machine, giving a fixed cost per commit and a throughput; and the save (write + fsync) and
  SHA-256 rates of this machine's disk and CPU. The emulators run on the same few CPU cores
  as the client: their throughput is a floor set by this machine, not a cloud figure.
- **stated by the provider**: each instance type's network bandwidth as its cloud documents it
  (a peak; AWS's "up to" figures are burst rates above a lower baseline, and one TCP flow
  to S3 or GCS carries less than the instance's total: the uploads use 8 connections).

The largest checkpoint within a grace G is (G - step - fixed) / (sum of 1/rate over the stages
each byte passes: save, hash, upload), with `step` the last step's time (an argument) and
`fixed` the measured per-commit cost (a least-squares line through the commits). For the
emulators the commit's own rate covers hashing and upload; for the stated bandwidths two
bounds are given: the link alone, and the link after this machine's save and SHA-256 rates
(a cloud machine's disk and CPU are usually faster; so the truth lies between the two).

Usage:  python bench/notice_budget.py [--sizes-mib 8,64,256] [--step-seconds 1] [--json]
`run(...) -> dict` is the same measurement for a calling program (bench runner).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from devtools.servers import Server, start_gcs_emulator, start_moto_server  # noqa: E402 (run as a script: the path first)

MIB = 1024 * 1024
GBPS = 1e9 / 8  # bytes per second in one Gbit/s

# The trainer's grace after a notice (userdata/lib.sh GRACE_S per cloud, and the
# notice each cloud gives).
GRACE_S = {"aws": 100.0, "gcp": 25.0}
NOTICE = {"aws": "EC2 Spot interruption notice: 2 minutes; container stop timeout 100 s",
          "gcp": "GCE preemption: 30 s from `preempted` to power off; the trainer gets 25 s"}

# Network bandwidth as each provider documents it for the instance type (EC2 instance type
# pages "Network bandwidth (Gbps)"; GCE "Network bandwidth" per machine type). Stated, not measured.
STATED_GBPS = {
    "aws": [("g4dn.xlarge", 25.0, "up to 25"), ("g5.xlarge", 10.0, "up to 10"), ("g6.xlarge", 10.0, "up to 10"),
            ("g5.12xlarge", 40.0, "40"), ("p4d.24xlarge", 400.0, "400 (4 x 100)")],
    "gcp": [("n1-standard-8 + T4", 16.0, "2 per vCPU = 16"), ("g2-standard-8", 16.0, "16"),
            ("a2-highgpu-1g", 24.0, "24"), ("a2-highgpu-8g", 100.0, "100")],
}


@contextlib.contextmanager
def _serving(server: Server) -> Iterator[str]:
    """A started emulator's URL, for the `with` block; stopped after it."""
    try:
        yield server.url
    finally:
        server.close()


@contextlib.contextmanager
def _run_uri(cloud: str) -> Iterator[str]:
    """A fresh run folder on the cloud's emulator, its variables set for this process."""
    bucket = f"trainstack-bench-{os.getpid()}"
    if cloud == "aws":
        with _serving(start_moto_server()) as url:
            os.environ.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                              AWS_DEFAULT_REGION="us-east-1")
            import boto3

            boto3.client("s3").create_bucket(Bucket=bucket)
            yield f"s3://{bucket}/runs/bench"
    else:
        with _serving(start_gcs_emulator()) as url:
            os.environ.update(STORAGE_EMULATOR_HOST=url, GOOGLE_CLOUD_PROJECT="bench")
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            storage.Client(project="bench", credentials=AnonymousCredentials()).create_bucket(bucket)
            yield f"gs://{bucket}/runs/bench"


def _local_rates(size: int, work: Path) -> dict:
    """This machine's save (write + fsync) and SHA-256 rates, bytes/s, on `size` bytes."""
    data = os.urandom(size)
    path = work / "rate.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    save = size / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    sha = size / (time.perf_counter() - t0)
    path.unlink()
    return {"save_bytes_per_s": save, "sha256_bytes_per_s": sha}


def _measure_commits(uri: str, sizes_mib: list[int], work: Path) -> list[dict]:
    """One synchronous commit per size (one file of that size, as a large variable file is), lease held."""
    from runfolder.lease import RunLease
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    store = open_store(uri)
    lease = RunLease(store, holder="bench/1", ttl_s=60)
    lease.acquire()
    ckpts = CheckpointStore(store, keep=1, lease=lease)
    rows = []
    # The first commit pays for connections and the lease's first renewal: a warm-up, not counted.
    for step, mib in enumerate([0, 0, *sizes_mib], start=1):
        folder = work / f"ckpt-{step}"
        folder.mkdir()
        (folder / "state.json").write_text("{}")
        if mib:
            with open(folder / "ckpt.data-00000-of-00001", "wb") as f:
                for _ in range(mib):
                    f.write(os.urandom(MIB))
        t0 = time.perf_counter()
        ckpts.commit(step, str(folder))
        if step > 1:
            rows.append({"mib": mib, "seconds": round(time.perf_counter() - t0, 3)})
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
    lease.release()
    return rows


def _fit(rows: list[dict]) -> tuple[float, float]:
    """(fixed seconds, bytes/s) of a commit: a least-squares line through (size, seconds)."""
    xs = [r["mib"] * MIB for r in rows]
    ys = [r["seconds"] for r in rows]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / max(sum((x - mx) ** 2 for x in xs), 1e-9)
    slope = max(slope, 1e-12)
    return max(0.0, my - slope * mx), 1 / slope


def largest_bytes(grace_s: float, step_s: float, fixed_s: float, *rates: float) -> float:
    """The largest checkpoint (bytes) whose commit fits in `grace_s` after the step and the fixed
    costs, when each byte passes through every stage of `rates` (bytes/s) one after the other."""
    left = grace_s - step_s - fixed_s
    return max(0.0, left / sum(1 / r for r in rates))


def run(sizes_mib: tuple[int, ...] = (8, 64, 256), clouds: tuple[str, ...] = ("aws", "gcp"),
        step_s: float = 1.0) -> dict:
    """Measure commits on each cloud's emulator and this machine's local rates; compute the budgets.

    Returns {"local": {...}, "step_s", "sizes_mib", "clouds": {cloud: {"grace_s", "notice", "commits",
    "fixed_s", "emulator_mib_per_s", "largest_mib": {...measured...},
    "stated_links_mib": {"<type>, stated N Gbps": {"link_only", "with_this_machines_save_and_hash"}}}}}.
    """
    unknown = set(clouds) - set(GRACE_S)
    if unknown:
        raise ValueError(f"clouds must be among {sorted(GRACE_S)}, got {sorted(unknown)}")
    out: dict = {"step_s": step_s, "sizes_mib": list(sizes_mib), "clouds": {}}
    with tempfile.TemporaryDirectory(prefix="notice-budget-") as tmp:
        work = Path(tmp)
        local = _local_rates(max(sizes_mib) * MIB, work)
        out["local"] = {k: round(v / MIB, 1) for k, v in local.items()} | {"unit": "MiB/s, this machine"}
        saved_env = dict(os.environ)
        for cloud in clouds:
            try:
                with _run_uri(cloud) as uri:
                    rows = _measure_commits(uri, list(sizes_mib), work)
            finally:
                os.environ.clear()
                os.environ.update(saved_env)
            fixed, rate = _fit(rows)
            grace = GRACE_S[cloud]
            save, sha = local["save_bytes_per_s"], local["sha256_bytes_per_s"]
            # Measured: the emulator's commit rate already includes hashing; the save comes first.
            largest = {"emulator on this machine (measured; save + commit)":
                       round(largest_bytes(grace, step_s, fixed, save, rate) / MIB)}
            links = {}
            for name, gbps, stated in STATED_GBPS[cloud]:
                link = gbps * GBPS
                links[f"{name}, stated {stated} Gbps"] = {
                    "link_only": round(largest_bytes(grace, step_s, fixed, link) / MIB),
                    "with_this_machines_save_and_hash": round(largest_bytes(grace, step_s, fixed, save, sha, link) / MIB),
                }
            out["clouds"][cloud] = {
                "grace_s": grace, "notice": NOTICE[cloud], "commits": rows, "fixed_s": round(fixed, 3),
                "emulator_mib_per_s": round(rate / MIB, 1), "largest_mib": largest, "stated_links_mib": links,
            }
    return out


def _table(result: dict) -> str:
    lines = [f"local (this machine): save {result['local']['save_bytes_per_s']} MiB/s, "
             f"SHA-256 {result['local']['sha256_bytes_per_s']} MiB/s; last step {result['step_s']} s", ""]
    for cloud, r in result["clouds"].items():
        commits = ", ".join(f"{c['mib']} MiB in {c['seconds']} s" for c in r["commits"])
        lines += [f"{cloud}: grace {r['grace_s']} s ({r['notice']})",
                  f"  emulator commits: {commits}; fixed {r['fixed_s']} s, {r['emulator_mib_per_s']} MiB/s",
                  "  | link | largest checkpoint committed in the grace (MiB) |", "  |---|---:|"]
        lines += [f"  | {name} | {mib:,} |" for name, mib in r["largest_mib"].items()]
        lines += ["", "  | instance (bandwidth as the provider states it; upper bounds) | link only (MiB) "
                  "| with this machine's save + SHA-256 rates (MiB) |", "  |---|---:|---:|"]
        lines += [f"  | {name} | {v['link_only']:,} | {v['with_this_machines_save_and_hash']:,} |"
                  for name, v in r["stated_links_mib"].items()]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mib", default="8,64,256", help="checkpoint sizes to commit on the emulators (MiB)")
    p.add_argument("--clouds", default="aws,gcp", help="aws, gcp or both")
    p.add_argument("--step-seconds", type=float, default=1.0, help="time the last step takes before the save")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = p.parse_args(argv)
    sizes = tuple(int(s) for s in a.sizes_mib.split(",") if s.strip())
    if not sizes or any(s <= 0 for s in sizes):
        p.error("--sizes-mib takes positive sizes, e.g. 8,64,256")
    result = run(sizes, tuple(c.strip() for c in a.clouds.split(",") if c.strip()), a.step_seconds)
    print(json.dumps(result) if a.json else _table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
