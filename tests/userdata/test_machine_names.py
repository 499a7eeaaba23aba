"""The boot scripts use the machine's names (`components/machine.py`) with the same values.

As with the run folder's names (test_layout_names.py): the scripts cannot import Python,
so `lib.sh` holds a copy of each. These tests source `lib.sh` in bash and compare every
copy with `components/machine.py`, and read every script to check that none spells a
unit, a machine folder, the Jupyter port or the worker port by hand.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from components import machine
from components.userdata import FILES, JUPYTER_FILES, USERDATA_DIR

# lib.sh variable -> its value in components/machine.py.
COPIES = {
    "ENV_FILE": machine.ENV_FILE,
    "STATE_DIR": machine.STATE_DIR,
    "RUNTIME_DIR": machine.RUNTIME_DIR,
    "LOG_DIR": machine.LOG_DIR,
    "OPT_DIR": machine.OPT_DIR,
    "BIN_DIR": machine.BIN_DIR,
    "CONTAINER": machine.CONTAINER,
    "TRAINER_UNIT": machine.TRAINER_UNIT,
    "WATCHER_UNIT": machine.WATCHER_UNIT,
    "JUPYTER_PORT": str(machine.JUPYTER_PORT),
    "JUPYTER_TOKEN_FILE": machine.JUPYTER_TOKEN_FILE,
    "WORKER_PORT_DEFAULT": str(machine.WORKER_PORT),
}
SCRIPTS = [name for name, _path, _mode in FILES + JUPYTER_FILES if name.endswith(".sh")]
# Spelled by hand, each of these would bypass lib.sh's copy.
HAND_SPELLED = [
    (r"\b8888\b", "the Jupyter port"),
    (r"\b2222\b", "the worker port"),
    (r"trainstack-(?:trainer|watcher|jupyter)\.service", "a unit name"),
    (r"(?<![\w$}])/(?:etc|var/lib|run|var/log)/trainstack\b", "a machine folder"),
]


def test_lib_sh_copies_equal_the_machine_names():
    names = " ".join(COPIES)
    script = f'unset TRAINSTACK_ROOT TRAINSTACK_ENV_FILE; . "{USERDATA_DIR / "lib.sh"}"; ' \
             f'for n in {names}; do printf "%s=%s\\n" "$n" "${{!n}}"; done'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout
    values = dict(line.split("=", 1) for line in out.splitlines())
    assert values == COPIES


def test_the_machines_units_are_the_files_installed():
    installed = {name for name, _path, _mode in FILES + JUPYTER_FILES}
    assert {machine.TRAINER_UNIT, machine.WATCHER_UNIT, machine.JUPYTER_UNIT} <= installed
    assert all((USERDATA_DIR / name).is_file() for name in installed)
    assert machine.WORKER_PORTS[0] <= machine.WORKER_PORT <= machine.WORKER_PORTS[1]


def hand_spelled(text: str, name: str) -> list[str]:
    """Lines of a script that spell a machine name by hand (comments and lib.sh's copies aside)."""
    copy = re.compile("(" + "|".join(COPIES) + ")=")
    found = []
    for no, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#") or (name == "lib.sh" and copy.match(line)):
            continue
        code = line.split(" #", 1)[0]
        found += [f"{name}:{no}: {what}: {line.strip()}" for pattern, what in HAND_SPELLED if re.search(pattern, code)]
    return found


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_script_spells_a_machine_name_by_hand(name):
    assert hand_spelled((USERDATA_DIR / name).read_text(), name) == []


def test_the_check_finds_a_hand_spelled_name():
    # Worth having only if it fails on the old spellings.
    old = ('journalctl -u trainstack-trainer.service\n'
           '  --ip=127.0.0.1 --port=8888\n'
           'WORKER_PORT="${TRAINSTACK_WORKER_PORT:-2222}"\n'
           'LOG="$ROOT/var/log/trainstack/x"\n'  # under $ROOT: a sandboxed copy of lib.sh's
           'DIR=/run/trainstack/jupyter\n'
           '# a comment may say /run/trainstack and 8888\n')
    assert [line.split(": ")[1] for line in hand_spelled(old, "finish.sh")] == [
        "a unit name", "the Jupyter port", "the worker port", "a machine folder"]
