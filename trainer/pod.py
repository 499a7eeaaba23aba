"""`python -m trainer.pod`: the trainer as a Kubernetes Job's pod (scheduler kubernetes), then `python -m trainer`.

The pod knows itself through the downward API (`runfolder.environment`: its name is its name in the run's
lease) and its place in the run through the Job: an Indexed Job gives each pod JOB_COMPLETION_INDEX, and the
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


def main(argv: list[str] | None = None) -> int:
    """Set TF_CONFIG from the Job, then run the trainer; its exit code is the pod's."""
    try:
        config = tf_config(os.environ)
    except PodError as e:
        print(f"trainer: error: {e}", file=sys.stderr)
        return 2
    if config is not None:
        os.environ["TF_CONFIG"] = config
    from trainer.__main__ import main as trainer_main

    return trainer_main(argv)


if __name__ == "__main__":
    from trainer.__main__ import exit_now

    exit_now(main())
