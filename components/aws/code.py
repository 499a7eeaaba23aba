"""TrainerCode (AWS): the trainer archive (components/code.py) uploaded to the stack's bucket."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi_aws as aws

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
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the uploaded object."""


class TrainerCode(pulumi.ComponentResource):
    """The trainer archive uploaded to s3://<bucket>/code/trainer-<hash>.tar.gz."""

    code_uri: pulumi.Output[str]
    key: str
    """The object key ("" when baked into the image)."""

    def __init__(self, name: str, args: TrainerCodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:TrainerCode", name, None, opts)
        if args.baked_into_image:
            self.key = ""
            self.code_uri = pulumi.Output.from_input("")
        else:
            data = pack(Path(args.source_dir))
            self.key = archive_key(data)
            path = write_archive(data)
            obj = aws.s3.BucketObjectv2(
                f"{name}-archive",
                bucket=args.bucket_name,
                key=self.key,
                source=pulumi.FileAsset(str(path)),
                content_type="application/gzip",
                tags=args.tags,
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.code_uri = pulumi.Output.concat("s3://", obj.bucket, "/", obj.key)
        self.register_outputs({"code_uri": self.code_uri})
