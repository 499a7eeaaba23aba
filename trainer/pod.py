"""`python -m trainer.pod`: the trainer as a Kubernetes Job's pod (scheduler kubernetes), then `python -m trainer`.

The pod knows itself through the downward API (`runfolder.environment`: its name is its name in the run's
lease) and says so in the run folder: its own event object `machine-events/<pod>.jsonl` gets one `pod` event
(its node, namespace and completion index) before the trainer starts, so `ops status` and the dashboard name
the pod of each attempt as they name a machine. It knows itself and its place in the run through the Job: an Indexed Job gives each pod JOB_COMPLETION_INDEX, and the
stack gives every worker's address in `TRAINSTACK_WORKERS` (by index). With several workers this makes
TF_CONFIG from the two, as the groups' boot makes it from the rendezvous; one worker needs none. The run
folder, the events, the checkpoints and the exit codes are the trainer's own, unchanged.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

from runfolder import environment

# Kubernetes sets it in each pod of an Indexed Job.
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"


class PodError(ValueError):
    """The pod's environment cannot make a worker: exit 2, a bad configuration (the Job fails at once)."""


def tf_config(env: Mapping[str, str]) -> str | None:
    """TF_CONFIG for this pod, or None for a single worker (or when TF_CONFIG is already set)."""
    if env.get("TF_CONFIG"):
        return None
    workers = [w for w in (env.get(environment.WORKERS) or "").split(",") if w]
    if len(workers) <= 1:
        return None
    raw = env.get(COMPLETION_INDEX, "")
    if not raw.isdigit() or int(raw) >= len(workers):
        raise PodError(f"{COMPLETION_INDEX}={raw!r}: expected an index below {len(workers)} (an Indexed Job's pod)")
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": int(raw)}})


def _run_uri(env: Mapping[str, str], argv: list[str]) -> str | None:
    """The run folder as the trainer will read it: its --run-uri flag, else its variable (the Job's way)."""
    for i, arg in enumerate(argv):
        if arg == "--run-uri" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--run-uri="):
            return arg.split("=", 1)[1]
    return env.get(environment.RUN_URI)


def record_pod(env: Mapping[str, str], argv: list[str]) -> None:
    """Write this pod's `pod` event to its own object, machine-events/<pod>.jsonl: the Job names each replacement
    anew, so the object has one writer and one line. Best effort: the run does not depend on it, and a failed
    write is one line on stderr."""
    from runfolder import layout
    from runfolder.events import utc_now
    from runfolder.storage import open_store

    pod, run = env.get(environment.MACHINE_ID), _run_uri(env, argv)
    if not pod or not run:
        return
    index = env.get(COMPLETION_INDEX, "")
    line = {layout.EVENT: layout.POD_STARTED, layout.TIME: utc_now(), "instance": pod,
            "node": env.get(environment.NODE_NAME, ""), "namespace": env.get(environment.POD_NAMESPACE, ""),
            "index": int(index) if index.isdigit() else None}
    try:
        open_store(run).put_bytes(layout.machine_events_key(pod), (json.dumps(line) + "\n").encode())
    except Exception as e:  # noqa: BLE001 - the stores raise many types; the training goes on either way
        print(f"trainer: the pod's event was not written ({type(e).__name__}: {e})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Set TF_CONFIG from the Job, record the pod, then run the trainer; its exit code is the pod's."""
    try:
        config = tf_config(os.environ)
    except PodError as e:
        print(f"trainer: error: {e}", file=sys.stderr)
        return 2
    record_pod(os.environ, sys.argv[1:] if argv is None else argv)
    if config is not None:
        os.environ["TF_CONFIG"] = config
    from trainer.__main__ import main as trainer_main

    return trainer_main(argv)


if __name__ == "__main__":
    from trainer.__main__ import exit_now

    exit_now(main())
