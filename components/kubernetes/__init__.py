"""scheduler kubernetes: the run as a Job on the user's own EKS or GKE cluster, a room beside the groups.

`manifests` (the run's objects as the Kubernetes API spells them, no Pulumi), `stack` (`TrainingStack`: the
cloud's bucket and pod identity, and those objects through an explicit provider) and `fake_controller` (the
Job controller's `podFailurePolicy`, as Kubernetes documents it, for the tests). What it shares with the
groups, `ops` and the trainer is the run folder alone.
"""
