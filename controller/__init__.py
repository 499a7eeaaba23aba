"""The placement controller: moves a run to another placement when its own cannot get machines.

A stack with several placements (``trainstack:placements``: the same run, one spot group per
cloud region) has one active placement at a time. On a schedule (EventBridge Scheduler ->
Lambda on AWS, Cloud Scheduler -> a job on GCP), :func:`controller.handler.handler` runs one
:func:`controller.tick.tick`: it reads the run folder and the groups' launch state, decides
(:mod:`controller.decide`, pure) and, when the active placement has had no training machine
for ``waitMinutes`` while its group reports failed launches, moves the run: the active group
to zero, the old lease expired, the next placement's group to ``nodes``, a ``moved`` event.
``python -m ops move`` moves through the same function (:func:`controller.tick.move`).

Which placement is active and every move live in the run folder's ``placement.json``
(:mod:`controller.record`), written with conditional writes only: of two ticks at once, the
one whose write the store accepts moves the run.

A placement on the other cloud than home's is reached by federation with the function's own
identity (:mod:`controller.clouds`: a web identity role on AWS, an impersonated service account
through Workload Identity Federation on GCP).

The package imports neither TensorFlow nor Pulumi nor ``ops``: a function needs only this
package, ``runfolder/layout.py``, ``runfolder/lease.py`` and ``runfolder/storage/`` (boto3, tenacity;
google-cloud-storage and google-auth for a GCS run or a GCP group; google-auth's
``external_account`` credentials for a GCP group from AWS, botocore's web identity credentials
for an AWS group from GCP).
"""
