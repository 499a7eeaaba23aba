"""TrainerCode (AWS): the trainer archive (components/code.py) uploaded to the stack's S3 bucket."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_aws as aws

from components.code import TrainerCodeArgs, TrainerCodeBase, archive_key, pack

__all__ = ["TrainerCode", "TrainerCodeArgs", "archive_key", "pack"]


class TrainerCode(TrainerCodeBase):
    """The trainer archive uploaded to s3://<bucket>/code/trainer-<hash>.tar.gz."""

    TYPE = "trainstack:aws:TrainerCode"

    def _upload(self, name: str, args: TrainerCodeArgs, key: str, path: Path) -> pulumi.Output[str]:
        obj = aws.s3.BucketObjectv2(
            f"{name}-archive",
            bucket=args.bucket_name,
            key=key,
            source=pulumi.FileAsset(str(path)),
            content_type="application/gzip",
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        return pulumi.Output.concat("s3://", obj.bucket, "/", obj.key)
