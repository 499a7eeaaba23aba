"""Shared pytest setup: the emulator fixtures live in tests/fixtures/ and load for every test.

Property tests (hypothesis) run under one registered profile: derandomized, so a run on CI
tries the same examples as a run on a laptop and a failure reproduces, with a modest example
count (CI has 2 cores) and no deadline (a loaded machine must not fail a test on its speed).
`HYPOTHESIS_PROFILE=thorough` tries more examples, by hand.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["tests.fixtures.emulators", "tests.fixtures.sshd", "tests.fixtures.service_models", "tests.fixtures.collector"]

# TensorFlow's thread pools at one thread each in every process the tests start (the workers, their trainers,
# fit scripts and servers inherit it): four workers on CI's two cores run several TensorFlow processes at
# once, and each one's default pools (a thread per core) only contend for the same two cores. Measured on
# the trainer's heaviest tests (chaos, data state, metrics, models: three pairs alternated), 8-10 % less
# CPU and 6-11 % less time; the multi-worker tests' collectives pass with one inter-op thread too.
# The trainer on a machine, the bench and a laptop's runs keep TensorFlow's defaults (tests/README.md).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

settings.register_profile(
    "ci", derandomize=True, max_examples=50, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", parent=settings.get_profile("ci"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under `pytest -n` (pytest-xdist, `--dist loadgroup`), a module whose tests share a
    module-scoped fixture (one trained run, one synthesized stack) runs on one worker, so the
    fixture is built once; every other test is handed to whichever worker is free."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = any(
            d.scope in ("module", "class", "package")
            for defs in info.name2fixturedefs.values() for d in defs
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    # The longest scenarios start first, then the other modules with slow scenarios, so no
    # long test begins last and leaves one worker running alone at the end. Each module's
    # tests stay together and in their order (its module-scoped fixtures are built once).
    # xdist hands out its groups of several tests first (largest first: `--loadscope-reorder`),
    # then single tests in this order.
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (_LONGEST.get(item.module.__name__, len(_LONGEST)),
                                 item.module.__name__ not in slow_modules))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """Give xdist's groups to the ids it sends its scheduler. pytest-xdist 3.8 marks a test's
    group by appending `@<group>` to `item._nodeid`, which pytest 9.2 no longer reads (the id
    is `item._id`, pytest-dev/pytest-xdist#1386): without this every grouped module's tests
    were spread over all workers and each worker built the module's fixtures again."""
    from _pytest.nodeid import NodeId

    for item in session.items:
        grouped = item.__dict__.get("_nodeid")
        if isinstance(grouped, str) and grouped != item.nodeid and hasattr(item, "_id"):
            item._id = NodeId.parse(grouped)


# The modules of the longest tests by the clock in `.ci/run`'s `--durations` (2 cores, four
# workers: 80 to 160 s each), longest first. Before this list xdist handed the trainer and
# boot ones out as work units 679 to 879 of 2,655 (the bench and the month came early by
# their names); now all of them are units 11 to 40.
_LONGEST = {name: rank for rank, name in enumerate((
    "tests.userdata.test_cluster_scenarios",  # 160 s and 143 s
    "tests.trainer.test_resume_faults",  # 146 s
    "tests.bench.test_quick",  # 143 s
    "tests.components.test_a_month",  # 135 s a cloud
    "tests.trainer.test_chaos",  # 105 s and 80 s
    "tests.trainer.test_fit",  # 90 s
    "tests.userdata.test_boot_user_code",  # 84 s
    "tests.trainer.test_cluster",  # 72 s
    "tests.userdata.test_cross_cloud_move",  # 81 s alone at load 5, 166 s at load 9 (not yet in `.ci/run`)
    "tests.userdata.test_placement_move",  # 72 s
))}
