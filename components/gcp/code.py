"""TrainerCode: the trainer package as a content-addressed archive in the stack's bucket.

The archive is the same deterministic tar.gz the AWS stack uploads (one packer for both
clouds, in components/code.py); here it goes to gs://<bucket>/code/trainer-<hash>.tar.gz.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from components.code import TRAINER_DIR, archive_key, pack, write_archive


@dataclass(kw_only=True)
class TrainerCodeArgs:
    """Inputs of a TrainerCode."""

    bucket_name: pulumi.Input[str]
    """The stack's bucket, where the archive goes under code/."""
    baked_into_image: bool = False
    """True when the trainer is built into the image: nothing is uploaded and code_uri is ""."""
    source_dir: str = str(TRAINER_DIR)
    """The trainer package to pack."""


class TrainerCode(pulumi.ComponentResource):
    """The trainer archive uploaded to gs://<bucket>/code/trainer-<hash>.tar.gz."""

    code_uri: pulumi.Output[str]
    key: str
    """The object name ("" when baked into the image)."""

    def __init__(self, name: str, args: TrainerCodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:TrainerCode", name, None, opts)
        if args.baked_into_image:
            self.key = ""
            self.code_uri = pulumi.Output.from_input("")
        else:
            data = pack(Path(args.source_dir))
            self.key = archive_key(data)
            obj = gcp.storage.BucketObject(
                f"{name}-archive",
                bucket=args.bucket_name,
                name=self.key,
                source=pulumi.FileAsset(str(write_archive(data))),
                content_type="application/gzip",
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.code_uri = pulumi.Output.concat("gs://", obj.bucket, "/", obj.name)
        self.register_outputs({"code_uri": self.code_uri})
