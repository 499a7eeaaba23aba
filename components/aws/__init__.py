"""The AWS training stack: bucket, identity, image repository, trainer code and image, spot group.

The same names, with the same constructor signatures, as components.gcp
(tests/components/test_cloud_mirror.py); `__main__.py` picks the package by the stack's cloud.

Each name is imported from its module on first use (PEP 562), so the Pulumi-free modules
here (`naming.py`, which `ops preflight` reads) load without the cloud's provider package.
"""

from __future__ import annotations

import importlib

# The module under this package that defines each exported name.
_MODULE_OF = {
    "TrainingBucket": "bucket",
    "TrainingBucketArgs": "bucket",
    "TrainerCode": "code",
    "TrainerCodeArgs": "code",
    "SpotGroup": "group",
    "SpotGroupArgs": "group",
    "InstanceIdentity": "identity",
    "InstanceIdentityArgs": "identity",
    "TrainerImage": "image",
    "TrainerImageArgs": "image",
    "ImageRepository": "repository",
    "ImageRepositoryArgs": "repository",
    "TrainingStack": "stack",
    "TrainingStackArgs": "stack",
}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
