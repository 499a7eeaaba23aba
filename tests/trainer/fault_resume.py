"""Driver for the exact-resume-under-faults test: many stopped-and-resumed runs in one process.

Run as `python -m tests.trainer.fault_resume --endpoint URL --rates 0.25,0.5 --tries 10 --out FILE`
(TensorFlow loads once; a subprocess per attempt would cost seconds each). It trains one
uninterrupted reference run on `file://`, then, for each fault rate and seed, a run on S3
through a `FaultProxy` failing that share of requests (seeded): the first attempt is
stopped as SIGTERM would stop it (its stop flag raised) at a seeded step, and a second
attempt resumes it to the end. Each final checkpoint's variables are compared with the reference's; the
results go to `--out` as JSON for the test to assert on.

The object-store clients' retry sleeps are shortened so that 50 % faults stay quick, and a write gets more
tries than a run can exhaust (exactness is the subject, not the give-up bound); they
still draw their jitter from Python's global `random` as in production, which is what
the scenario is about.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import random
import sys
import tempfile
import threading
import uuid
from pathlib import Path

ARGS = ["--synthetic", "--deterministic", "--seed", "11", "--batch-size", "32", "--log-every", "10",
        "--checkpoint-every-steps", "20", "--progress-every-seconds", "3600"]


class _Watch(io.TextIOBase):
    """The trainer's stdout: keeps the events."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self.events += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        return len(text)

    def isatty(self) -> bool:
        return False


def _skip_export() -> None:
    # The SavedModel export costs seconds per run and is not what this scenario checks: the
    # final checkpoint's variables are compared.
    from trainer import export

    export.export_model = lambda model, local_dir, store: 0
    export.saved_model_signature = lambda local_dir: {}


def _shared_synthetic_data() -> None:
    # Every attempt trains on the same synthetic set (one seed): drawn once for the process,
    # not 60,000 images again per attempt (0.2-0.35 s of CPU each, of about 1.3). Read-only,
    # so no attempt can hand the next other data.
    from trainer import data

    real = data.synthetic_mnist

    @functools.cache
    def synthetic_mnist(*args, **kwargs):
        arrays = real(*args, **kwargs)
        for array in arrays:
            array.setflags(write=False)
        return arrays

    data.synthetic_mnist = synthetic_mnist


def _fast_client_retries() -> None:
    import botocore.retries.adaptive as adaptive
    import botocore.retries.standard as standard

    standard.ExponentialBackoff._get_base_scale = lambda self, context: 0.002
    adaptive.ClientRateLimiter.on_sending_request = lambda self, request, **kwargs: None
    from runfolder.storage import retry

    retry.BACKOFF_INITIAL_S = 0.005
    # Exactness is the subject here, not the give-up bound (tests/runfolder test that): at 50 % faults a write
    # failing its 5 tries (each with botocore's own) ended an attempt about once in three CI runs (seed 3's
    # final COMMITTED marker), so the driver gives each write more tries than a run could ever exhaust.
    retry.TRANSFER_ATTEMPTS = 40


def _attempt(uri: str, steps: int, stop_at: int | None = None) -> tuple[int, list[dict]]:
    """One attempt in this process; with `stop_at`, stopped as SIGTERM would stop it at that step.

    The flag is raised as the loop starts the call that reaches `stop_at` (a step before a
    checkpoint, at one, or at the very start), so the stop lands at a known step however
    fast the steps and however slow the store.
    """
    import keras

    from trainer import cadence
    from trainer import loop_attempt as attempt
    from trainer.config import load_config
    from trainer.signals import StopRequest

    keras.backend.clear_session()  # fresh layer names and global state, as in a new process
    stop = StopRequest()
    out = _Watch()
    cfg = load_config(["--run-uri", uri, "--steps", str(steps), *ARGS])
    real = cadence.Cadence.steps_this_call

    def steps_this_call(training, step: int) -> int:
        if stop_at is not None and step >= stop_at and not stop.requested:
            stop.signal_name = "SIGTERM"  # what the handler records
            stop.event.set()
        return real(training, step)

    cadence.Cadence.steps_this_call = steps_this_call
    try:
        return attempt.train(cfg, stream=out, stop=stop), out.events
    finally:
        cadence.Cadence.steps_this_call = real


def _jitter_probe(uri: str, steps: int) -> tuple[int, list[dict]]:
    """A run whose `started` write draws retry jitter from Python's global `random` while in flight.

    What a store retry does (botocore's and google-api-core's backoff jitter), made
    deterministic: the write draws once the generators are seeded (or after a second), and
    the model build waits for that draw (or a second). A trainer that seeds and builds with
    the write still in flight gets other initial weights; one that waits for its writes
    first does not.
    """
    import keras

    from runfolder.storage import FileStore
    from trainer import models

    seeded, drew = threading.Event(), threading.Event()
    real_seed, real_build, real_append = keras.utils.set_random_seed, models.build_model, FileStore.append_lines

    def set_random_seed(seed):
        real_seed(seed)
        seeded.set()

    def build_model(cfg):
        drew.wait(1.0)
        return real_build(cfg)

    def append_lines(self, key, lines):
        if any('"started"' in line for line in lines) and not drew.is_set():
            seeded.wait(1.0)
            random.random()  # the jitter of one retry
            drew.set()
        return real_append(self, key, lines)

    keras.utils.set_random_seed, models.build_model, FileStore.append_lines = set_random_seed, build_model, append_lines
    try:
        return _attempt(uri, steps)
    finally:
        keras.utils.set_random_seed, models.build_model, FileStore.append_lines = real_seed, real_build, real_append


def _weights(uri: str, step: int) -> dict:
    from tests.trainer.helpers import committed_weights

    return committed_weights(uri, step, Path(tempfile.mkdtemp(prefix="weights-")))


def main(argv: list[str] | None = None) -> int:
    """Run the scenario; writes a JSON report."""
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True, help="moto_server URL")
    p.add_argument("--rates", default="0.25,0.5")
    p.add_argument("--tries", type=int, default=10)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", required=True)
    p.add_argument("--probe", action="store_true", help="also run the jitter probe (see _jitter_probe)")
    a = p.parse_args(argv)

    import boto3

    from devtools.fault_proxy import FaultProxy
    from tests.trainer.helpers import max_abs_diff
    from trainer.__main__ import imports_kept

    # Imported as `python -m trainer` imports them: each attempt's `clear_session` collects
    # what the attempts made, not TensorFlow's own objects again.
    with imports_kept():
        import keras  # noqa: F401

        from trainer import loop_attempt as attempt  # noqa: F401
    _fast_client_retries()
    _skip_export()
    _shared_synthetic_data()
    root = Path(tempfile.mkdtemp(prefix="fault-resume-"))
    ref_uri = f"file://{root}/ref"
    rc, events = _attempt(ref_uri, a.steps)
    assert rc == 0, f"reference run failed with {rc}: {events[-1] if events else 'no events'}"
    reference = _weights(ref_uri, a.steps)

    s3 = boto3.client("s3", endpoint_url=a.endpoint)
    results = []
    if a.probe:
        uri = f"file://{root}/probe"
        rc, _ = _jitter_probe(uri, a.steps)
        results.append({"probe": True, "rc": rc, "diff": max_abs_diff(_weights(uri, a.steps), reference)})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    with FaultProxy(a.endpoint) as proxy:
        for rate in (float(r) for r in a.rates.split(",")):
            for seed in range(a.tries):
                bucket = f"fault-resume-{uuid.uuid4().hex[:12]}"
                s3.create_bucket(Bucket=bucket)
                uri = f"s3://{bucket}/runs/r"
                # Stop at a seeded point: the first call, at a checkpoint, or between two.
                target = random.Random(seed).choice([0, 10, 20, 40, 60])
                before = proxy.failed
                os.environ["AWS_ENDPOINT_URL"] = proxy.url
                proxy.fail_randomly(rate, seed=1000 * int(rate * 100) + seed)
                try:
                    rc1, ev1 = _attempt(uri, a.steps, stop_at=target)
                    rc2, ev2 = _attempt(uri, a.steps)
                finally:
                    proxy.heal()
                    os.environ["AWS_ENDPOINT_URL"] = a.endpoint
                preempted = [e["step"] for e in ev1 if e.get("event") == "preempted"]
                resumed = [e["step"] for e in ev2 if e.get("event") == "resumed"]
                diff = max_abs_diff(_weights(uri, a.steps), reference) if rc2 == 0 else None
                results.append({"rate": rate, "seed": seed, "target": target, "rc": [rc1, rc2],
                                "preempted": preempted, "resumed": resumed, "faults": proxy.failed - before,
                                "diff": diff, "attempts": [ev1[0].get("attempt") if ev1 else None,
                                                           ev2[0].get("attempt") if ev2 else None]})
                if rc1 not in (0, 143) or rc2 != 0:  # what a failed attempt said last, for the report
                    results[-1]["last_events"] = [e for e in (ev1 if rc1 not in (0, 143) else ev2)[-3:]]
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
