"""The GCP training stack: bucket, service account, image repository, trainer code and image, spot group.

The same names as components.aws, each imported from its module on first use (why:
components/lazy.py); `__main__.py` picks the package by the stack's cloud.
"""

from __future__ import annotations

from components.lazy import CLOUD_EXPORTS, exports

__all__, __getattr__, __dir__ = exports(__name__, CLOUD_EXPORTS)
