"""The trainer package (with the run folder's package it imports) as a deterministic, content-addressed archive, and the two
components both clouds build from it: TrainerCode (the archive uploaded to the bucket)
and TrainerImage (trainer/Dockerfile built and pushed). Each cloud's subclass supplies
only what differs: the object store upload, and the registry login.

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
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_docker_build as docker_build

from components import project
from components.image_signature import ImageSignature
from components.project import RUNFOLDER_DIR, TRAINER_DIR
from components.scan_gate import ScanGate
from runfolder import layout

BUILD_DIR = project.BUILD_DIR / "code"
_FIXED_MTIME = 946684800  # 2000-01-01: any constant works; a real date keeps tar tools quiet


# Besides the .py files: the requirement files, the image's Dockerfile, and the machines' package
# cache script (bootstrap.sh sources it from the archive, beside the requirement files it caches).
SHIPPED_NAMES = ("requirements.txt", "requirements-gpu.txt", "requirements-keras2.txt", "Dockerfile", "pip_cache.sh",
                 "train")


def _members(src: Path) -> list[Path]:
    keep = []
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if "__pycache__" in rel.parts or any(part.startswith(".") for part in rel.parts):
            continue
        if p.is_file() and (p.suffix == ".py" or p.name in SHIPPED_NAMES):
            keep.append(p)
    return keep


# The user's folder (run.code) sits beside trainer/ in the archive and in the image:
# components/userdata.py's USER_CODE_DIR on the machines, the trainer's --code-dir.
USER_CODE_NAME = "usercode"


def pack(src: Path = TRAINER_DIR, user_code: Path | None = None, ground: Path = RUNFOLDER_DIR) -> bytes:
    """The deterministic tar.gz of `src` (.py files and SHIPPED_NAMES), the run folder's package
    `ground` (runfolder/, which the trainer imports) beside it, and, when given, the user's folder
    `user_code` as `usercode/` (every file that ships, see components/settings/usercode.py). The same
    folders always give the same bytes."""
    from components.settings.usercode import code_files

    files = [(str(Path(src.name) / p.relative_to(src)), p) for p in _members(src)]
    if not files:
        raise FileNotFoundError(f"{src}: no trainer files (*.py, requirements.txt) to pack")
    files = sorted(files + [(str(Path(ground.name) / p.relative_to(ground)), p)
                            for p in _members(ground) if p.suffix == ".py"])
    if user_code is not None:
        files += [(str(Path(USER_CODE_NAME) / p.relative_to(user_code)), p) for p in code_files(user_code)]
    return _tar_gz(files)


# The boot scripts a machine fetches from the bucket instead of carrying them in its user data (EC2
# takes 16 KiB, gzipped): what runs once the run folder has been read, by name and mode. lib.sh's
# `boot_scripts` installs them beside the others, in /opt/trainstack/bin, before bootstrap.
BOOT_SCRIPTS = (("bootstrap.sh", 0o755), ("rendezvous.sh", 0o644), ("progress.sh", 0o644))


def pack_boot_scripts(src: Path = project.USERDATA_DIR) -> bytes:
    """The deterministic tar.gz of BOOT_SCRIPTS from `src` (userdata/), each at the archive's top."""
    return _tar_gz([(name, src / name) for name, _mode in BOOT_SCRIPTS], dict(BOOT_SCRIPTS))


def boot_key(data: bytes) -> str:
    """`code/boot-<sha256[:16]>.tar.gz` for the boot scripts' archive bytes: the machine checks the name."""
    return layout.code_key("boot", hashlib.sha256(data).hexdigest()[:16])


def _tar_gz(files: list[tuple[str, Path]], modes: dict[str, int] | None = None) -> bytes:
    """`files` ((name in the archive, path)) as a tar.gz whose bytes depend on their names, contents and
    `modes` (by name; 0644 otherwise) only."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, p in files:
            info = tarfile.TarInfo(name)
            data = p.read_bytes()
            info.size = len(data)
            info.mtime = _FIXED_MTIME
            info.mode = (modes or {}).get(name, 0o644)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    # gzip.compress(mtime=0) leaves no timestamp or file name in the header.
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def archive_key(data: bytes) -> str:
    """`code/trainer-<sha256[:16]>.tar.gz` for the archive bytes (runfolder/layout.py's code key)."""
    return layout.code_key("trainer", hashlib.sha256(data).hexdigest()[:16])


def write_archive(data: bytes, build_dir: Path = BUILD_DIR, key: str | None = None) -> Path:
    """Write the archive (named after `key`, by default `archive_key`) where the Pulumi engine reads it;
    atomic, so runs never see half a file."""
    build_dir.mkdir(parents=True, exist_ok=True)
    path = build_dir / Path(key or archive_key(data)).name
    if not path.exists() or path.read_bytes() != data:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


IMAGE_CONTEXT_DIR = project.BUILD_DIR / "image"


def content_tag(data: bytes, base_image: str) -> str:
    """`trainer-<sha256[:16]>` of the trainer archive and the base image it is built FROM:
    a change to either gives a new tag (the stack's repositories have immutable tags)."""
    return "trainer-" + hashlib.sha256(data + b"\0" + base_image.encode()).hexdigest()[:16]


def build_context(data: bytes, root: Path = IMAGE_CONTEXT_DIR) -> Path:
    """The archive unpacked as a docker build context, `root/trainer-<archive hash>/trainer/…`.

    Unpacked into a temporary folder and renamed into place, so a build never sees half a
    context; an existing folder of the same tag already holds the same bytes.
    """
    final = root / Path(archive_key(data)).name.removesuffix(".tar.gz")
    if (final / "trainer" / "Dockerfile").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")
        if not (tmp / "trainer" / "Dockerfile").is_file():
            raise FileNotFoundError("the trainer archive holds no trainer/Dockerfile to build")
        try:
            os.rename(tmp, final)
        except OSError:
            # Another run put the same context in place first.
            if not (final / "trainer" / "Dockerfile").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def context_location(path: Path) -> str:
    """`path` relative to the working directory (the project root under `pulumi up`), so the
    build's inputs do not change with where the checkout lives."""
    return os.path.relpath(path, Path.cwd())


@dataclass(kw_only=True)
class Registry:
    """One repository an image is pushed to, and the deployer's login to its registry."""

    repository_url: pulumi.Input[str]
    """Registry host/path, no tag."""
    username: pulumi.Input[str]
    password: pulumi.Input[str]
    """Kept secret."""


def pushed_image(
    name: str,
    *,
    data: bytes,
    base_image: str,
    registries: list[Registry],
    parent: pulumi.Resource,
) -> tuple[str, docker_build.Image]:
    """Build `trainer/Dockerfile` from the archive `data` on `base_image` once and push it to
    every repository of `registries` under its content tag; returns (tag, image). Each
    registry's login is kept secret. Both clouds' TrainerImage call this; only the
    credentials differ.

    One build pushed to several repositories is the same manifest in each, so the image's one
    `digest` names it in every repository (`<repository>@<digest>`); its `ref` names one of them
    only. The repositories are in distinct regions, so each has its own registry host."""
    if not registries:
        raise ValueError("an image is pushed to one repository at least")
    tag = content_tag(data, base_image)
    context = build_context(data)
    urls = [pulumi.Output.from_input(r.repository_url) for r in registries]
    image = docker_build.Image(
        name,
        context=docker_build.BuildContextArgs(location=context_location(context)),
        dockerfile=docker_build.DockerfileArgs(location=context_location(context / "trainer" / "Dockerfile")),
        build_args={"BASE_IMAGE": base_image},
        platforms=[docker_build.Platform.LINUX_AMD64],
        push=True,
        tags=[pulumi.Output.concat(url, ":", tag) for url in urls],
        registries=[
            docker_build.RegistryArgs(
                address=url.apply(lambda u: u.split("/", 1)[0]),
                username=r.username,
                password=pulumi.Output.secret(r.password),
            )
            for url, r in zip(urls, registries, strict=True)
        ],
        # The base image is several GB: a preview should not pull and build it. No
        # registry cache either: a moving cache tag cannot live in an immutable repository.
        build_on_preview=False,
        opts=pulumi.ResourceOptions(parent=parent),
    )
    return tag, image


def user_code_dir(settings) -> str | None:
    """The absolute path of the stack's run.code folder (checked by the settings), or None."""
    return str((project.ROOT / settings.run.code).resolve()) if settings.run.code else None


def _path(folder: str | None) -> Path | None:
    return Path(folder) if folder else None


@dataclass(kw_only=True)
class TrainerCodeArgs:
    """Inputs of a TrainerCode (either cloud)."""

    bucket_name: pulumi.Input[str]
    """The stack's bucket, where the archive goes under code/."""
    baked_into_image: bool = False
    """True when the trainer is built into the image: nothing is uploaded and code_uri is ""."""
    source_dir: str = str(TRAINER_DIR)
    """The trainer package to pack."""
    user_code_dir: str | None = None
    """The user's folder (run.code), packed beside the trainer as usercode/."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the uploaded object (S3 object tags; GCS objects carry no labels)."""


# The content type of every archive the stack uploads (gzip-compressed tar).
ARCHIVE_TYPE = "application/gzip"


class TrainerCodeBase(pulumi.ComponentResource):
    """The trainer archive uploaded to <scheme>://<bucket>/code/trainer-<hash>.tar.gz, and the machines'
    boot scripts to <scheme>://<bucket>/code/boot-<hash>.tar.gz (boot_uri).

    A cloud's subclass names its type token and implements `_object`.
    """

    TYPE = ""
    code_uri: pulumi.Output[str]
    boot_uri: pulumi.Output[str]
    key: str
    """The object key ("" when baked into the image)."""

    def __init__(self, name: str, args: TrainerCodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, None, opts)
        if args.baked_into_image:
            self.key = ""
            self.code_uri = pulumi.Output.from_input("")
        else:
            data = pack(Path(args.source_dir), _path(args.user_code_dir))
            self.key = archive_key(data)
            self.code_uri = self._upload(name, args, self.key, write_archive(data))
        # The machines' boot scripts, whether or not the trainer is in the image.
        boot = pack_boot_scripts()
        self.boot_uri = self._upload(f"{name}-boot", args, boot_key(boot), write_archive(boot, key=boot_key(boot)))
        self.register_outputs({"code_uri": self.code_uri, "boot_uri": self.boot_uri})

    def _upload(self, name: str, args: TrainerCodeArgs, key: str, path: Path) -> pulumi.Output[str]:
        """Declare the object `key` of `args.bucket_name` holding the file at `path`; its URI.

        Kept when replaced (`retain_on_delete`): a new key replaces the object, and machines of the old
        launch or instance template (booting, or a group not yet on the new one) still fetch the old
        key; a few hundred KB per change, gone with the bucket."""
        return self._object(f"{name}-archive", args, key, pulumi.FileAsset(str(path)),
                            pulumi.ResourceOptions(parent=self, retain_on_delete=True))

    def _object(self, name: str, args: TrainerCodeArgs, key: str, source: pulumi.FileAsset,
                opts: pulumi.ResourceOptions) -> pulumi.Output[str]:
        """The cloud's object resource `name`: `source` at `key` of `args.bucket_name`, typed `ARCHIVE_TYPE`,
        with `opts`; returns its URI."""
        raise NotImplementedError


@dataclass(kw_only=True)
class ImageMirror:
    """Another region's repository the trainer image is pushed to as well."""

    repository_url: pulumi.Input[str]
    """Registry host/path, no tag."""
    provider: pulumi.ProviderResource
    """The provider of that repository's region: the registry login is asked for through it."""
    registry_id: pulumi.Input[str] | None = None
    """AWS: the account id of the registry (None on GCP)."""


@dataclass(kw_only=True)
class TrainerImageArgs:
    """Inputs of a TrainerImage (either cloud)."""

    repository_url: pulumi.Input[str]
    """The stack's repository, registry host/path (no tag)."""
    base_image: str
    """The pinned image the Dockerfile builds FROM (the stack's image.reference)."""
    source_dir: str = str(TRAINER_DIR)
    """The trainer package (with its Dockerfile) to build."""
    user_code_dir: str | None = None
    """The user's folder (run.code), copied into the image beside the trainer."""
    registry_id: pulumi.Input[str] | None = None
    """AWS: the account id of the registry the repository lives in (None on GCP)."""
    mirrors: list[ImageMirror] = field(default_factory=list)
    """The other placements' repositories, each in its region: the same image is pushed to each, and
    their machines pull it from there (`refs`)."""
    gate: Any = None
    """The stack's ImageSettings: the pushed digest reaches `refs` only through the scan's gate
    (components/scan_gate.py: image.maxSeverity, image.allowFindings, image.scanWaitMinutes); None: no gate."""
    signing_key: Any = None
    """The stack's SigningKey (`key_id`, `region`, `ready`): with a gate, the digest that passed it is signed in
    every repository (components/image_signature.py) before it reaches `refs`; None: nothing is signed."""


class TrainerImageBase(pulumi.ComponentResource):
    """The trainer image, built from trainer/Dockerfile and pushed by a content tag.

    A cloud's subclass names its type token and implements `_login` (the deployer's
    short-lived registry credentials); everything else is the same on both clouds.
    """

    TYPE = ""
    CLOUD = ""
    image: docker_build.Image
    tag: str
    """The content tag, trainer-<hash>."""
    digest: pulumi.Output[str]
    """sha256:… of the pushed image."""
    ref: pulumi.Output[str]
    """<repository_url>@<digest>: what the home placement's machines pull."""
    refs: list[pulumi.Output[str]]
    """`ref`, then <mirror repository_url>@<digest> of each mirror, in `mirrors`' order."""
    public_key: pulumi.Output[str] | None
    """The signing key's public key (base64 DER) once the digest is signed everywhere; None when unsigned."""

    def __init__(self, name: str, args: TrainerImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, None, opts)
        data = pack(Path(args.source_dir), _path(args.user_code_dir))
        targets = [(args.repository_url, args.registry_id, None)]
        targets += [(m.repository_url, m.registry_id, m.provider) for m in args.mirrors]
        registries = []
        for url, registry_id, provider in targets:
            username, password = self._login(registry_id, provider)
            registries.append(Registry(repository_url=url, username=username, password=password))
        self.tag, self.image = pushed_image(
            f"{name}-image",
            data=data,
            base_image=args.base_image,
            registries=registries,
            parent=self,
        )
        self.digest = self.image.digest
        self.public_key = None
        if args.signing_key is not None and args.gate is None:
            raise ValueError("an image is signed only once its scan's gate has passed it: give the gate too")
        if args.gate is not None:
            # The home repository's scan judges the one digest every mirror holds.
            gate = ScanGate(f"{name}-scan-gate", cloud=self.CLOUD, repository_url=args.repository_url,
                            digest=self.image.digest, image=args.gate, registry_id=args.registry_id,
                            opts=pulumi.ResourceOptions(parent=self))
            self.digest = gate.digest
        if args.signing_key is not None:
            # Signed after the gate (a blocked digest fails the gate, and nothing is signed), by a key whose grants
            # exist, in every repository a machine pulls from; the user data reads the signed digest and the key.
            key = args.signing_key
            signature = ImageSignature(
                f"{name}-signature", cloud=self.CLOUD, key=key.key_id, key_region=key.region,
                repository_urls=[args.repository_url, *(m.repository_url for m in args.mirrors)], digest=gate.digest,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[gate, *key.ready]))
            self.digest = signature.digest
            self.public_key = signature.public_key
        self.ref = pulumi.Output.concat(args.repository_url, "@", self.digest)
        # The one digest in each mirror: every placement pulls the same image from its own region.
        self.refs = [self.ref] + [pulumi.Output.concat(m.repository_url, "@", self.digest)
                                  for m in args.mirrors]
        self.register_outputs({"digest": self.digest, "ref": self.ref})

    def _login(self, registry_id: pulumi.Input[str] | None,
               provider: pulumi.ProviderResource | None) -> tuple[pulumi.Input[str], pulumi.Input[str]]:
        """(username, password) for a registry (`registry_id`: AWS's account id, None on GCP), looked up
        through `provider` (another region's), else through this component's."""
        raise NotImplementedError
