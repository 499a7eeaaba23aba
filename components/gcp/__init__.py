"""The GCP training stack: bucket, service account, image repository, trainer code and image, spot group.

The same names, with the same constructor signatures, as components.aws
(tests/components/test_cloud_mirror.py); `__main__.py` picks the package by the stack's cloud.
"""

from components.gcp.bucket import TrainingBucket, TrainingBucketArgs
from components.gcp.code import TrainerCode, TrainerCodeArgs
from components.gcp.group import SpotGroup, SpotGroupArgs
from components.gcp.identity import InstanceIdentity, InstanceIdentityArgs
from components.gcp.image import TrainerImage, TrainerImageArgs
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
    "TrainerImage",
    "TrainerImageArgs",
    "TrainingBucket",
    "TrainingBucketArgs",
    "TrainingStack",
    "TrainingStackArgs",
]
