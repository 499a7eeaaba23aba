"""ImageRepository: the stack's private ECR repository for a trainer image.

Tags are immutable (a pinned tag can never move under a running job), every push is
scanned, layers are encrypted at rest, and a lifecycle policy keeps the last N images.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws


@dataclass(kw_only=True)
class ImageRepositoryArgs:
    """Inputs of an ImageRepository."""

    repository_name: str
    """The repository's name, e.g. trainstack/dev."""
    keep_images: int = 10
    """Images kept; older ones expire."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the repository."""


def lifecycle_policy(keep_images: int) -> str:
    """ECR lifecycle policy JSON that expires all but the newest `keep_images` images."""
    return json.dumps(
        {
            "rules": [
                {
                    "rulePriority": 1,
                    "description": f"keep the last {keep_images} images",
                    "selection": {
                        "tagStatus": "any",
                        "countType": "imageCountMoreThan",
                        "countNumber": keep_images,
                    },
                    "action": {"type": "expire"},
                }
            ]
        },
        sort_keys=True,
    )


class ImageRepository(pulumi.ComponentResource):
    """ECR repository with immutable tags, scan on push, encryption and a lifecycle."""

    repository: aws.ecr.Repository
    arn: pulumi.Output[str]
    url: pulumi.Output[str]
    registry_id: pulumi.Output[str]
    """The account id of the registry (what an ECR login token is asked for)."""

    def __init__(self, name: str, args: ImageRepositoryArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:ImageRepository", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.repository = aws.ecr.Repository(
            f"{name}-repo",
            name=args.repository_name,
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="AES256")],
            # Images are rebuilt from trainer/ at will; only the bucket holds data worth keeping.
            force_delete=True,
            tags=args.tags,
            opts=child,
        )
        aws.ecr.LifecyclePolicy(
            f"{name}-lifecycle",
            repository=self.repository.name,
            policy=lifecycle_policy(args.keep_images),
            opts=child,
        )
        self.arn = self.repository.arn
        self.url = self.repository.repository_url
        self.registry_id = self.repository.registry_id
        self.register_outputs({"arn": self.arn, "url": self.url, "registry_id": self.registry_id})
