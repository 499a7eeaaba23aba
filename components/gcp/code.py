"""TrainerCode (GCP): the trainer archive (components/code.py) uploaded to the stack's GCS bucket."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from components.code import TrainerCodeArgs, TrainerCodeBase

__all__ = ["TrainerCode", "TrainerCodeArgs"]


class TrainerCode(TrainerCodeBase):
    """The trainer archive uploaded to gs://<bucket>/code/trainer-<hash>.tar.gz."""

    TYPE = "trainstack:gcp:TrainerCode"

    def _upload(self, name: str, args: TrainerCodeArgs, key: str, path: Path) -> pulumi.Output[str]:
        # GCS objects carry no labels: args.tags has nowhere to go.
        obj = gcp.storage.BucketObject(
            f"{name}-archive",
            bucket=args.bucket_name,
            name=key,
            source=pulumi.FileAsset(str(path)),
            content_type="application/gzip",
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        return pulumi.Output.concat("gs://", obj.bucket, "/", obj.name)
