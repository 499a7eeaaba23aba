"""Benchmark: the seed article's training script against trainstack's trainer, same model, same data.

Both train the article's MNIST MLP (Dense128-relu, Dropout 0.2, Dense10, Adam) on
60,000 synthetic 28x28 images for the same number of epochs, on this machine, one after
the other in one run. Each reports examples/s over its training loop (the peer: Keras
`fit` wall time with its TensorBoard and per-epoch checkpoint callbacks; ours: the custom
loop, checkpoints to a file:// run included), and we measure each process's peak memory
(max RSS) with `wait4`.

Usage:  python bench/bench_trainer.py [--epochs 3] [--batch-sizes 64,512]
Prints a table and one JSON line; results go to bench/RESULTS.md by hand, with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLES_PER_EPOCH = 60_000


def _run(cmd: list[str], env: dict) -> tuple[int, str, float, float]:
    """Run `cmd`; returns (exit code, stdout, wall seconds, peak RSS in MiB)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.DEVNULL, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        return p.returncode, out.read(), wall, usage.ru_maxrss / 1024  # ru_maxrss is KiB on Linux


def bench_seed(epochs: int, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as out:
        rc, stdout, wall, rss = _run([sys.executable, str(HERE / "seed_train.py"), "--epochs", str(epochs), "--out", out], env)
    if rc != 0:
        raise SystemExit(f"seed_train.py failed with exit code {rc}")
    last = json.loads(stdout.strip().splitlines()[-1])
    return {"name": "seed (Keras fit, batch 64)", "examples_per_sec": last["examples_per_sec"],
            "process_wall_s": round(wall, 1), "peak_rss_mib": round(rss), "final_loss": last["final_loss"]}


def bench_trainer(epochs: int, batch: int, env: dict) -> dict:
    steps = EXAMPLES_PER_EPOCH * epochs // batch
    with tempfile.TemporaryDirectory() as root:
        cmd = [sys.executable, "-m", "trainer", "--run-uri", f"file://{root}/run", "--synthetic",
               "--steps", str(steps), "--batch-size", str(batch)]
        rc, stdout, wall, rss = _run(cmd, env)
    if rc != 0:
        raise SystemExit(f"trainer failed with exit code {rc}: {stdout[-2000:]}")
    finished = [json.loads(line) for line in stdout.splitlines() if '"finished"' in line][-1]
    return {"name": f"trainstack (custom loop, batch {batch})", "examples_per_sec": finished["examples_per_sec"],
            "process_wall_s": round(wall, 1), "peak_rss_mib": round(rss), "final_loss": round(finished["metrics"]["loss"], 5)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-sizes", default="64,512", help="per-replica batch sizes to run our trainer with")
    a = p.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    rows = [bench_seed(a.epochs, env)]
    rows += [bench_trainer(a.epochs, int(b), env) for b in a.batch_sizes.split(",")]
    base = rows[0]["examples_per_sec"]
    print(f"{'run':40} {'examples/s':>12} {'vs seed':>8} {'peak RSS MiB':>13} {'process s':>10} {'loss':>8}")
    for r in rows:
        r["vs_seed"] = round(r["examples_per_sec"] / base, 2)
        print(f"{r['name']:40} {r['examples_per_sec']:>12,.0f} {r['vs_seed']:>7}x {r['peak_rss_mib']:>13} "
              f"{r['process_wall_s']:>10} {r['final_loss']:>8}")
    print(json.dumps({"epochs": a.epochs, "examples": EXAMPLES_PER_EPOCH * a.epochs, "cpus": os.cpu_count(), "rows": rows}))


if __name__ == "__main__":
    main()
