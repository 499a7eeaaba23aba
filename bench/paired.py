"""The loop against the machine's limit as alternating pairs: a trainer run, then a limit run, N times.

    python -m bench.paired [--pairs 3] [--data synthetic,memory] [--steps 6000] [--seed-epochs 2]

Each pair is one `python -m trainer` run (the default run configuration: checkpoints every
--checkpoint-every-seconds to a local run folder, none by steps, TensorBoard on, the end's
evaluation and commit; more flags with --trainer-arg) followed at once by one `bench.limit` run
(the same model and batch, one batch in memory, 100 steps a call). The pair's ratio is the trainer's steady examples/s (its
first call, which traces the step, left out, as the limit leaves out its own) ÷ the limit's.
The median pair's ratio is the figure: a pair's two runs share the machine's load of the moment
(`uptime`'s 1-minute average is printed beside each run), so the load cancels within a pair.
It cancels only in part: under a load well above the cores, the scheduler shares them by runnable
threads, and the trainer (tf.data's and the checkpoint's threads beside the step) gets more than
the limit, whose ratio can then pass 100 %. The CPU ratio beside it (the limit's CPU µs per
example ÷ the trainer loop's, every thread counted, the trainer's first call left out) changes
least with the load: it is what the loop costs beyond the limit's step.

Data (`--data`): `synthetic` is the trainer's `--synthetic` stream; `memory` is an in-memory
MNIST-shaped set through `tf.data` (`bench.mnist_memory`: cached, shuffled, batched, prefetched),
the path a user's `make_dataset` takes. The seed article's `fit` (`bench/seed_train.py`) runs
right after each pair (`--seed-epochs`, 0: never), so that it shares the pair's load too: the
figure against it is the median of the pairs' trainer ÷ seed (its examples/s are its own: the
`fit` call's wall time).

On `memory`, each pair also runs the limit fed by the same pipeline (`bench.limit --fed-by
bench.mnist_memory:make_dataset`: the limit's loop taking each step's batch from it, nothing of the
trainer's): the bound that pipeline puts on the step, which the trainer's figure is under too.

Prints one JSON line per run, then one summary line per data path:
{"data", "median_ratio", "ratios", "median_cpu_ratio", "cpu_ratios", "trainer_median_examples_per_sec",
"median_ratio_to_fed_limit" and "fed_ratios" (`memory`: the trainer ÷ the fed limit),
"seed_median_examples_per_sec", "vs_seed" (the median of the pairs' trainer ÷ seed), "vs_seeds"}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = {"synthetic": ("--synthetic", "--model", "mlp"),
        "memory": ("--model", "bench.mnist_memory:model", "--code-dir", str(REPO))}
# The pipeline a data path's trainer is fed by, for the limit fed by it (none for --synthetic's arrays).
FED_BY = {"memory": "bench.mnist_memory:make_dataset"}


def load() -> float:
    """The 1-minute load average: what else the machine was doing."""
    return os.getloadavg()[0]


def last_json(text: str, event: str | None = None) -> dict:
    """The last JSON line printed (the last `event` line, if given)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if event is None or doc.get("event") == event:
                return doc
    raise SystemExit(f"bench.paired: no {event or 'JSON'} line in:\n{text[-2000:]}")


def run(argv: list[str], env: dict | None = None) -> str:
    """Run `argv` from the repository root; its stdout, or the bench stops with its stderr."""
    p = subprocess.run(argv, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
                       capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise SystemExit(f"bench.paired: {argv[:4]} exited {p.returncode}:\n{p.stdout[-1500:]}\n{p.stderr[-3000:]}")
    return p.stdout


def trainer(data: str, batch: int, steps: int, extra: list[str]) -> dict:
    """One trainer run in a fresh local run folder; its `finished` event."""
    with tempfile.TemporaryDirectory(prefix="paired-") as tmp:
        before = load()
        marks = os.path.join(tmp, "marks.json")
        # bench.probe runs exactly `python -m trainer`, and keeps the loop's CPU seconds.
        out = run([sys.executable, "-m", "bench.probe", "--run-uri", f"file://{tmp}/run", "--work-dir", f"{tmp}/work",
                   *DATA[data], "--batch-size", str(batch), "--steps", str(steps), *extra], env={"BENCH_MARKS": marks})
        fin = last_json(out, "finished")
        ckpts = sum(1 for line in out.splitlines() if line.startswith('{"event": "checkpoint"'))
        with open(marks) as fh:
            m = json.load(fh)
    cpu = round(m["loop_cpu_s"] / (m["loop_steps"] * batch) * 1e6, 2) if m.get("loop_steps") else None
    return {"run": "trainer", "data": data, "load": round(before, 2), "steps": steps, "checkpoints": ckpts,
            "examples_per_sec": fin.get("examples_per_sec"), "steady_examples_per_sec": fin.get("steady_examples_per_sec"),
            "loop_seconds": fin.get("loop_seconds"), "cpu_us_per_example": cpu}


def limit(batch: int, seconds: float, fed_by: str | None = None) -> dict:
    """One `bench.limit` run of the mlp at `batch` (`fed_by`: fed by that make_dataset, `bench.limit --fed-by`)."""
    before = load()
    doc = last_json(run([sys.executable, "-m", "bench.limit", "--model", "mlp", "--batch-size", str(batch),
                         "--seconds", str(seconds), *(("--fed-by", fed_by) if fed_by else ())]))
    return {"run": "fed limit" if fed_by else "limit", "load": round(before, 2),
            "examples_per_sec": doc["examples_per_sec"], "best_examples_per_sec": doc["best_examples_per_sec"],
            "cpu_us_per_example": doc["cpu_us_per_example"]}


def seed(epochs: int) -> dict:
    """The seed article's script (Keras `fit`), `epochs` epochs of 60,000 examples at batch 64."""
    before = load()
    with tempfile.TemporaryDirectory(prefix="paired-seed-") as out:
        doc = last_json(run([sys.executable, str(HERE / "seed_train.py"), "--epochs", str(epochs), "--out", out]))
    return {"run": "seed", "load": round(before, 2), "examples_per_sec": doc["examples_per_sec"]}


def main(argv: list[str] | None = None) -> int:
    """CLI: the pairs, each run's line, and one summary line per data path."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--data", default="synthetic,memory", help="comma-separated: synthetic, memory")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=6000, help="the trainer's steps per run (~10 s on a quiet machine)")
    p.add_argument("--limit-seconds", type=float, default=8.0)
    p.add_argument("--seed-epochs", type=int, default=2, help="the seed's epochs, run after every pair (0: no seed run)")
    p.add_argument("--trainer-arg", action="append", default=[], help="one more trainer flag (repeatable)")
    a = p.parse_args(argv)
    datas = [d for d in a.data.split(",") if d]
    for d in datas:
        if d not in DATA:
            p.error(f"--data: {d!r} is not one of {', '.join(DATA)}")
    summaries = []
    for d in datas:
        ratios, rates, cpu, seeds, vs_seed, vs_fed = [], [], [], [], [], []
        for _ in range(a.pairs):
            t = trainer(d, a.batch_size, a.steps, a.trainer_arg)
            print(json.dumps(t), flush=True)
            lim = limit(a.batch_size, a.limit_seconds)
            print(json.dumps(lim), flush=True)
            if d in FED_BY:
                fed = limit(a.batch_size, a.limit_seconds, FED_BY[d])
                print(json.dumps(fed), flush=True)
                vs_fed.append(t["steady_examples_per_sec"] / fed["examples_per_sec"])
            rates.append(t["steady_examples_per_sec"])
            ratios.append(t["steady_examples_per_sec"] / lim["examples_per_sec"])
            cpu.append(lim["cpu_us_per_example"] / t["cpu_us_per_example"])
            if a.seed_epochs:
                seed_doc = seed(a.seed_epochs)
                print(json.dumps(seed_doc), flush=True)
                seeds.append(seed_doc["examples_per_sec"])
                vs_seed.append(t["steady_examples_per_sec"] / seed_doc["examples_per_sec"])
        med = statistics.median(ratios)
        doc = {"data": d, "median_ratio": round(med, 3), "ratios": [round(r, 3) for r in ratios],
               "median_cpu_ratio": round(statistics.median(cpu), 3), "cpu_ratios": [round(r, 3) for r in cpu],
               "trainer_median_examples_per_sec": statistics.median(rates)}
        if vs_fed:
            doc["median_ratio_to_fed_limit"] = round(statistics.median(vs_fed), 3)
            doc["fed_ratios"] = [round(r, 3) for r in vs_fed]
        if seeds:
            doc["seed_median_examples_per_sec"] = statistics.median(seeds)
            doc["vs_seed"] = round(statistics.median(vs_seed), 2)
            doc["vs_seeds"] = [round(r, 2) for r in vs_seed]
        summaries.append(doc)
    for doc in summaries:
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
