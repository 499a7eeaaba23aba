"""One command for every performance figure of the trainer; rewrites the generated part of bench/RESULTS.md.

    python -m bench            # the full run (~10-15 min on 2 CPU cores)
    python -m bench --quick    # a smoke run of every measurement on tiny sizes (~1 min)

Starts its own moto_server (`devtools.servers`, as the tests do) as the S3 the
runs checkpoint to, then measures one after the other, on this machine, in one run:

1. limit — each model's train step on one in-memory batch (`bench.limit`), and the trainer's
   loop (`python -m trainer` through `bench.probe`) on the same model and batch, checkpointing
   to S3 every 30 s with TensorBoard on: the loop's examples/s ÷ the limit;
2. seed — `bench/seed_train.py` (Keras `fit`) and the trainer on the same examples and batch:
   examples/s, whole-process wall time, and where the trainer's start-up seconds go;
3. startup — process start → first step, fresh and resumed from a ~100 MB checkpoint in S3,
   split into imports, strategy, model, restore, data set and the first call (tracing);
4. stall — the loop's blocked time per checkpoint of 10 MB, 100 MB and 1 GB (`bench.ckpt_stall`)
   as a share of a run checkpointing every 30 s; upload throughput against plain boto3;
5. preemption — SIGTERM → exit 143 with the checkpoint committed (~100 MB), in the start-up runs;
   and `bench/notice_budget.py`: the largest checkpoint that commits within a spot notice;
3b. resume — a model's own make_dataset (`bench/resume_model.py`: shuffle + map + batch) resumed
   after 1k and 100k steps: process start → first step against a fresh start, once from the
   input pipeline's state saved in the checkpoint and once skipping the consumed batches;
6. scaling — 1, 2 and 4 worker processes on 127.0.0.1 (TF_CONFIG), fixed per-worker batch;
7. boot — power-on → first step of a stack's first machine and of a replacement in the boot
   sandbox, the store and the package index behind throttled links (`bench/boot_cache.py`, its
   own process and emulators); skipped by `--quick` (the block says so): two machines' boot
   scripts and trainers cost ~33 s of CPU even at 1 MiB sizes.

Ratios are taken within this run only; the load average before and after is recorded,
because the figures depend on what else the machine does. `--only` runs some sections
(the others keep their previous figures out of the file: it is rewritten whole between its
markers), `--results PATH` writes elsewhere, `--json PATH` keeps the raw figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench import report as R
from devtools.servers import free_ports, start_moto_server

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SECTIONS = ("limit", "seed", "startup", "resume", "stall", "notice", "scaling", "boot")
SEED_EPOCH = 60_000  # bench/seed_train.py's examples per epoch


@dataclass
class Plan:
    """Sizes of every measurement: the full run, or the quick smoke run."""

    limit_seconds: float = 8.0
    loop_models: tuple = (("mlp", 64, ()), ("mlp", 512, ()), ("transformer-lm", 64, ()))
    loop_target_s: float = 35.0  # the loop's length if it ran at the limit: > one 30 s checkpoint
    checkpoint_every_s: float = 30.0
    seed_epochs: int = 5
    startup_model: tuple = ("--model", "transformer-lm", "--lm-vocab", "32768", "--lm-dim", "128",
                            "--batch-size", "8", "--steps-per-call", "1")
    hold_after_first_step_s: float = 3.0
    stall_sizes_mb: tuple = (10, 100, 1000)
    notice_sizes_mib: tuple = (8, 64, 256)
    notice_clouds: tuple = ("aws", "gcp")
    workers: tuple = (1, 2, 4)
    scaling_steps: int = 1500
    resume_steps: tuple = (1_000, 100_000)  # steps done before the resumes of a user make_dataset
    resume_rounds: int = 2  # fresh and from-state starts, alternated; the fastest of each counts
    # bench/boot_cache.py: the store's link (MiB/s each way, each answer), the package index's, the wheels it
    # serves (1/64 of the real ~3 GB) and a TFRecord data set in the bucket (MiB, files). None: not measured.
    # At 8 MiB/s an answer the trainer's 8 downloads take the 256 MiB in ~4 s, longer than its first call: the
    # first step comes with part of the set on disk (at 16 MiB/s and 64 MiB every file had landed before it).
    boot: dict | None = field(default_factory=lambda: {"store_mib_s": 8.0, "index_mib_s": 2.0, "wheels_mib": 48.0,
                                                       "data_mib": 256.0, "data_files": 64})
    quick: bool = False
    extra: dict = field(default_factory=dict)


QUICK = Plan(limit_seconds=1.0, loop_models=(("mlp", 64, ()),), loop_target_s=1.5, checkpoint_every_s=1.0,
             seed_epochs=1, startup_model=("--model", "transformer-lm", "--lm-vocab", "512", "--lm-dim", "32",
                                           "--batch-size", "8", "--steps-per-call", "1"),
             hold_after_first_step_s=0.5, stall_sizes_mb=(1,), notice_sizes_mib=(1, 4), notice_clouds=("aws",),
             workers=(1, 2), scaling_steps=100, resume_steps=(50, 500), resume_rounds=1,
             boot=None, quick=True)
# Why the quick run leaves `boot` out: at 1 MiB of wheels and of data the two machines' boot scripts, fake CLIs
# and trainers took 33 s of CPU (35 s wall), against the 20 s the quick run allows a section.
BOOT_SKIPPED_QUICK = ("skipped in the quick run: two machines' boot scripts and trainers cost ~33 s of CPU "
                      "even at 1 MiB sizes; `python -m bench --only boot` measures it")


# -- processes ----------------------------------------------------------------------------------


@dataclass
class Result:
    """What one process did: exit code, output, wall seconds, peak RSS, start-up marks."""

    rc: int
    stdout: str
    stderr: str
    wall_s: float
    rss_mib: float
    marks: dict
    signalled_at: float | None = None  # seconds after spawn

    def events(self, kind: str | None = None) -> list[dict]:
        """The JSON event lines the trainer printed (of `kind`, if given)."""
        out = []
        for line in self.stdout.splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    ev = json.loads(line)
                    if kind is None or ev.get("event") == kind:
                        out.append(ev)
        return out

    def last_json(self) -> dict:
        """The last JSON document of stdout (the helpers' result): one line, or indented over several
        (`json.dumps(..., indent=2)`), whose first line is the last one that starts with '{'."""
        starts, offset = [], 0
        for line in self.stdout.splitlines(keepends=True):
            if line.startswith("{"):
                starts.append(offset)
            offset += len(line)
        if not starts:
            raise ValueError(f"no JSON object in the output: {self.stdout[-500:]!r}")
        return json.JSONDecoder().raw_decode(self.stdout, starts[-1])[0]


class Bench:
    """Runs the measurements; holds the environment (moto endpoint, bucket) they share."""

    def __init__(self, plan: Plan, endpoint: str, bucket: str, log=print):
        self.plan = plan
        self.bucket = bucket
        self.log = log
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINSTACK_", "AWS_", "TF_CONFIG"))}
        self.env.update({
            "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO),
        })
        self.tmp = tempfile.mkdtemp(prefix="trainstack-bench-")

    def uri(self, name: str) -> str:
        """A fresh run URI in the bench's bucket."""
        return f"s3://{self.bucket}/runs/{name}-{uuid.uuid4().hex[:8]}"

    def spawn(self, argv: list[str], *, env: dict | None = None, signal_after_first_step: float | None = None,
              signal_on_event=None, timeout: float = 900, unwinds_on_sigterm: bool = False) -> Result:
        """Run `argv` to its end (SIGTERM `signal_after_first_step` s after the probe's first step, if given,
        or as soon as it prints an event for which `signal_on_event(event)` is true).

        `unwinds_on_sigterm`: the child stops what it started itself when it gets a SIGTERM
        (`bench/boot_cache.py` powers its sandboxes off): it gets one past the timeout, or when the bench
        dies, and 60 s to exit before it is killed."""
        marks_path = os.path.join(self.tmp, f"marks-{uuid.uuid4().hex[:8]}.json")
        run_env = {**self.env, **(env or {}), "BENCH_MARKS": marks_path}
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            t0 = time.time()
            run_env["BENCH_T0"] = repr(t0)
            p = subprocess.Popen(argv, cwd=REPO, env=run_env, stdout=out, stderr=err, text=True,
                                 preexec_fn=_dies_with_parent_sigterm if unwinds_on_sigterm else _dies_with_parent)
            signalled = None
            if signal_after_first_step is not None:
                deadline = time.monotonic() + timeout
                while p.poll() is None and not os.path.exists(marks_path) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if p.poll() is None:
                    time.sleep(signal_after_first_step)
                    signalled = time.time() - t0
                    p.send_signal(signal.SIGTERM)
            elif signal_on_event is not None:
                deadline = time.monotonic() + timeout
                while p.poll() is None and time.monotonic() < deadline:
                    # pread: the child shares this file's offset, which a seek would move under it.
                    printed = os.pread(out.fileno(), os.fstat(out.fileno()).st_size, 0).decode(errors="replace")
                    if any(signal_on_event(ev) for ev in Result(0, printed, "", 0, 0, {}).events()):
                        signalled = time.time() - t0
                        p.send_signal(signal.SIGTERM)
                        break
                    time.sleep(0.2)
            try:
                _, status, usage = _wait4(p, timeout)
            except TimeoutError:
                if unwinds_on_sigterm:
                    p.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=60)
                p.kill()
                p.wait()
                raise
            wall = time.time() - t0
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        marks = {}
        with contextlib.suppress(OSError, ValueError):
            marks = json.loads(Path(marks_path).read_text())
        return Result(os.waitstatus_to_exitcode(status), stdout, stderr, wall, usage.ru_maxrss / 1024, marks, signalled)

    def trainer(self, uri: str, *args: str, **kw) -> Result:
        """`python -m trainer` (through the start-up probe) on `uri`."""
        return self.spawn([sys.executable, "-m", "bench.probe", "--run-uri", uri, *args], **kw)

    def expect(self, res: Result, what: str, rcs=(0,)) -> Result:
        """Fail the bench with the process's own words when it ended with an unexpected code."""
        if res.rc not in rcs:
            raise SystemExit(f"bench: {what} exited {res.rc} (expected {rcs}); its last output:\n"
                             f"{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
        return res

    # -- 1. limit --

    def limit(self, model: str, batch: int, extra: tuple) -> dict:
        argv = [sys.executable, "-m", "bench.limit", "--model", model, "--batch-size", str(batch),
                "--seconds", str(self.plan.limit_seconds), *extra]
        return self.expect(self.spawn(argv), f"the limit of {model} at batch {batch}").last_json()

    def loop_run(self, model: str, batch: int, extra: tuple, steps: int, uri: str | None = None,
                 env: dict | None = None) -> dict:
        """One trainer run to completion, checkpointing to S3 every `checkpoint_every_s`; its figures."""
        uri = uri or self.uri(f"{model}-{batch}")
        work = tempfile.mkdtemp(prefix="work-", dir=self.tmp)  # kept by the trainer: its TensorBoard files are read
        try:
            res = self.expect(self.trainer(uri, "--synthetic", "--model", model, "--batch-size", str(batch),
                                           "--steps", str(steps), "--checkpoint-every-steps", "0",
                                           "--checkpoint-every-seconds", str(self.plan.checkpoint_every_s),
                                           "--work-dir", work, *extra, env=env), f"the trainer ({model}, batch {batch})")
            rates = [v for _, v in tensorboard_scalars(os.path.join(work, "tensorboard"), "examples_per_sec")]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        fin = res.events("finished")[-1]
        ckpts = [e for e in res.events("checkpoint") if e["step"] < fin["step"]]
        return {"model": model, "batch": batch, "steps": steps, "examples_per_sec": fin.get("examples_per_sec"),
                "steady_examples_per_sec": fin.get("steady_examples_per_sec"), "loop_seconds": fin.get("loop_seconds"),
                "best_examples_per_sec": max(rates, default=None), "windows": len(rates),
                "checkpoints_in_loop": len(ckpts), "process_wall_s": round(res.wall_s, 2),
                "peak_rss_mib": round(res.rss_mib), "marks": res.marks, "loss": fin["metrics"]["loss"]}

    def section_limit(self) -> list[dict]:
        rows = []
        for model, batch, extra in self.plan.loop_models:
            self.log(f"limit: {model} batch {batch}: in-memory limit")
            lim = self.limit(model, batch, extra)
            steps = max(50, int(lim["examples_per_sec"] * self.plan.loop_target_s / batch))
            self.log(f"limit: {model} batch {batch}: trainer, {steps} steps")
            run = self.loop_run(model, batch, extra, steps)
            rows.append({"limit": lim, "trainer": run})
        return rows

    # -- 2. seed --

    def section_seed(self) -> dict:
        epochs = self.plan.seed_epochs
        self.log(f"seed: seed_train.py, {epochs} epochs")
        with tempfile.TemporaryDirectory() as out:
            seed = self.expect(self.spawn([sys.executable, str(HERE / "seed_train.py"), "--epochs", str(epochs),
                                           "--out", out]), "seed_train.py")
        steps = SEED_EPOCH * epochs // 64
        self.log(f"seed: trainer, {steps} steps at batch 64")
        ours = self.loop_run("mlp", 64, (), steps)
        return {"seed": {**seed.last_json(), "process_wall_s": round(seed.wall_s, 2), "peak_rss_mib": round(seed.rss_mib),
                         "examples": SEED_EPOCH * epochs}, "trainer": ours}

    # -- 3 + 5. start-up and preemption --

    def section_startup(self) -> dict:
        uri = self.uri("startup")
        args = ("--synthetic", "--steps", "1000000", "--checkpoint-every-steps", "0",
                "--checkpoint-every-seconds", "3600", *self.plan.startup_model)
        hold = self.plan.hold_after_first_step_s
        out = {}
        for kind in ("fresh", "resumed"):
            self.log(f"startup: {kind} run, SIGTERM {hold} s after its first step")
            res = self.expect(self.trainer(uri, *args, signal_after_first_step=hold), f"the {kind} start-up run",
                              rcs=(143,))
            pre = res.events("preempted")[-1]
            committed = self._committed(uri, pre["step"])
            out[kind] = {"marks": res.marks, "process_wall_s": round(res.wall_s, 2),
                         "sigterm_to_exit_s": round(res.wall_s - res.signalled_at, 2),
                         "preempted_seconds": pre.get("seconds"), "step": pre["step"], "committed": committed,
                         "checkpoint_bytes": committed.get("bytes") if committed else None,
                         "resumed_from": (res.events("resumed") or [{}])[-1].get("step")}
        return out

    def _committed(self, uri: str, step: int) -> dict | None:
        import boto3

        from runfolder import layout

        key = uri.split("/", 3)[3] + "/" + layout.committed_key(step)
        client = boto3.session.Session().client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                                                aws_access_key_id="testing", aws_secret_access_key="testing")
        try:
            return json.loads(client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except client.exceptions.NoSuchKey:
            return None

    # -- 3b. resume of a user make_dataset --

    def section_resume(self) -> list[dict]:
        """Start-up of a user make_dataset's run: fresh, and resumed after N steps from the pipeline state or by skipping.

        Fresh and from-state starts alternate, `resume_rounds` of each, and each keeps its fastest:
        another user's load only slows a start down. The skipping start (the old way) runs once.
        """
        hold = self.plan.hold_after_first_step_s
        # --steps-per-call fixed: every first call runs the same 100 steps; no checkpoint by the clock.
        base = ("--code-dir", str(HERE), "--model", "resume_model:build", "--batch-size", "8", "--steps", "100000000",
                "--steps-per-call", "100", "--checkpoint-every-seconds", "3600")
        rows = []
        for done in self.plan.resume_steps:
            def start(uri: str, what: str, *extra: str, done: int = done) -> Result:
                self.log(f"resume: {done:,} steps done: {what}")
                return self.expect(self.trainer(uri, *base, "--checkpoint-every-steps", "0", *extra,
                                                signal_after_first_step=hold), what, rcs=(143,))

            uri = self.uri(f"resume-{done}")
            self.log(f"resume: training {done:,} steps")
            self.expect(self.trainer(uri, *base, "--checkpoint-every-steps", str(done), timeout=3600,
                                     signal_on_event=lambda e, n=done: e.get("event") == "checkpoint" and e["step"] >= n),
                        f"the run to {done:,} steps", rcs=(143,))
            fresh, state = [], []
            for _ in range(self.plan.resume_rounds):
                fresh.append(start(self.uri("resume-fresh"), "a fresh start"))
                # Each stop commits a checkpoint with the pipeline state, a few batches on.
                state.append(start(uri, "resumed from the pipeline state"))
            # Last: --data-state-max-mb 0 neither saves nor uses the state (skips as before this existed).
            skip = start(uri, "resumed by skipping", "--data-state-max-mb", "0")
            row = {"steps_done": done, "rounds": self.plan.resume_rounds,
                   "fresh": min((r.marks for r in fresh), key=lambda m: m.get("first_step", math.inf))}
            best_state = min(state, key=lambda r: r.marks.get("first_step", math.inf))
            for name, res in (("state", best_state), ("skip", skip)):
                resumed = res.events("resumed")[-1]
                row[name] = {"marks": res.marks, "batches_seen": resumed["batches_seen"],
                             "restored": (res.events("data_restored") or [None])[-1],
                             "skipped": (res.events("data_skipped") or [None])[-1]}
            row["first_steps"] = {"fresh": [r.marks.get("first_step") for r in fresh],
                                  "state": [r.marks.get("first_step") for r in state]}
            rows.append(row)
        return rows

    # -- 4. stall --

    def section_stall(self) -> dict:
        sizes = ",".join(str(s) for s in self.plan.stall_sizes_mb)
        self.log(f"stall: checkpoints of {sizes} MB")
        # Each size is written six times (before, background, plain, alone, SIGTERM, TF async): at load ~20
        # the three sizes took over 15 minutes.
        res = self.expect(self.spawn([sys.executable, "-m", "bench.ckpt_stall", "--bucket", self.bucket,
                                      "--sizes-mb", sizes], timeout=2400), "the checkpoint stall bench")
        return {**res.last_json(), "every_s": 30.0}

    # -- 5b. the largest checkpoint committed within a spot notice --

    def section_notice(self) -> dict:
        sizes = ",".join(str(s) for s in self.plan.notice_sizes_mib)
        self.log(f"notice: bench/notice_budget.py, commits of {sizes} MiB ({', '.join(self.plan.notice_clouds)})")
        # It starts its own emulators (S3 and GCS) and says so in its figures.
        res = self.expect(self.spawn([sys.executable, str(HERE / "notice_budget.py"), "--json", "--sizes-mib", sizes,
                                      "--clouds", ",".join(self.plan.notice_clouds)]), "bench/notice_budget.py")
        return res.last_json()

    # -- 6. scaling --

    def section_scaling(self, one_worker: dict | None) -> list[dict]:
        rows = []
        for n in self.plan.workers:
            if n == 1 and one_worker is not None and not self.plan.quick and one_worker["steps"] >= self.plan.scaling_steps:
                rows.append({"workers": 1, **_scaling_row(one_worker)})
                continue
            self.log(f"scaling: {n} worker process(es), {self.plan.scaling_steps} steps at batch 64 each")
            rows.append({"workers": n, **self._workers(n)})
        return rows

    def _workers(self, n: int) -> dict:
        if n == 1:
            return _scaling_row(self.loop_run("mlp", 64, (), self.plan.scaling_steps))
        ports = free_ports(n)
        workers = [f"127.0.0.1:{p}" for p in ports]
        uri = self.uri(f"workers{n}")
        with contextlib.ExitStack() as stack:
            procs = []
            for i in range(n):
                tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
                argv = [sys.executable, "-m", "trainer", "--run-uri", uri, "--synthetic", "--batch-size", "64",
                        "--steps", str(self.plan.scaling_steps), "--checkpoint-every-steps", "0",
                        "--checkpoint-every-seconds", str(self.plan.checkpoint_every_s)]
                out = stack.enter_context(tempfile.TemporaryFile("w+"))
                procs.append((subprocess.Popen(argv, cwd=REPO, env={**self.env, "TF_CONFIG": tf_config}, stdout=out,
                                               stderr=subprocess.DEVNULL, text=True, preexec_fn=_dies_with_parent),
                               out))
            t0 = time.time()
            try:
                codes = [p.wait(timeout=900) for p, _ in procs]
            finally:
                for p, _ in procs:
                    if p.poll() is None:
                        p.kill()
            wall = time.time() - t0
            procs[0][1].seek(0)
            chief = Result(codes[0], procs[0][1].read(), "", wall, 0, {})
        if any(codes):
            raise SystemExit(f"bench: {n} workers exited {codes}; the chief printed:\n{chief.stdout[-2000:]}")
        fin = chief.events("finished")[-1]
        return {"examples_per_sec": fin.get("examples_per_sec"), "steady_examples_per_sec": fin.get("steady_examples_per_sec"),
                "loop_seconds": fin.get("loop_seconds"), "steps": self.plan.scaling_steps, "process_wall_s": round(wall, 2)}

    # -- 7. boot --

    def section_boot(self) -> dict:
        """Power-on → first step, a stack's first machine and a replacement (`bench/boot_cache.py`, which
        starts its own S3, package index, metadata service and throttled links, and says so in its figures)."""
        if self.plan.boot is None:
            return {"skipped": BOOT_SKIPPED_QUICK}
        b = self.plan.boot
        self.log(f"boot: bench/boot_cache.py, store {b['store_mib_s']:g} MiB/s, index {b['index_mib_s']:g} MiB/s, "
                 f"wheels {b['wheels_mib']:g} MiB, data {b['data_mib']:g} MiB in {b['data_files']} files")
        argv = [sys.executable, "-m", "bench.boot_cache", "--json", "--store-mib-s", str(b["store_mib_s"]),
                "--index-mib-s", str(b["index_mib_s"]), "--wheels-mib", str(b["wheels_mib"]),
                "--data-mib", str(b["data_mib"]), "--data-files", str(b["data_files"])]
        # Its own waits are bounded (600 s per machine's first step, per cache commit): this bounds the rest.
        return self.expect(self.spawn(argv, timeout=2700, unwinds_on_sigterm=True), "bench/boot_cache.py").last_json()


def tensorboard_scalars(folder: str, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every scalar `tag` in the TensorBoard event files under `folder`.

    Reads the TFRecord framing and the Event protos itself (tensorboard's protos, no
    TensorFlow import in the bench's own process).
    """
    import struct

    from tensorboard.compat.proto import event_pb2

    out: list[tuple[int, float]] = []
    for path in sorted(Path(folder).rglob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, i)
            record = data[i + 12 : i + 12 + length]
            i += 12 + length + 4  # length, its CRC, the record, its CRC
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.tag != tag:
                    continue
                t = value.tensor
                if value.HasField("simple_value"):
                    out.append((event.step, value.simple_value))
                elif t.float_val:
                    out.append((event.step, t.float_val[0]))
                elif t.double_val:
                    out.append((event.step, t.double_val[0]))
                elif len(t.tensor_content) >= 4:
                    out.append((event.step, struct.unpack("<f", t.tensor_content[:4])[0]))
    return out


def _scaling_row(run: dict) -> dict:
    keep = ("examples_per_sec", "steady_examples_per_sec", "loop_seconds", "steps", "process_wall_s")
    return {k: run[k] for k in keep}


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _installed(dist: str) -> str | None:
    """The installed version of the distribution `dist`, or None."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _dies_with_parent(sig: int = signal.SIGKILL) -> None:
    """In the child before exec: the kernel kills it when the bench that started it dies, so a killed
    bench (a timeout, ^C twice) leaves no trainer training on for a million steps. Linux only; elsewhere
    a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def _dies_with_parent_sigterm() -> None:
    """`_dies_with_parent` with a SIGTERM, for a child that stops its own children on one."""
    _dies_with_parent(signal.SIGTERM)


def _wait4(p: subprocess.Popen, timeout: float):
    """`os.wait4` with a deadline (polling, so a hung child cannot hang the bench)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return pid, status, usage
        if time.monotonic() > deadline:
            raise TimeoutError(f"{p.args[:4]} still running after {timeout} s")
        time.sleep(0.02)


def machine(load: tuple[float, float], tf_version: str, gpus: int) -> dict:
    """The machine's description for the report."""
    return {"cpus": os.cpu_count(), "platform": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(), "tf": tf_version, "gpus": gpus,
            "load_before": load[0], "load_after": load[1]}


def main(argv: list[str] | None = None) -> int:
    """Run the bench; returns the exit code."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="every measurement on tiny sizes (a smoke run, ~1 min)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="the Markdown file whose generated block is rewritten")
    p.add_argument("--json", default=None, help="also write the raw figures here")
    a = p.parse_args(argv)
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        p.error(f"--only {','.join(unknown)}: expected some of {','.join(SECTIONS)}")
    plan = QUICK if a.quick else Plan()
    sys.path.insert(0, str(REPO))
    import boto3


    started, load_before = time.time(), os.getloadavg()[0]
    server = start_moto_server()
    bench: Bench | None = None
    try:
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        boto3.session.Session().client("s3", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id="testing",
                                       aws_secret_access_key="testing").create_bucket(Bucket=bucket)
        bench = Bench(plan, server.url, bucket, log=lambda msg: print(f"[bench {time.strftime('%H:%M:%S')}] {msg}",
                                                                       file=sys.stderr, flush=True))
        fig: dict = {"plan": {"checkpoint_every_s": plan.checkpoint_every_s, "startup_model": list(plan.startup_model),
                              "scaling_steps": plan.scaling_steps}, "quick": plan.quick}
        fig["errors"] = {}
        for name in SECTIONS:
            if name not in only:
                continue
            try:
                if name == "scaling":
                    one = next((r["trainer"] for r in fig.get("limit", []) if r["trainer"]["model"] == "mlp"
                                and r["trainer"]["batch"] == 64), None)
                    fig[name] = bench.section_scaling(one)
                else:
                    fig[name] = getattr(bench, f"section_{name}")()
            except (Exception, SystemExit) as e:  # noqa: BLE001 - one failed section must not lose the others' figures
                fig["errors"][name] = f"{type(e).__name__}: {e}"[-3000:]
                bench.log(f"{name}: FAILED, going on with the next section: {fig['errors'][name][:500]}")
            if a.json:
                Path(a.json).write_text(json.dumps(fig, indent=1, default=str))
    finally:
        server.close()
        if bench is not None:
            shutil.rmtree(bench.tmp, ignore_errors=True)  # the runs' folders: every figure is in `fig` by now
    tf_version, gpus = "?", 0
    for r in fig.get("limit", []):
        tf_version, gpus = r["limit"]["tf_version"], r["limit"]["gpus"]
    if tf_version == "?":
        # The installed distribution's version: no TensorFlow import (seconds of CPU) just to print it.
        tf_version = _installed("tensorflow") or _installed("tensorflow-cpu") or "?"
    fig["machine"] = machine((load_before, os.getloadavg()[0]), tf_version, gpus)
    fig["date"] = datetime.now(tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    fig["duration_s"] = time.time() - started
    fig["command"] = "python -m bench" + (" --quick" if a.quick else "") + (f" --only {a.only}" if a.only != ",".join(SECTIONS) else "")
    block = R.render(fig)
    path = Path(a.results)
    path.write_text(R.replace_block(path.read_text() if path.exists() else "# Benchmark results\n", block))
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1, default=str))
    print(block)
    return 1 if fig["errors"] else 0
