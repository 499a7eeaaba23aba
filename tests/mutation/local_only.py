"""A pytest plugin for the mutation run: leave out tests that need the S3 or GCS emulator.

The code under mutation (the checkpoint store, the lease, key checks) is one code path over
every store; the `file://` cases exercise it in milliseconds, the emulators in seconds.
"""

from __future__ import annotations

EMULATORS = {"moto_server", "gcs_emulator"}
# Parameters that pick a store through `request.getfixturevalue` (tests/fixtures/emulators.py).
CLOUD_STORES = {"s3", "gs"}


def _needs_emulator(item) -> bool:
    if EMULATORS & set(getattr(item, "fixturenames", ())):
        return True
    spec = getattr(item, "callspec", None)
    return spec is not None and any(isinstance(v, str) and v in CLOUD_STORES for v in spec.params.values())


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        (drop if _needs_emulator(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
