"""Shared pytest setup: the emulator fixtures live in tests/fixtures/ and load for every test."""

pytest_plugins = ["tests.fixtures.emulators", "tests.fixtures.sshd"]
