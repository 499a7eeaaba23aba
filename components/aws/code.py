"""TrainerCode (AWS): the trainer archive (components/code.py) uploaded to the stack's S3 bucket."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.code import ARCHIVE_TYPE, TrainerCodeArgs, TrainerCodeBase, archive_key, pack

__all__ = ["TrainerCode", "TrainerCodeArgs", "archive_key", "pack"]


class TrainerCode(TrainerCodeBase):
    """The trainer archive uploaded to s3://<bucket>/code/trainer-<hash>.tar.gz."""

    TYPE = "trainstack:aws:TrainerCode"

    def _object(self, name: str, args: TrainerCodeArgs, key: str, source: pulumi.FileAsset,
                opts: pulumi.ResourceOptions) -> pulumi.Output[str]:
        obj = aws.s3.BucketObjectv2(name, bucket=args.bucket_name, key=key, source=source, content_type=ARCHIVE_TYPE,
                                    tags=args.tags, opts=opts)
        return pulumi.Output.concat("s3://", obj.bucket, "/", obj.key)
