"""Tests of components/kubernetes/: the scheduler kubernetes room."""
