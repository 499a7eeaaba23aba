"""TrainerCode (GCP): the trainer archive (components/code.py) uploaded to the stack's GCS bucket."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from components.code import ARCHIVE_TYPE, TrainerCodeArgs, TrainerCodeBase

__all__ = ["TrainerCode", "TrainerCodeArgs"]


class TrainerCode(TrainerCodeBase):
    """The trainer archive uploaded to gs://<bucket>/code/trainer-<hash>.tar.gz."""

    TYPE = "trainstack:gcp:TrainerCode"

    def _object(self, name: str, args: TrainerCodeArgs, key: str, source: pulumi.FileAsset,
                opts: pulumi.ResourceOptions) -> pulumi.Output[str]:
        # GCS objects carry no labels: args.tags has nowhere to go.
        obj = gcp.storage.BucketObject(name, bucket=args.bucket_name, name=key, source=source, content_type=ARCHIVE_TYPE,
                                       opts=opts)
        return pulumi.Output.concat("gs://", obj.bucket, "/", obj.name)
