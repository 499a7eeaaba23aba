"""Lazy package exports (PEP 562): a package names what it exports and where each is
defined, and a name's module is imported on first use.

``components.aws`` and ``components.gcp`` export their components this way, so a
Pulumi-free module inside them (``naming.py``, which ``ops preflight`` reads) loads
without the cloud's provider package (seconds of start-up).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

# What components.aws and components.gcp each export, and the module of theirs that
# defines it: the same names from the same file names (tests/components/test_cloud_mirror.py).
CLOUD_EXPORTS = {
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
    "SigningKey": "signing_key",
    "SigningKeyArgs": "signing_key",
    "PlacementController": "controller",
    "PlacementControllerArgs": "controller",
    "TrainingStack": "stack",
    "TrainingStackArgs": "stack",
}


def exports(package: str, module_of: Mapping[str, str]) -> tuple[list[str], Callable, Callable]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``; ``module_of``: name -> its submodule."""
    names = sorted(module_of)

    def __getattr__(name: str):  # noqa: N807 - the module hook's own name
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module_of[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*vars(sys.modules[package]), *names})

    return names, __getattr__, __dir__
