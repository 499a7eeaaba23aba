"""The test process runs the cyclic collector at the thresholds `tests/fixtures/collector.py` sets."""

import gc

from tests.fixtures.collector import THRESHOLDS


def test_the_collector_runs_at_the_suites_thresholds():
    assert gc.get_threshold() == THRESHOLDS != (700, 10, 10)
    assert gc.isenabled()
