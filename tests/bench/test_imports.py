"""`bench/` and `devtools/` stand apart from the test suite: neither imports `tests`, and
`devtools/` (which `bench/` starts its stand-ins from) imports neither pytest nor `bench`.

Read from the source (every `import` and `from … import`, at any depth, in a function too), so
a lazy import inside a benchmark's `run()` counts as much as one at the top.
"""

from __future__ import annotations

import ast

import pytest

from tests.trainer.helpers import REPO

# Each folder, and the top-level packages its code may not import.
FORBIDDEN = {"bench": {"tests"}, "devtools": {"tests", "bench", "pytest", "_pytest"}}


def imported_packages(source: str) -> set[str]:
    """The top-level names of every absolute module a source imports."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_imported_packages_sees_every_form_of_import():
    source = ("import tests.fixtures.emulators\nfrom tests import helpers\n"
              "def run():\n    from pytest import fail\n    import bench.report as r\n"
              "from . import sibling\n")
    assert imported_packages(source) == {"tests", "pytest", "bench"}


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_the_folder_imports_none_of_the_suite(folder):
    files = sorted((REPO / folder).rglob("*.py"))
    assert len(files) >= 5, f"{folder}/ has {len(files)} Python files: the walk found the wrong folder"
    bad = {str(f.relative_to(REPO)): sorted(imported_packages(f.read_text()) & FORBIDDEN[folder]) for f in files}
    assert {f: names for f, names in bad.items() if names} == {}
