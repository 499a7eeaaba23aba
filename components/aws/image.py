"""TrainerImage (AWS): `trainer/Dockerfile` built and pushed to the stack's ECR repository
with the Pulumi docker-build provider; the machines run it by the pushed digest.

The build context is the trainer archive of components/code.py unpacked under
`build/image/`: exactly the bytes whose sha256 names the tag, laid out as the
Dockerfile's COPY lines expect (`trainer/…` from the context root), and nothing else of
the checkout (no virtualenv, no caches). The tag is `trainer-<hash of the archive and the base image>`: the repository's
tags are immutable, so an unchanged trainer pushes nothing and a changed one gets a new
tag. The registry login is the deployer's short-lived ECR token at `pulumi up` time,
kept secret and never written to user data; the machines log in with their own role.
With several placements the one build is pushed to each placement region's repository too
(`mirrors`), with a token of that region.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.code import ImageMirror, TrainerImageArgs, TrainerImageBase

__all__ = ["ImageMirror", "TrainerImage", "TrainerImageArgs"]


class TrainerImage(TrainerImageBase):
    """The trainer image, built from trainer/Dockerfile and pushed to ECR by a content tag."""

    TYPE = "trainstack:aws:TrainerImage"
    CLOUD = "aws"

    def _login(self, registry_id: pulumi.Input[str] | None,
               provider: pulumi.ProviderResource | None) -> tuple[pulumi.Input[str], pulumi.Input[str]]:
        # An ECR token is for one region's registry: through the parent's provider for the
        # stack's region, through a placement's own provider for its region.
        token = aws.ecr.get_authorization_token_output(
            registry_id=registry_id, opts=pulumi.InvokeOptions(parent=self, provider=provider)
        )
        return token.user_name, token.password
