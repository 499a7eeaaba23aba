"""TrainerCode: the trainer package as a content-addressed archive in the stack's bucket.

The machines run the pinned TensorFlow image and fetch the trainer from the bucket, so
a code change needs no image build. The archive is deterministic (sorted members, fixed
times and owners, gzip without a timestamp): the same `trainer/` always gives the same
bytes, so its sha256 names the object and an unchanged trainer means no upload and no
change to the machines' user data.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi_aws as aws

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
TRAINER_DIR = PROJECT_ROOT / "trainer"
BUILD_DIR = PROJECT_ROOT / "build" / "code"
_FIXED_MTIME = 946684800  # 2000-01-01: any constant works; a real date keeps tar tools quiet


def _members(src: Path) -> list[Path]:
    keep = []
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if "__pycache__" in rel.parts or any(part.startswith(".") for part in rel.parts):
            continue
        if p.is_file() and (p.suffix == ".py" or p.name in ("requirements.txt", "Dockerfile")):
            keep.append(p)
    return keep


def pack(src: Path = TRAINER_DIR) -> bytes:
    """The deterministic tar.gz of `src`: .py files, requirements.txt and Dockerfile."""
    files = _members(src)
    if not files:
        raise FileNotFoundError(f"{src}: no trainer files (*.py, requirements.txt) to pack")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in files:
            info = tarfile.TarInfo(str(Path(src.name) / p.relative_to(src)))
            data = p.read_bytes()
            info.size = len(data)
            info.mtime = _FIXED_MTIME
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    # gzip.compress(mtime=0) leaves no timestamp or file name in the header.
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def archive_key(data: bytes) -> str:
    """`code/trainer-<sha256[:16]>.tar.gz` for the archive bytes."""
    return f"code/trainer-{hashlib.sha256(data).hexdigest()[:16]}.tar.gz"


def write_archive(data: bytes, build_dir: Path = BUILD_DIR) -> Path:
    """Write the archive where the Pulumi engine reads it; atomic, so runs never see half a file."""
    build_dir.mkdir(parents=True, exist_ok=True)
    path = build_dir / Path(archive_key(data)).name
    if not path.exists() or path.read_bytes() != data:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


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
