"""Fixtures for the controller's tests: two placements' groups on moto_server behind the gate that
plays a region without capacity (tests/fixtures/no_capacity.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from controller.config import Config
from tests.controller.helpers import REGIONS, aws_config, make_group
from tests.fixtures.emulators import Run
from tests.fixtures.faultproxy import FaultProxy
from tests.fixtures.no_capacity import NoCapacity


@dataclass
class Placements:
    """A run on S3, its two placements' groups (home at ``nodes``, the other at zero), the gate."""

    run: Run
    config: Config
    proxy: FaultProxy
    gate: NoCapacity

    def no_capacity_at_home(self, message: str, now: float) -> None:
        self.gate.cannot_launch(REGIONS[0], self.config.placements[0].group, message, now=now)


@pytest.fixture
def placements(s3_run, moto_server, monkeypatch) -> Iterator[Placements]:
    with FaultProxy(moto_server) as proxy:
        proxy.gate = NoCapacity(moto_server)
        groups = [make_group(REGIONS[0], 1), make_group(REGIONS[1], 0)]
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        s3_run.vars["AWS_ENDPOINT_URL"] = proxy.url
        yield Placements(s3_run, aws_config(s3_run.uri, groups), proxy, proxy.gate)
