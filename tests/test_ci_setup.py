"""`.ci/setup` run twice: the second run starts no pip while the requirement files are as they were
installed from, and a changed requirement file (or a fresh environment) installs again.

The environments' interpreters are stand-ins that record each call and answer as pip does when
everything is installed, so the test costs two bash runs, not pip's (3-12 s a run).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEBS = ("cloud-init", "shellcheck", "openssh-server", "openssh-client", "curl", "systemd", "chromium",
        "chromium-driver")
# The interpreter's stand-in: its version, and pip's answers once everything is installed.
PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls"
case "$*" in
  -VV) echo "Python 3.11.2 (stand-in)" ;;
  "-m pip check") echo "No broken requirements found." ;;
esac
"""


def _installed(deb: str) -> bool:
    got = subprocess.run(["dpkg-query", "-W", "-f=${Status}", deb], capture_output=True, text=True)
    return "install ok installed" in got.stdout


@pytest.fixture
def checkout(tmp_path):
    if not shutil.which("dpkg-query") or not all(_installed(d) for d in DEBS):
        pytest.skip("the set-up's Debian packages are not all installed here (it would install them)")
    root = tmp_path / "checkout"
    (root / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "setup", root / ".ci" / "setup")
    for rel in ("requirements.txt", "requirements-dev.txt", "trainer/requirements.txt",
                "trainer/requirements-keras2.txt", "policy/requirements.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    for venv in (".venv", ".venv-policy"):
        python = root / venv / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(PYTHON)
        python.chmod(0o755)
    return root


def _setup(root: Path) -> dict[str, list[str]]:
    """Run the set-up; the pip calls each environment got."""
    for venv in (".venv", ".venv-policy"):
        (root / venv / "calls").write_text("")
    got = subprocess.run(["bash", ".ci/setup"], cwd=root, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.endswith("setup done: . .venv/bin/activate\n")
    return {venv: [c for c in (root / venv / "calls").read_text().splitlines() if c.startswith("-m pip")]
            for venv in (".venv", ".venv-policy")}


def test_a_second_setup_starts_no_pip_until_a_requirement_changes(checkout):
    first = _setup(checkout)
    assert first[".venv"][:2] == ["-m pip install -q --upgrade pip==25.3", "-m pip install -q -r requirements-dev.txt"]
    assert first[".venv"][-1] == "-m pip check" and first[".venv-policy"][-1] == "-m pip check"
    assert _setup(checkout) == {".venv": [], ".venv-policy": []}
    with (checkout / "trainer" / "requirements.txt").open("a") as f:
        f.write("# a changed pin\n")
    assert _setup(checkout) == {".venv": first[".venv"], ".venv-policy": []}
    (checkout / ".venv-policy" / ".setup-stamp").unlink()  # as a fresh environment has none
    assert _setup(checkout) == {".venv": [], ".venv-policy": first[".venv-policy"]}
