"""The suite's xdist grouping: a module whose tests share a module-scoped fixture runs on one
worker, so the fixture is built once (`tests/conftest.py`); the other tests go to any worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = "from tests.conftest import pytest_collection_finish, pytest_collection_modifyitems  # noqa: F401\n"

SHARED = '''
import json, os, pytest

@pytest.fixture(scope="module")
def built():
    with open(os.environ["GROUPS_LOG"], "a") as f:
        f.write(json.dumps({"built": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_shared(built, i):
    with open(os.environ["GROUPS_LOG"], "a") as f:
        f.write(json.dumps({"shared": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")
'''

ALONE = '''
import json, os, pytest

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    with open(os.environ["GROUPS_LOG"], "a") as f:
        f.write(json.dumps({"alone": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")
'''


def test_a_module_with_a_module_scoped_fixture_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_shared.py").write_text(SHARED)
    (tmp_path / "test_alone.py").write_text(ALONE)
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GROUPS_LOG": str(log)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    shared = {r["shared"] for r in rows if "shared" in r}
    built = [r["built"] for r in rows if "built" in r]
    assert len([r for r in rows if "shared" in r]) == 6 and len(shared) == 1, rows
    assert built == list(shared), rows
    assert len([r for r in rows if "alone" in r]) == 6
