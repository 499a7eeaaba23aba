"""scheduler kubernetes: the run as a Job on the user's own EKS or GKE cluster, a room beside the groups.

`manifests` (the run's objects as the Kubernetes API spells them, no Pulumi) and `stack` (`TrainingStack`: the
cloud's bucket and pod identity, and those objects through an explicit provider); the tests judge the objects
with the API's schemas and a fake Job controller (tests/components/kubernetes/). What the room shares with the
groups, `ops` and the trainer is the run folder alone.
"""
