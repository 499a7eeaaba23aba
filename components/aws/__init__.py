"""The AWS training stack: bucket, identity, image repository, trainer code, spot group."""

from components.aws.bucket import TrainingBucket, TrainingBucketArgs
from components.aws.code import TrainerCode, TrainerCodeArgs
from components.aws.group import SpotGroup, SpotGroupArgs
from components.aws.identity import InstanceIdentity, InstanceIdentityArgs
from components.aws.repository import ImageRepository, ImageRepositoryArgs
from components.aws.stack import TrainingStack, TrainingStackArgs

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
