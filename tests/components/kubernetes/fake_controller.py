"""A small fake of Kubernetes' Job controller: what it does with a Job's failed pods under `podFailurePolicy`.

No API server runs here, so this follows the Kubernetes documentation ("Jobs: Pod failure policy", and the
task "Handling retriable and non-retriable pod failures with Pod failure policy"), for the parts a trainstack
Job uses:

- a pod's failure is judged once the pod is terminal (phase Failed); the rules are evaluated in order and the
  first that matches decides: `FailJob` ends the Job (reason PodFailurePolicy), `Ignore` does not count the
  failure and the pod is replaced, `Count` (and no rule matching) counts it against `backoffLimit`;
- `onExitCodes` looks at the terminated containers (only the one named by `containerName`, when given),
  leaving out those that exited 0; `In` matches when one exit code is in `values`, `NotIn` when one is not;
- `onPodConditions` matches when one pattern's `type` and `status` (default "True") is a condition of the pod;
- the Job fails with BackoffLimitExceeded once more pods failed than `backoffLimit`, and with DeadlineExceeded
  once `activeDeadlineSeconds` passed (a virtual clock).

Evictions carry the condition the cluster sets on the pod before it stops (type DisruptionTarget, status True,
with one of `DISRUPTION_REASONS`), and the exit codes a SIGTERM (143) or a SIGKILL after the grace period (137)
leave. `FailIndex` (with `backoffLimitPerIndex`) is not modelled: a trainstack Job does not use it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

# The reasons of a DisruptionTarget condition, as the Kubernetes documentation lists them (Pod disruption
# conditions); the policy looks at the condition's type and status only, and the messages here are ours.
DISRUPTION_REASONS = {
    "PreemptionByScheduler": "Scheduler: preempting to accommodate a higher priority pod",
    "DeletionByTaintManager": "Taint manager: deleting due to NoExecute taint",
    "EvictionByEvictionAPI": "Eviction API: evicting",
    "DeletionByPodGC": "PodGC: node no longer exists",
    "TerminationByKubelet": "Pod was terminated in response to imminent node shutdown.",
}
SIGTERM_EXIT, SIGKILL_EXIT = 143, 137


@dataclass
class Pod:
    """A pod of the Job, as its status says once it is terminal."""

    name: str
    index: int
    phase: str = "Running"
    conditions: list[dict[str, str]] = field(default_factory=list)
    # container name -> exit code of its terminated state (None: never terminated, e.g. its node vanished)
    exit_codes: dict[str, int | None] = field(default_factory=dict)


def failed_pod(name: str, index: int, exit_codes: dict[str, int | None],
               conditions: list[dict[str, str]] | None = None) -> Pod:
    """A pod whose containers ended with `exit_codes` and that is Failed."""
    return Pod(name=name, index=index, phase="Failed", conditions=list(conditions or []), exit_codes=dict(exit_codes))


def disrupted(pod: Pod, reason: str, exit_codes: dict[str, int | None]) -> Pod:
    """`pod` as the cluster leaves it after a disruption of `reason`: the DisruptionTarget condition is added
    before the pod is stopped, then it ends Failed with the containers' exit codes."""
    message = DISRUPTION_REASONS[reason]
    condition = {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}
    return failed_pod(pod.name, pod.index, exit_codes, [*pod.conditions, condition])


def _exit_codes_match(rule: dict[str, Any], pod: Pod) -> bool:
    req = rule["onExitCodes"]
    codes = [code for name, code in pod.exit_codes.items()
             if code is not None and code != 0 and req.get("containerName") in (None, name)]
    values = set(req["values"])
    if req["operator"] == "In":
        return any(code in values for code in codes)
    if req["operator"] == "NotIn":
        return any(code not in values for code in codes)
    raise ValueError(f"onExitCodes.operator {req['operator']!r}: expected In or NotIn")


def _conditions_match(rule: dict[str, Any], pod: Pod) -> bool:
    return any(c["type"] == pattern["type"] and c["status"] == pattern.get("status", "True")
               for pattern in rule["onPodConditions"] for c in pod.conditions)


def matching_action(policy: dict[str, Any] | None, pod: Pod) -> str:
    """The action of the first rule of `policy` that matches the failed `pod`; "Count" when none does."""
    for rule in (policy or {}).get("rules", []):
        if ("onExitCodes" in rule) == ("onPodConditions" in rule):
            raise ValueError("a podFailurePolicy rule has exactly one of onExitCodes and onPodConditions")
        matched = _exit_codes_match(rule, pod) if "onExitCodes" in rule else _conditions_match(rule, pod)
        if matched:
            if rule["action"] == "FailIndex":
                raise NotImplementedError("FailIndex (backoffLimitPerIndex) is not modelled")
            return rule["action"]
    return "Count"


class FakeJob:
    """One Job, driven by its pods' ends on a virtual clock; `status` as the API shows it."""

    def __init__(self, manifest: dict[str, Any]):
        self.manifest = copy.deepcopy(manifest)
        spec = self.manifest["spec"]
        if spec.get("podFailurePolicy") and spec["template"]["spec"].get("restartPolicy") != "Never":
            # The API server refuses it; a kubelet restarting the container would hide the pod's failure.
            raise ValueError("podFailurePolicy needs the pod template's restartPolicy: Never")
        self.completions = spec.get("completions", 1)
        self.backoff_limit = spec.get("backoffLimit", 6)
        self.deadline = spec.get("activeDeadlineSeconds")
        self.policy = spec.get("podFailurePolicy")
        self.now = 0.0
        self.status: dict[str, Any] = {"failed": 0, "succeeded": 0, "conditions": []}
        self.ignored = 0
        self.actions: list[tuple[str, str]] = []
        self.done: set[int] = set()
        self.pods: dict[int, Pod] = {}
        self._made = 0
        for i in range(spec.get("parallelism", 1)):
            self._start(i)

    def _start(self, index: int) -> Pod:
        self._made += 1
        name = f"{self.manifest['metadata']['name']}-{index}-{self._made:05x}"
        self.pods[index] = pod = Pod(name=name, index=index)
        return pod

    @property
    def finished(self) -> str | None:
        """"Complete" or "Failed" once the Job has that condition, else None."""
        types = [c["type"] for c in self.status["conditions"] if c["status"] == "True"]
        return next((t for t in types if t in ("Complete", "Failed")), None)

    def _fail(self, reason: str) -> None:
        self.status["conditions"].append({"type": "Failed", "status": "True", "reason": reason})
        self.pods.clear()  # the controller deletes the Job's running pods

    def advance(self, seconds: float) -> None:
        """Let time pass; past activeDeadlineSeconds the Job fails."""
        self.now += seconds
        if self.finished is None and self.deadline is not None and self.now >= self.deadline:
            self._fail("DeadlineExceeded")

    def pod_succeeded(self, index: int) -> None:
        """The pod of `index` exited 0."""
        self.pods.pop(index)
        self.done.add(index)
        self.status["succeeded"] += 1
        if len(self.done) == self.completions:
            self.status["conditions"].append({"type": "Complete", "status": "True"})

    def pod_failed(self, pod: Pod) -> str:
        """The (terminal, Failed) `pod` is judged by the policy; returns the action taken."""
        if self.finished is not None:
            raise RuntimeError(f"the Job is already {self.finished}")
        assert pod.phase == "Failed" and self.pods.get(pod.index) is not None
        action = matching_action(self.policy, pod)
        self.actions.append((pod.name, action))
        self.pods.pop(pod.index)
        if action == "FailJob":
            self.status["failed"] += 1
            self._fail("PodFailurePolicy")
        elif action == "Ignore":
            self.ignored += 1
            self._start(pod.index)
        else:
            self.status["failed"] += 1
            if self.status["failed"] > self.backoff_limit:
                self._fail("BackoffLimitExceeded")
            else:
                self._start(pod.index)
        return action
