"""The fake Job controller (fake_controller.py) against the Kubernetes documentation's own podFailurePolicy
examples, then the stack's own Job: evictions are not failures, a bad configuration fails the Job at once."""

from __future__ import annotations

import pytest

from components.kubernetes import manifests
from components.kubernetes.stack import job_manifest
from ops import synth
from tests.components.kubernetes.fake_controller import (
    DISRUPTION_REASONS,
    SIGKILL_EXIT,
    SIGTERM_EXIT,
    FakeJob,
    Pod,
    disrupted,
    failed_pod,
    matching_action,
)

# The Job concept page's example (Pod failure policy): main exiting 42 fails the Job, disruptions are ignored.
DOCS_POLICY = {"rules": [
    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
]}
# The task page's custom-condition example: a controller marks the pod ConfigIssue, and the Job fails.
CONFIG_ISSUE_POLICY = {"rules": [{"action": "FailJob", "onPodConditions": [{"type": "ConfigIssue"}]}]}
NOT_IN_POLICY = {"rules": [{"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [40, 41, 42]}},
                           {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}}]}
DISRUPTION = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}

CASES = [
    # (case, policy, exit codes, conditions, action)
    ("main-exits-42-fails-the-job", DOCS_POLICY, {"main": 42}, [], "FailJob"),
    ("main-exits-1-counts", DOCS_POLICY, {"main": 1}, [], "Count"),
    ("evicted-is-ignored", DOCS_POLICY, {"main": SIGKILL_EXIT}, [DISRUPTION], "Ignore"),
    ("other-container-42-is-not-main", DOCS_POLICY, {"sidecar": 42, "main": 1}, [], "Count"),
    ("first-rule-wins-over-the-disruption", DOCS_POLICY, {"main": 42}, [DISRUPTION], "FailJob"),
    ("disruption-not-true-counts", DOCS_POLICY, {"main": 137}, [{**DISRUPTION, "status": "False"}], "Count"),
    ("custom-condition-fails-the-job", CONFIG_ISSUE_POLICY, {"main": 1},
     [{"type": "ConfigIssue", "status": "True"}], "FailJob"),
    ("not-in-matches-an-exit-outside", NOT_IN_POLICY, {"main": 3}, [], "Count"),
    ("not-in-skips-a-listed-exit", NOT_IN_POLICY, {"main": 42}, [], "Ignore"),
    ("zero-exits-are-left-out", NOT_IN_POLICY, {"main": 42, "sidecar": 0}, [], "Ignore"),
    ("no-policy-counts", None, {"main": 42}, [DISRUPTION], "Count"),
]


@pytest.mark.parametrize(("case", "policy", "codes", "conditions", "action"), CASES, ids=[c[0] for c in CASES])
def test_the_documented_rules_decide_as_documented(case, policy, codes, conditions, action):
    assert matching_action(policy, failed_pod("p", 0, codes, conditions)) == action


def _docs_job(**spec):
    """The concept page's example Job (completions 12, parallelism 3, backoffLimit 6) with `spec` changes."""
    pod = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "docker.io/library/bash:5"}]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job-pod-failure-policy-example"},
            "spec": {"completions": 12, "parallelism": 3, "backoffLimit": 6, "podFailurePolicy": DOCS_POLICY,
                     "template": {"spec": pod}, **spec}}


def test_the_docs_job_fails_at_once_on_exit_42_with_reason_pod_failure_policy():
    job = FakeJob(_docs_job())
    assert job.pod_failed(failed_pod(job.pods[1].name, 1, {"main": 42})) == "FailJob"
    assert job.finished == "Failed" and job.status["conditions"][-1]["reason"] == "PodFailurePolicy"
    assert job.pods == {}  # its other pods are deleted


def test_the_docs_ignore_job_completes_after_a_drain_with_no_failure_counted():
    """The task page's second example: backoffLimit 0, the node drained (Eviction API) under the pod."""
    job = FakeJob(_docs_job(completions=4, parallelism=1, backoffLimit=0))
    for index in range(4):
        if index == 1:
            job.pod_failed(disrupted(job.pods[index], "EvictionByEvictionAPI", {"main": SIGTERM_EXIT}))
        job.pod_succeeded(index)
        if index < 3:
            job._start(index + 1)
    assert job.finished == "Complete" and job.status["failed"] == 0 and job.ignored == 1


def test_without_the_ignore_rule_the_same_drain_fails_the_job():
    job = FakeJob(_docs_job(completions=4, parallelism=1, backoffLimit=0, podFailurePolicy=None))
    job.pod_failed(disrupted(job.pods[0], "EvictionByEvictionAPI", {"main": SIGTERM_EXIT}))
    assert job.finished == "Failed" and job.status["conditions"][-1]["reason"] == "BackoffLimitExceeded"


def test_a_policy_with_restart_on_failure_is_refused():
    job = _docs_job()
    job["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    with pytest.raises(ValueError, match="restartPolicy: Never"):
        FakeJob(job)


@pytest.fixture(scope="module")
def stack_jobs():
    """The Job each kubernetes stack makes, from its validated settings."""
    out = {}
    for name in ("eks", "gke"):
        settings = synth.load_source(synth.STACKS_DIR / f"Pulumi.{name}.yaml").settings
        out[name] = job_manifest(settings, f"s3://bucket/runs/{name}")
    return out


@pytest.mark.parametrize("stack", ["eks", "gke"])
def test_two_evictions_of_the_stacks_job_count_no_failure_and_it_completes(stack_jobs, stack):
    manifest = stack_jobs[stack]
    job = FakeJob(manifest)
    nodes = manifest["spec"]["completions"]
    assert manifest["spec"]["backoffLimit"] == 3 and len(job.pods) == nodes
    # A spot node's shutdown (the kubelet's graceful shutdown: the trainer commits and exits 143), then a node
    # gone without notice (Pod GC: no container ever reported an exit).
    first = job.pods[0]
    assert job.pod_failed(disrupted(first, "TerminationByKubelet", {"trainer": SIGTERM_EXIT})) == "Ignore"
    second = job.pods[0]
    assert second.name != first.name and second.index == 0  # replaced at the same index
    assert job.pod_failed(disrupted(second, "DeletionByPodGC", {"trainer": None})) == "Ignore"
    for index in range(nodes):
        job.pod_succeeded(index)
    assert job.finished == "Complete"
    assert job.status["failed"] == 0 and job.ignored == 2


@pytest.mark.parametrize("reason", sorted(DISRUPTION_REASONS))
def test_every_disruption_reason_is_ignored_whatever_the_trainer_exited(stack_jobs, reason):
    for code in (SIGTERM_EXIT, SIGKILL_EXIT, 1, manifests.BAD_CONFIG_EXIT):
        job = FakeJob(stack_jobs["eks"])
        assert job.pod_failed(disrupted(job.pods[0], reason, {"trainer": code})) == "Ignore"
        assert job.status["failed"] == 0 and job.finished is None


def test_the_stacks_job_fails_at_once_on_a_bad_configuration_and_counts_crashes(stack_jobs):
    job = FakeJob(stack_jobs["eks"])
    job.pod_failed(failed_pod(job.pods[0].name, 0, {"trainer": manifests.BAD_CONFIG_EXIT}))
    assert job.finished == "Failed" and job.status["conditions"][-1]["reason"] == "PodFailurePolicy"

    job = FakeJob(stack_jobs["eks"])
    for n in range(4):  # backoffLimit 3: the fourth crash ends it
        job.pod_failed(failed_pod(job.pods[0].name, 0, {"trainer": 1}))
        assert job.status["failed"] == n + 1
    assert job.finished == "Failed" and job.status["conditions"][-1]["reason"] == "BackoffLimitExceeded"

    job = FakeJob(stack_jobs["eks"])  # stopped by a signal after a commit, outside any disruption: resumes
    assert job.pod_failed(failed_pod(job.pods[0].name, 0, {"trainer": SIGTERM_EXIT})) == "Ignore"


def test_the_stacks_job_ends_at_the_runtime_cap(stack_jobs):
    job = FakeJob(stack_jobs["gke"])
    job.advance(12 * 3600 - 1)
    assert job.finished is None
    job.advance(1)
    assert job.finished == "Failed" and job.status["conditions"][-1]["reason"] == "DeadlineExceeded"


def test_a_pod_running_has_no_exit_to_judge():
    assert matching_action(DOCS_POLICY, Pod(name="p", index=0, phase="Failed", exit_codes={"main": None})) == "Count"
