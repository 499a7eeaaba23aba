"""The wait between IAM grants and what needs them (components/propagation.py): the GCP controller's function
is built only after its build account's grants have had IAM_PROPAGATION_S to propagate, the wait sleeps on a
real `pulumi up` only (create, or its grants changed), and never under the mocks `ops synth` runs.

The sleep is the provider's own code called directly with `time.sleep` recorded; the engine's side (what
depends on what, and that the provider it records can be loaded again by Pulumi's dynamic provider host) is
read from `ops synth`.
"""

from __future__ import annotations

import base64
import threading
import time
from functools import cache

import dill
import pytest

from components import propagation
from ops import synth
from tests.components.test_placements import RAW

WAIT = "trainstack-controller-build-wait"
FUNCTION = "trainstack-controller-function"


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every time.sleep the wait makes, recorded instead of slept. Only this thread's: `time.sleep` is
    every thread's, and another's (a profiler's poll, a run's lease renewal left by an earlier test) is
    not the wait's."""
    calls: list[float] = []
    real, test = time.sleep, threading.get_ident()

    def sleep(seconds: float) -> None:
        if threading.get_ident() == test:
            calls.append(seconds)
        else:
            real(seconds)

    monkeypatch.setattr(propagation.time, "sleep", sleep)
    return calls


@cache
def synthesized() -> synth.Result:
    return synth.synthesize(RAW["gcp"], stack="places")


def test_the_function_waits_for_its_build_grants_to_propagate(slept: list[float]) -> None:
    r = synth.synthesize(RAW["gcp"], stack="places")
    wait, fn = r.named(WAIT), r.named(FUNCTION)
    assert wait["type"] == "pulumi-python:dynamic:Resource" and wait["parent"] == "trainstack-controller"
    assert wait["inputs"]["seconds"] == propagation.IAM_PROPAGATION_S >= 120  # Google's "about two minutes"
    build = {"trainstack-controller-build-logs", "trainstack-controller-build-image",
             "trainstack-controller-build-source", "trainstack-controller-build-staged-source"}
    # The wait comes after every grant of the build account, and its triggers are those grants' ids ...
    builder = r.named("trainstack-controller-build")["inputs"]["accountId"]
    assert {x["name"] for x in r.resources if builder in str(x["inputs"].get("member", ""))} == build
    assert set(wait["options"]["dependsOn"]) == build
    assert len(wait["inputs"]["triggers"]) == len(build)
    # ... and the function, whose build uses them, comes after the wait.
    assert WAIT in fn["options"]["dependsOn"]
    # Under the mocks the engine never calls the provider: nothing slept.
    assert slept == []


def test_the_recorded_provider_loads_again_and_sleeps_only_when_its_grants_are_new_or_changed(slept) -> None:
    wait = synthesized().named(WAIT)
    recorded = wait["inputs"]["__provider"]
    blob = recorded["value"] if isinstance(recorded, dict) else recorded  # a secret, as the SDK makes it
    provider = dill.loads(base64.b64decode(blob))  # what Pulumi's dynamic provider host does with it
    props = {"seconds": 180, "triggers": ["g1", "g2"]}
    created = provider.create(props)
    assert slept == [180.0] and created.outs == props and created.id
    # A refresh or a `pulumi up` with the same grants: no change, no sleep.
    assert provider.diff(created.id, props, dict(props)).changes is False
    # A grant replaced: the wait runs again, in place.
    changed = {**props, "triggers": ["g1", "g3"]}
    d = provider.diff(created.id, props, changed)
    assert d.changes is True and d.replaces == []
    assert provider.update(created.id, props, changed).outs == changed
    assert slept == [180.0, 180.0]
    # Only a new duration: recorded, not waited.
    provider.update(created.id, props, {**props, "seconds": 240})
    assert slept == [180.0, 180.0]
