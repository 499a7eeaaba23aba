"""TrainerImage (GCP): `trainer/Dockerfile` built and pushed to the stack's Artifact
Registry repository with the Pulumi docker-build provider; the machines run it by the
pushed digest.

The build context is the trainer archive of components/code.py unpacked under
`build/image/`: exactly the bytes whose sha256 names the tag, laid out as the
Dockerfile's COPY lines expect (`trainer/…` from the context root), and nothing else of
the checkout (no virtualenv, no caches). The tag is `trainer-<hash of the archive and the base image>`: the repository's
tags are immutable, so an unchanged trainer pushes nothing and a changed one gets a new
tag. The registry login is the deployer's short-lived OAuth access token at `pulumi up`
time, kept secret and never written to user data; the machines log in with their own
service account. With several placements the one build is pushed to each placement region's
repository too (`mirrors`).
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from components.code import ImageMirror, TrainerImageArgs, TrainerImageBase

__all__ = ["ImageMirror", "TrainerImage", "TrainerImageArgs"]


class TrainerImage(TrainerImageBase):
    """The trainer image, built from trainer/Dockerfile and pushed to Artifact Registry by a content tag."""

    TYPE = "trainstack:gcp:TrainerImage"
    CLOUD = "gcp"

    _token: pulumi.Output[str] | None = None

    def _login(self, registry_id: pulumi.Input[str] | None,
               provider: pulumi.ProviderResource | None) -> tuple[pulumi.Input[str], pulumi.Input[str]]:
        # The deployer's own credentials, through the stack's provider. Artifact Registry
        # takes an OAuth access token under this fixed user name. The token is the
        # deployer's, not a region's: one serves every placement's registry.
        if self._token is None:
            self._token = gcp.organizations.get_client_config_output(opts=pulumi.InvokeOptions(parent=self)).access_token
        return "oauth2accesstoken", self._token
