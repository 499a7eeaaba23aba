"""TrainerImage (AWS): `trainer/Dockerfile` built and pushed to the stack's ECR repository
with the Pulumi docker-build provider; the machines run it by the pushed digest.

The build context is the trainer archive of components/code.py unpacked under
`build/image/`: exactly the bytes whose sha256 names the tag, laid out as the
Dockerfile's COPY lines expect (`trainer/…` from the context root), and nothing else of
the checkout (no virtualenv, no caches). The tag is `trainer-<hash of the archive and the base image>`: the repository's
tags are immutable, so an unchanged trainer pushes nothing and a changed one gets a new
tag. The registry login is the deployer's short-lived ECR token at `pulumi up` time,
kept secret and never written to user data; the machines log in with their own role.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from components.code import TRAINER_DIR, pack, pushed_image


@dataclass(kw_only=True)
class TrainerImageArgs:
    """Inputs of a TrainerImage."""

    repository_url: pulumi.Input[str]
    """The stack's ECR repository, ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME (no tag)."""
    registry_id: pulumi.Input[str]
    """The account id of the registry the repository lives in."""
    base_image: str
    """The pinned image the Dockerfile builds FROM (the stack's image.reference)."""
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
        super().__init__("trainstack:aws:TrainerImage", name, None, opts)
        data = pack(Path(args.source_dir))
        # Through the parent's provider: the token is for the stack's region.
        token = aws.ecr.get_authorization_token_output(
            registry_id=args.registry_id, opts=pulumi.InvokeOptions(parent=self)
        )
        self.tag, self.image = pushed_image(
            f"{name}-image",
            data=data,
            base_image=args.base_image,
            repository_url=args.repository_url,
            username=token.user_name,
            password=token.password,
            parent=self,
        )
        self.digest = self.image.digest
        self.ref = pulumi.Output.concat(args.repository_url, "@", self.image.digest)
        self.register_outputs({"digest": self.digest, "ref": self.ref})
