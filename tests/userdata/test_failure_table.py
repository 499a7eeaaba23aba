"""docs/boot.md's table of every way a machine ends or waits stays true to the tests.

Each row names the sandbox test that proves it; a renamed or deleted test, or a row whose
only bound is the run's deadline on a machine that is not training, fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = "## Every way a machine ends or waits"


def _rows() -> list[list[str]]:
    text = (ROOT / "docs/boot.md").read_text()
    section = text.split(HEADER, 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| where")]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines]


def _test_names() -> set[str]:
    names = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(node.name)
    return names


def test_every_row_names_tests_that_exist():
    rows, known = _rows(), _test_names()
    assert len(rows) >= 20
    named = 0
    for where, condition, _does, _bound, tests in rows:
        cited = re.findall(r"`(test_\w+)`", tests)
        assert cited, f"{where}: {condition!r} names no test"
        missing = [t for t in cited if t not in known]
        assert not missing, f"{where}: {condition!r} names tests that do not exist: {missing}"
        named += len(cited)
    assert named >= len(rows)


def test_no_row_waits_for_the_deadline_unless_training():
    rows = _rows()
    checked = 0
    for where, condition, _does, bound, _tests in rows:
        if "deadline" in bound and "training" not in bound:
            # The deadline may come first, but the row must give its own bound too.
            assert re.search(r"\d+ ?(s|min|h)\b", bound), f"{where}: {condition!r} is bounded only by the deadline"
        checked += 1
    assert checked == len(rows) and any("training" in r[3] for r in rows)
