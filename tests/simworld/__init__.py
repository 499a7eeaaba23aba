"""Tests of the simulated world that ships: the replay of a price trace."""
