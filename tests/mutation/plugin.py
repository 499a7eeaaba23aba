"""A pytest plugin for the mutation run: leave out tests that need the S3 or GCS emulator,
and tests that run the project's Python in a child process.

The code under mutation (the checkpoint store, the lease, key checks) is one code path over
every store; the `file://` cases exercise it in milliseconds, the emulators in seconds.
mutmut's call tracing cannot follow a child process (the child looks for mutmut's config in
its own working directory and fails), so those tests stay with the ordinary test run.
"""

from __future__ import annotations

import os
import sys

# mutmut runs each mutant's tests in a process forked from the one that ran them all first. A
# TensorFlow op that hands work to the runtime's thread pools (a softmax, any graph function)
# waits forever in such a fork: the pools' threads were not copied. With one thread each, TF runs
# eager ops inline; the tests of the trainer's modules run their `tf.function`s eagerly too.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

# Test modules whose Keras `fit` runs eagerly in a mutation run (`tf.config.run_functions_eagerly`):
# a graph `fit` waits forever in the fork even with one thread a pool, an eager one trains. The
# ordinary suite keeps the graph, which is faster.
EAGER_FIT = {"test_catch_fit.py"}

EMULATORS = {"moto_server", "gcs_emulator"}
# Parameters that pick a store through `request.getfixturevalue` (tests/fixtures/emulators.py).
CLOUD_STORES = {"s3", "gs"}
CHILD_PROCESS = {
    "test_watch_command_resolves_the_stack_with_pulumi_and_exits_1_on_failure",
    "test_the_commit_protocol_imports_no_tensorflow",
    "test_ops_synth_process_exits_2",
    "test_trainer_flags_are_read_without_tensorflow",
    "test_synth_exits_2_with_one_line_and_writes_nothing",
    # Pulumi's mock runtime (gRPC, asyncio) hangs in mutmut's forked workers: every mutant would
    # time out and count as killed whatever it changed.
    "test_the_output_renders_once_the_bucket_code_and_image_are_known",
}


def _left_out(item) -> bool:
    if getattr(item, "originalname", item.name) in CHILD_PROCESS:
        return True
    if EMULATORS & set(getattr(item, "fixturenames", ())):
        return True
    spec = getattr(item, "callspec", None)
    return spec is not None and any(isinstance(v, str) and v in CLOUD_STORES for v in spec.params.values())


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        (drop if _left_out(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_setup(item):
    tf = sys.modules.get("tensorflow")
    if tf is not None and item.path.name in EAGER_FIT:
        tf.config.run_functions_eagerly(True)


def pytest_runtest_teardown(item):
    tf = sys.modules.get("tensorflow")
    if tf is not None and item.path.name in EAGER_FIT:
        tf.config.run_functions_eagerly(False)
