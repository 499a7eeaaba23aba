"""ImageRepository: the stack's private Artifact Registry Docker repository.

Tags are immutable (a pinned tag can never move under a running job), pushed images are
scanned for vulnerabilities when the project has the Container Scanning API on, and
cleanup policies keep the newest N versions and delete the rest. Artifact Registry
encrypts at rest with Google-managed keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

IMAGE_NAME = "trainer"


@dataclass(kw_only=True)
class ImageRepositoryArgs:
    """Inputs of an ImageRepository."""

    repository_name: str
    """The repository's id, e.g. trainstack-dev."""
    location: str
    """The region the repository lives in (next to the machines)."""
    gcp_project: str
    """The GCP project (part of the image path)."""
    keep_images: int = 10
    """Image versions kept; older ones are deleted by the cleanup policies."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels for the repository."""


class ImageRepository(pulumi.ComponentResource):
    """Docker repository with immutable tags, scanning and a keep-the-last-N cleanup."""

    repository: gcp.artifactregistry.Repository
    url: pulumi.Output[str]
    """Registry path of the trainer image (without tag)."""

    def __init__(self, name: str, args: ImageRepositoryArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:ImageRepository", name, None, opts)
        self.repository = gcp.artifactregistry.Repository(
            f"{name}-repo",
            repository_id=args.repository_name,
            location=args.location,
            format="DOCKER",
            description="trainstack trainer images",
            docker_config=gcp.artifactregistry.RepositoryDockerConfigArgs(immutable_tags=True),
            # INHERITED or DISABLED are the only values (the provider refuses anything
            # else): INHERITED scans pushed images whenever the project has the Container
            # Scanning API (containerscanning.googleapis.com, billed per image) on. The stack
            # does not turn that API on for the user.
            vulnerability_scanning_config=gcp.artifactregistry.RepositoryVulnerabilityScanningConfigArgs(
                enablement_config="INHERITED",
            ),
            # KEEP wins over DELETE: every version is a deletion candidate except the newest N.
            cleanup_policy_dry_run=False,
            cleanup_policies=[
                gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                    id="keep-newest",
                    action="KEEP",
                    most_recent_versions=gcp.artifactregistry.RepositoryCleanupPolicyMostRecentVersionsArgs(
                        keep_count=args.keep_images,
                    ),
                ),
                gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                    id="delete-older",
                    action="DELETE",
                    condition=gcp.artifactregistry.RepositoryCleanupPolicyConditionArgs(tag_state="ANY"),
                ),
            ],
            labels=args.labels,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.url = pulumi.Output.concat(
            args.location, "-docker.pkg.dev/", args.gcp_project, "/", self.repository.repository_id,
            f"/{IMAGE_NAME}",
        )
        self.register_outputs({"url": self.url})
