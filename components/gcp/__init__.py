"""The GCP training stack: bucket, service account, image repository, trainer code and image, spot group.

The same names, with the same constructor signatures, as components.aws
(tests/components/test_cloud_mirror.py); `__main__.py` picks the package by the stack's cloud.

Each name is imported from its module on first use (components/lazy.py), so the
Pulumi-free modules here (`naming.py`, which `ops preflight` reads) load without the
cloud's provider package.
"""

from __future__ import annotations

from components.lazy import CLOUD_EXPORTS, exports

__all__, __getattr__, __dir__ = exports(__name__, CLOUD_EXPORTS)
