"""Fixtures for the controller's tests: two placements' groups on moto_server behind the gate that
plays a region without capacity (tests/fixtures/no_capacity.py)."""

from tests.fixtures.no_capacity import placements  # noqa: F401 - a fixture, found by name
