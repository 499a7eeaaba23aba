"""A pytest plugin for the mutation run: leave out tests that need the S3 or GCS emulator.

The code under mutation (the checkpoint store, the lease, key checks) is one code path over
every store; the `file://` cases exercise it in milliseconds, the emulators in seconds.
"""

from __future__ import annotations

EMULATORS = {"moto_server", "gcs_emulator"}


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        (drop if EMULATORS & set(getattr(item, "fixturenames", ())) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
