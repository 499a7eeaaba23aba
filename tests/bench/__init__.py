"""Tests of the bench: its arithmetic, its report, and a quick run of the command itself."""
