"""Shared pytest setup: the emulator fixtures live in tests/fixtures/ and load for every test.

Property tests (hypothesis) run under one registered profile: derandomized, so a run on CI
tries the same examples as a run on a laptop and a failure reproduces, with a modest example
count (CI has 2 cores) and no deadline (a loaded machine must not fail a test on its speed).
`HYPOTHESIS_PROFILE=thorough` tries more examples, by hand.
"""

import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["tests.fixtures.emulators", "tests.fixtures.sshd"]

settings.register_profile(
    "ci", derandomize=True, max_examples=50, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", parent=settings.get_profile("ci"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
