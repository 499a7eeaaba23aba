"""TrainerImage (GCP): `trainer/Dockerfile` built and pushed to the stack's Artifact
Registry repository with the Pulumi docker-build provider; the machines run it by the
pushed digest.

The build context is the trainer archive of components/code.py unpacked under
`build/image/`: exactly the bytes whose sha256 names the tag, laid out as the
Dockerfile's COPY lines expect (`trainer/…` from the context root), and nothing else of
the checkout (no virtualenv, no caches). The tag is `trainer-<hash>`: the repository's
tags are immutable, so an unchanged trainer pushes nothing and a changed one gets a new
tag. The registry login is the deployer's short-lived OAuth access token at `pulumi up`
time, kept secret and never written to user data; the machines log in with their own
service account.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_docker_build as docker_build
import pulumi_gcp as gcp

from components.code import PROJECT_ROOT, TRAINER_DIR, archive_key, pack

CONTEXT_DIR = PROJECT_ROOT / "build" / "image"

# content_tag, build_context and context_location are the AWS module's own, repeated
# here so that a GCP stack never loads pulumi-aws; a test holds the two to the same result.


def content_tag(data: bytes) -> str:
    """`trainer-<sha256[:16]>`: the image tag for a trainer archive (same hash as its object key)."""
    return Path(archive_key(data)).name.removesuffix(".tar.gz")


def build_context(data: bytes, root: Path = CONTEXT_DIR) -> Path:
    """The archive unpacked as a docker build context, `root/<content tag>/trainer/…`.

    Unpacked into a temporary folder and renamed into place, so a build never sees half a
    context; an existing folder of the same tag already holds the same bytes.
    """
    final = root / content_tag(data)
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
class TrainerImageArgs:
    """Inputs of a TrainerImage."""

    repository_url: pulumi.Input[str]
    """The image path in the stack's repository, REGION-docker.pkg.dev/PROJECT/REPO/trainer (no tag)."""
    source_dir: str = str(TRAINER_DIR)
    """The trainer package (with its Dockerfile) to build."""


class TrainerImage(pulumi.ComponentResource):
    """The trainer image, built from trainer/Dockerfile and pushed by a content tag."""

    image: docker_build.Image
    tag: str
    """The content tag, trainer-<hash>."""
    digest: pulumi.Output[str]
    """sha256:… of the pushed image."""
    ref: pulumi.Output[str]
    """<repository_url>@<digest>: what the machines pull."""

    def __init__(self, name: str, args: TrainerImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:TrainerImage", name, None, opts)
        data = pack(Path(args.source_dir))
        self.tag = content_tag(data)
        context = build_context(data)
        url = pulumi.Output.from_input(args.repository_url)
        # The deployer's own credentials, through the stack's provider.
        client = gcp.organizations.get_client_config_output(opts=pulumi.InvokeOptions(parent=self))
        self.image = docker_build.Image(
            f"{name}-image",
            context=docker_build.BuildContextArgs(location=context_location(context)),
            dockerfile=docker_build.DockerfileArgs(location=context_location(context / "trainer" / "Dockerfile")),
            platforms=[docker_build.Platform.LINUX_AMD64],
            push=True,
            tags=[pulumi.Output.concat(url, ":", self.tag)],
            registries=[
                docker_build.RegistryArgs(
                    address=url.apply(lambda u: u.split("/", 1)[0]),
                    # Artifact Registry takes an OAuth access token under this fixed user name.
                    username="oauth2accesstoken",
                    password=pulumi.Output.secret(client.access_token),
                )
            ],
            # The base image is several GB: a preview should not pull and build it. No
            # registry cache either: a moving cache tag cannot live in an immutable repository.
            build_on_preview=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.digest = self.image.digest
        self.ref = pulumi.Output.concat(url, "@", self.image.digest)
        self.register_outputs({"digest": self.digest, "ref": self.ref})
