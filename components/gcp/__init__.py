"""The GCP training stack: bucket, service account, image repository, trainer code, spot group."""

from components.gcp.bucket import TrainingBucket, TrainingBucketArgs
from components.gcp.code import TrainerCode, TrainerCodeArgs
from components.gcp.group import SpotGroup, SpotGroupArgs
from components.gcp.identity import InstanceIdentity, InstanceIdentityArgs
from components.gcp.repository import ImageRepository, ImageRepositoryArgs
from components.gcp.stack import TrainingStack, TrainingStackArgs

__all__ = [
    "ImageRepository",
    "ImageRepositoryArgs",
    "InstanceIdentity",
    "InstanceIdentityArgs",
    "SpotGroup",
    "SpotGroupArgs",
    "TrainerCode",
    "TrainerCodeArgs",
    "TrainingBucket",
    "TrainingBucketArgs",
    "TrainingStack",
    "TrainingStackArgs",
]
