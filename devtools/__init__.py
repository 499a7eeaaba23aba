"""Tools for working on trainstack that both the tests and the bench use; never shipped.

Not under `tests/` because `bench/` is no test and must not import the test suite (a test
module may import pytest, fixtures and test data the bench has no business loading); not in
`trainer/`, `ops/` or `components/` because the product never starts an emulator. Code
here imports neither pytest nor anything of `tests/` or `bench/`.
"""
