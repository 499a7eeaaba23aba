"""What a run's pruned checkpoints cost: measured on versioned emulator buckets, removed by the rendered rules.

The real checkpoint code (`CheckpointStore.commit`, which prunes to `keep`) writes a run of
checkpoints to the emulator, next to a model file that is replaced and one that is deleted.
Then every noncurrent version the bucket holds is read back with what lifecycle rules match
on (S3: its tags; GCS: its Custom-Time), and the bucket's lifecycle rules, as the Pulumi
component renders them (read from the mock resources of a synth), are applied by
`tests/fixtures/lifecycle.py` as each cloud documents them: which rule removes each version,
and how many days after it became noncurrent it stops billing.

moto keeps versions (versioning turned on here, as the component does). gcp-storage-emulator has
no object versioning: it keeps a deleted object's generation as a soft-deleted object (its
default 7-day retention), which is what a versioned bucket keeps as a noncurrent version of a
deleted object; a replaced generation is not kept, so on GCS only deleted objects are measured
(a checkpoint's objects are never replaced, only deleted by pruning).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest

from components import storage as storage_plan_mod
from components.settings import load_settings
from runfolder import layout
from runfolder.storage import open_store
from tests.components.aws import helpers as aws_helpers
from tests.components.gcp import helpers as gcp_helpers
from tests.fixtures import lifecycle
from trainer.checkpoint_store import CheckpointStore

pytestmark = pytest.mark.slow

CHECKPOINTS = 6
KEEP = 2
DATA_BYTES = 5 * 1024 * 1024 + 4321  # the variables' file: on GCS above the (lowered) parallel-upload threshold


def _checkpoint_dir(root: Path, step: int) -> Path:
    d = root / f"ckpt-{step}"
    d.mkdir(parents=True)
    (d / "ckpt.index").write_bytes(os.urandom(1000))
    (d / "ckpt.data-00000-of-00001").write_bytes(os.urandom(DATA_BYTES))
    (d / "state.json").write_text(f'{{"step": {step}}}')
    return d


def _run(uri: str, tmp_path: Path) -> dict[int, int]:
    """A run's checkpoints through the real commit/prune code, and a model that changes; the bytes of each checkpoint."""
    store = open_store(uri)
    ckstore = CheckpointStore(store, keep=KEEP)
    sizes = {}
    for i in range(1, CHECKPOINTS + 1):
        info = ckstore.commit(i * 100, str(_checkpoint_dir(tmp_path / "local", i * 100)))
        sizes[i * 100] = info["bytes"]
    assert store.list(layout.CHECKPOINTS_PREFIX) == sorted(
        f"{layout.checkpoint_dir(s)}/{f}" for s in (500, 600)
        for f in ("COMMITTED", "ckpt.index", "ckpt.data-00000-of-00001", "state.json"))
    model = tmp_path / "saved_model.pb"
    model.write_bytes(b"m" * 3000)
    store.put_file(f"{layout.MODEL_PREFIX}saved_model.pb", str(model))
    store.put_file(f"{layout.MODEL_PREFIX}saved_model.pb", str(model))  # replaced: its first version is noncurrent
    store.put_bytes(f"{layout.MODEL_PREFIX}old.pb", b"o" * 2000)
    store.delete_prefix(f"{layout.MODEL_PREFIX}old.pb")  # deleted: noncurrent
    return sizes


def _s3_versions(bucket: str, prefix: str) -> list[lifecycle.Version]:
    s3 = boto3.client("s3")
    entries: dict[str, list[tuple[datetime, dict | None]]] = {}
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for v in page.get("Versions", []):
            entries.setdefault(v["Key"], []).append((v["LastModified"], v))
        for m in page.get("DeleteMarkers", []):
            entries.setdefault(m["Key"], []).append((m["LastModified"], None))
    out = []
    for key, items in entries.items():
        for when, v in items:
            if v is None:
                continue
            newer = [t for t, other in items if other is not v and t >= when]
            tags = s3.get_object_tagging(Bucket=bucket, Key=key, VersionId=v["VersionId"])["TagSet"]
            out.append(lifecycle.Version(
                name=key, size=int(v["Size"]), created=when,
                noncurrent_since=None if v["IsLatest"] else min(newer, default=when),
                tags={t["Key"]: t["Value"] for t in tags},
            ))
    return out


def _gcs_versions(bucket: str, prefix: str) -> list[lifecycle.Version]:
    from google.cloud import storage

    client = storage.Client()
    out = []
    for live in (True, False):
        for blob in client.list_blobs(bucket, prefix=prefix, soft_deleted=not live):
            out.append(lifecycle.Version(
                name=blob.name, size=int(blob.size), created=blob.time_created,
                noncurrent_since=None if live else blob.soft_delete_time,
                custom_time=blob.custom_time,
            ))
    return out


def _rendered(cloud: str):
    """(rules, remove(version)) as the stack's bucket component renders them."""
    if cloud == "s3":
        config = aws_helpers.one(aws_helpers.synth_raw(), "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
        rules = config["inputs"]["rules"]
        return rules, lambda v: lifecycle.s3_removal(v, rules)
    bucket = gcp_helpers.one(gcp_helpers.gcp(), "gcp:storage/bucket:Bucket")["inputs"]
    rules, soft = bucket["lifecycleRules"], lifecycle.gcs_soft_delete(bucket)
    return rules, lambda v: lifecycle.gcs_removal(v, rules, soft)


def _boto_shape(value):
    """A rendered (wire-name) lifecycle value in the S3 API's own shape: `noncurrentDays` -> `NoncurrentDays`."""
    if isinstance(value, list):
        return [_boto_shape(v) for v in value]
    if isinstance(value, dict):
        return {("ID" if k == "id" else k[0].upper() + k[1:]): _boto_shape(v) for k, v in value.items()}
    return value


def _is_checkpoint(run_prefix: str, name: str) -> bool:
    rel = name[len(run_prefix):]
    return layout.is_checkpoint_key(rel) or rel.startswith(".trainstack-parts/")


@pytest.mark.parametrize("run_root", ["s3", "gs"], indirect=True)
def test_pruned_checkpoints_stop_billing_within_two_days_and_the_rest_keeps_its_window(run_root, tmp_path,
                                                                                      monkeypatch):
    from runfolder.storage import gcs

    cloud = run_root.uri.split("://", 1)[0]
    # GCS: the variables' file goes up as parallel parts (deleted after compose: noncurrent too).
    monkeypatch.setattr(gcs, "PARALLEL_THRESHOLD", 3 * 1024 * 1024)
    monkeypatch.setattr(gcs, "PART_MIN", 1024 * 1024)
    if cloud == "s3":
        boto3.client("s3").put_bucket_versioning(Bucket=run_root.bucket,
                                                 VersioningConfiguration={"Status": "Enabled"})
    sizes = _run(run_root.uri, tmp_path)
    run_prefix = run_root.uri.split("://", 1)[1].split("/", 1)[1] + "/"
    versions = (_s3_versions if cloud == "s3" else _gcs_versions)(run_root.bucket, run_prefix)
    noncurrent = [v for v in versions if v.noncurrent_since is not None]
    pruned = [v for v in noncurrent if _is_checkpoint(run_prefix, v.name)]
    others = [v for v in noncurrent if not _is_checkpoint(run_prefix, v.name)]

    # What the run leaves: every pruned checkpoint whole (its files and marker) and, on GCS, the parts.
    pruned_steps = sorted(sizes)[:-KEEP]
    whole = [v for v in pruned if not v.name[len(run_prefix):].startswith(".trainstack-parts/")]
    parts = [v for v in pruned if v not in whole]
    assert {v.name.rsplit("/", 2)[-2] for v in whole} == {f"ckpt-{s}" for s in pruned_steps}
    files = sum(v.size for v in whole if not v.name.endswith("/" + layout.COMMITTED))
    assert files == sum(sizes[s] for s in pruned_steps)
    assert sum(v.size for v in parts) == (CHECKPOINTS * DATA_BYTES if cloud == "gs" else 0)
    assert {v.name.rsplit("/", 1)[-1] for v in others} >= ({"old.pb", "saved_model.pb"} if cloud == "s3" else {"old.pb"})

    rules, remove = _rendered(cloud)
    if cloud == "s3":
        # The rendered rules fit S3's API model (botocore checks the shape; moto checks no more than that:
        # it takes a tag filter with ExpiredObjectDeleteMarker, or 0 days, which AWS refuses).
        s3 = boto3.client("s3")
        s3.put_bucket_lifecycle_configuration(Bucket=run_root.bucket,
                                              LifecycleConfiguration={"Rules": _boto_shape(rules)})
        stored = s3.get_bucket_lifecycle_configuration(Bucket=run_root.bucket)["Rules"]
        assert sorted(r["ID"] for r in stored) == sorted(r["id"] for r in rules)
    # Every pruned checkpoint byte: removed by the checkpoint rule, billed 2 days at most.
    late = []
    for v in pruned:
        r = remove(v)
        if r is None or r.days_after(v.noncurrent_since) > 2:
            late.append((v.name[len(run_prefix):], v.size, r and r.rule, r and round(r.days_after(v.noncurrent_since), 2)))
    assert not late, (f"{sum(v.size for v in pruned):,} noncurrent checkpoint bytes in {len(pruned)} versions; "
                      f"these bill more than 2 days: {late[:4]}")
    assert {remove(v).rule for v in pruned} == {_checkpoint_rule(cloud, rules)}
    # Everything else keeps versioning's protection: only the storage.noncurrentDays rule, after 30 days.
    for v in others:
        r = remove(v)
        assert r is not None and r.rule != _checkpoint_rule(cloud, rules)
        assert 30 <= r.days_after(v.noncurrent_since) <= 31, (v.name, r)
    # The storage plan says the same for this run, the day after and 2 days after.
    settings = load_settings({**(aws_helpers.BASE if cloud == "s3" else gcp_helpers.BASE),
                              "run": {"id": "exp-7", "synthetic": True, "steps": 600, "checkpointEverySteps": 100,
                                      "checkpointEverySeconds": None, "keepCheckpoints": KEEP}}, stack="unit")
    plan = storage_plan_mod.storage_plan(settings, checkpoint_bytes=sizes[100])
    if cloud == "gs":
        plan = storage_plan_mod.StoragePlan(**{**plan.__dict__, "parts_too": True})  # parts at the lowered threshold
    assert plan.noncurrent_bytes_left(written=CHECKPOINTS, days_after=0) == pytest.approx(
        files + sum(v.size for v in parts), rel=0.01)
    assert plan.checkpoint_bytes_left(written=CHECKPOINTS, days_after=plan.billed_days) == KEEP * sizes[100]
    gone_by = max(remove(v).billed_until for v in pruned)
    assert (gone_by - datetime.now(tz=UTC)) / lifecycle.DAY <= plan.billed_days


def _checkpoint_rule(cloud: str, rules: list[dict]) -> str:
    if cloud == "s3":
        return "expire-noncurrent-checkpoints"
    (i,) = [i for i, r in enumerate(rules) if "daysSinceCustomTime" in r["condition"]]
    return f"rule {i} " + ",".join(f"{k}={val}" for k, val in sorted(rules[i]["condition"].items()))
