"""The trainer's start imports with the cyclic collector off, then freezes what the imports built.

In a child process (freezing is for the whole process: the test's own would keep its objects).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.helpers import REPO

PROBE = """
import gc, json, sys
from trainer.__main__ import imports_kept
if sys.argv[1] == "off":
    gc.disable()
frozen = gc.get_freeze_count()
with imports_kept():
    inside = gc.isenabled()
    import email.mime.multipart  # a package this process has not imported yet
print(json.dumps({"inside": inside, "after": gc.isenabled(), "frozen": gc.get_freeze_count() - frozen}))
"""


@pytest.mark.parametrize("before", ["on", "off"])
def test_the_imports_run_without_collections_and_stay_frozen(before):
    p = subprocess.run([sys.executable, "-c", PROBE, before], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["inside"] is False  # no collection while importing
    assert got["after"] is (before == "on")  # the collector as it was before
    assert got["frozen"] > 1000  # the imported objects moved to the permanent generation
