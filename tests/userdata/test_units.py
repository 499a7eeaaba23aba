"""Every systemd unit the machines get passes `systemd-analyze verify` with nothing to say.

systemd skips what it does not understand with a warning and starts the unit anyway
("Unknown key 'StartLimitIntervalSec' in section [Service], ignoring.": the trainer unit's
restart limit was ignored that way), and `verify` still exits 0 for it. So the test
asserts on the output, not only the exit status. The units are verified in a temp root
(`--root`) that holds the shipped scripts at their paths (verify checks that `ExecStart=`
is executable) and this machine's own system units (the targets a service depends on).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from components.userdata import FILES, JUPYTER_FILES, shipped

UNITS = [(name, path) for name, path, _m in FILES + JUPYTER_FILES if name.endswith(".service")]
SYSTEM_UNITS = Path("/lib/systemd/system")


@pytest.fixture(scope="module")
def machine_root(tmp_path_factory) -> Path:
    """A root with every shipped file at its path and the host's system units."""
    if not shutil.which("systemd-analyze") or not SYSTEM_UNITS.is_dir():
        pytest.fail("systemd-analyze is missing: .ci/setup installs it (Debian package systemd)")
    root = tmp_path_factory.mktemp("machine")
    for name, path, mode in FILES + JUPYTER_FILES:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(shipped(name))
        target.chmod(int(mode, 8))
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    return root


def _verify(root: Path, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no", f"--root={root}", path],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("name", "path"), UNITS, ids=[n for n, _p in UNITS])
def test_shipped_unit_passes_systemd_analyze_verify(machine_root, name, path):
    proc = _verify(machine_root, path)
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stdout + proc.stderr


def test_verify_reports_a_key_in_the_wrong_section(machine_root, tmp_path):
    # The guard itself: the trainer unit as it was (the start limit in [Service]) is caught.
    name, path = next((n, p) for n, p in UNITS if n == "trainstack-trainer.service")
    unit = machine_root / path.lstrip("/")
    good = unit.read_text()
    try:
        unit.write_text(good.replace("\n[Service]\n", "\n[Service]\nStartLimitIntervalSec=3600\n"))
        proc = _verify(machine_root, path)
    finally:
        unit.write_text(good)
    assert "Unknown key 'StartLimitIntervalSec' in section [Service]" in proc.stdout + proc.stderr
    unit_section = good.split("\n[Service]\n")[0]
    assert "\nStartLimitIntervalSec=" in unit_section and "\nStartLimitBurst=" in unit_section


def test_the_trainer_unit_powers_off_past_its_start_limit_instead_of_idling(machine_root):
    # A supervisor that keeps crashing outside finish.sh must not leave a paid machine
    # idle until the runtime cap: systemd powers it off once the start limit is hit.
    name, path = next((n, p) for n, p in UNITS if n == "trainstack-trainer.service")
    text = (machine_root / path.lstrip("/")).read_text()
    unit = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line
        elif "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            unit[(section, k)] = v
    assert unit[("[Unit]", "StartLimitAction")] == "poweroff"
    assert int(unit[("[Unit]", "StartLimitBurst")]) >= 1 and unit[("[Service]", "Restart")] == "on-failure"
