"""Which `tf.distribute` strategy a run uses, and which worker is the chief.

One machine (all its GPUs, or the CPU): `MirroredStrategy`. Several machines, named by
`TF_CONFIG` (`{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": i}}`):
`MultiWorkerMirroredStrategy`. The same custom training loop serves both; Keras 3 `fit`
does not work under the multi-worker strategy. Worker 0 is the chief: only it writes to
the run's bucket.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class Cluster:
    """This process's place in the job: how many workers, which one it is."""

    workers: int = 1
    index: int = 0
    addresses: tuple[str, ...] = ()  # every worker's host:port, in TF_CONFIG's order

    @property
    def address(self) -> str:
        """This worker's host:port (empty on one machine)."""
        return self.addresses[self.index] if self.index < len(self.addresses) else ""

    @property
    def peers(self) -> list[str]:
        """The other workers' addresses."""
        return [a for i, a in enumerate(self.addresses) if i != self.index]

    @property
    def is_chief(self) -> bool:
        """Worker 0 writes checkpoints, events and outputs; the others keep theirs local."""
        return self.index == 0

    @property
    def multi_worker(self) -> bool:
        return self.workers > 1


def read_cluster(env: dict | None = None) -> Cluster:
    """Parse `TF_CONFIG`; no variable or one worker means a single machine."""
    env = os.environ if env is None else env
    raw = env.get("TF_CONFIG", "").strip()
    if not raw:
        return Cluster()
    try:
        conf = json.loads(raw)
        workers = conf.get("cluster", {}).get("worker", [])
        task = conf.get("task", {})
        index = int(task.get("index", 0))
    except (ValueError, AttributeError, TypeError) as e:
        raise ValueError(f"TF_CONFIG is not valid JSON naming cluster.worker and task.index: {e}") from e
    if task.get("type", "worker") not in ("worker", "chief"):
        raise ValueError(f"TF_CONFIG task.type {task.get('type')!r}: this trainer runs workers only")
    if len(workers) > 1 and not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG task.index {index} is outside the {len(workers)} workers")
    if len(workers) <= 1:
        return Cluster()
    return Cluster(workers=len(workers), index=index, addresses=tuple(str(w) for w in workers))


def make_strategy(cluster: Cluster | None = None) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy for a multi-machine `TF_CONFIG`, else MirroredStrategy."""
    cluster = cluster or read_cluster()
    if cluster.multi_worker:
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.MirroredStrategy()
