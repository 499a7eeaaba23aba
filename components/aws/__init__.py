"""The AWS training stack: bucket, identity, image repository, trainer code and image, spot group.

The same names, with the same constructor signatures, as components.gcp
(tests/components/test_cloud_mirror.py); `__main__.py` picks the package by the stack's cloud.
"""

from components.aws.bucket import TrainingBucket, TrainingBucketArgs
from components.aws.code import TrainerCode, TrainerCodeArgs
from components.aws.group import SpotGroup, SpotGroupArgs
from components.aws.identity import InstanceIdentity, InstanceIdentityArgs
from components.aws.image import TrainerImage, TrainerImageArgs
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
    "TrainerImage",
    "TrainerImageArgs",
    "TrainingBucket",
    "TrainingBucketArgs",
    "TrainingStack",
    "TrainingStackArgs",
]
