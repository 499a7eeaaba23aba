"""Every `TRAINSTACK_*` variable is named once, in `runfolder/environment.py`, and both sides keep to it.

The Python side imports the table: no module of the stack, the trainer, the controller or `ops`
spells a variable's name as a string of its own. The boot scripts cannot import Python, so, as for
the run folder's and the machine's names (test_layout_names.py, test_machine_names.py), these
tests read them: every variable they use is one of the table's, each env-file key they are said to
read is read, and what they hand the trainer's container is something the trainer reads.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from components.userdata import FEDERATION_FILES, FILES, JUPYTER_FILES, USERDATA_DIR
from runfolder import environment
from trainer.config import env_variables

ROOT = Path(__file__).resolve().parents[2]
# The packages that import the table (bench/, devtools/ and tests/ set variables as a user or a sandbox would).
IMPORTERS = ("__main__.py", "components", "controller", "ops", "runfolder", "trainer")
TABLE = ROOT / "runfolder" / "environment.py"
NAME = re.compile(r"TRAINSTACK_[A-Z0-9_]*")
# A variable's name in a script (`TRAINSTACK_*` in prose is not one).
SCRIPT_NAME = re.compile(r"TRAINSTACK_[A-Z0-9_]*[A-Z0-9]")

# Every script a machine runs: the user data's files, the boot archive's (components/code.py), the pip cache's.
SCRIPTS = sorted({USERDATA_DIR / name for name, _path, _mode in
                  FILES + JUPYTER_FILES + tuple(f for files in FEDERATION_FILES.values() for f in files)}
                 | set(USERDATA_DIR.glob("*.sh")) | {ROOT / "trainer" / "pip_cache.sh"})


def table_names() -> set[str]:
    """Every name the table defines (its constants and the scripts' own settings)."""
    return {v for k, v in vars(environment).items() if k.isupper() and isinstance(v, str) and k != "PREFIX"} \
        | set(environment.MACHINE_SETTINGS)


def spelled_by_hand(source: str, where: str) -> list[str]:
    """The string constants in Python source that are a variable's whole name (a prefix included)."""
    found = [(node.lineno, node.value) for node in ast.walk(ast.parse(source, where))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)]
    return [f"{where}:{line}: {value}" for line, value in sorted(found)]


def test_each_option_in_the_table_is_an_option_of_the_trainer():
    trainer_reads = env_variables()
    unknown = [name for name in environment.OPTIONS if name not in trainer_reads]
    assert unknown == [], f"the table names options the trainer's parser lacks: {unknown}"
    assert {environment.EXTRA_ARGS, environment.COMMAND, environment.RUN_URI, environment.STOP_GRACE_S} <= trainer_reads
    assert environment.option_env("no_such_option") not in trainer_reads  # the check can fail
    assert environment.option_env("--batch-size") == environment.BATCH_SIZE == "TRAINSTACK_BATCH_SIZE"


def test_no_python_module_spells_a_variable_by_hand():
    found, read = [], 0
    for package in IMPORTERS:
        path = ROOT / package
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            if file == TABLE or "__pycache__" in file.parts:
                continue
            found += spelled_by_hand(file.read_text(), str(file.relative_to(ROOT)))
            read += 1
    assert read > 50
    assert found == [], "import the name from runfolder/environment.py instead: " + "; ".join(found)


def test_the_check_finds_a_hand_spelled_name():
    source = ('import os\n'
              'seed = os.environ.get("TRAINSTACK_SEED")\n'
              'prefix = "TRAINSTACK_"\n'
              'message = "set TRAINSTACK_SEED to a number"\n'  # prose in a message: allowed
              'from runfolder import environment\n'
              'ok = os.environ.get(environment.SEED)\n')
    assert spelled_by_hand(source, "x.py") == ["x.py:2: TRAINSTACK_SEED", "x.py:3: TRAINSTACK_"]


def _script_names() -> dict[str, set[str]]:
    """Each variable the scripts name -> the scripts naming it."""
    names: dict[str, set[str]] = {}
    for script in SCRIPTS:
        for name in SCRIPT_NAME.findall(script.read_text()):
            names.setdefault(name, set()).add(script.name)
    return names


def test_every_variable_a_script_names_is_in_the_table():
    names = _script_names()
    assert len(names) > 30 and environment.RUN_URI in names  # the scripts were read
    unknown = {name: sorted(where) for name, where in names.items() if name not in table_names()}
    assert unknown == {}, "add each to runfolder/environment.py (a key of the env file, or MACHINE_SETTINGS " \
        f"with its default in the script), or fix its spelling: {unknown}"


def test_the_scripts_read_every_env_file_key_they_are_said_to():
    names = _script_names()
    missing = [name for name in environment.SCRIPT_KEYS if name not in names]
    assert missing == [], f"SCRIPT_KEYS that no boot script reads (renamed on one side?): {missing}"


def test_each_machine_setting_has_its_default_in_a_script():
    text = "\n".join(script.read_text() for script in SCRIPTS)
    without = sorted(name for name in environment.MACHINE_SETTINGS if "${" + name + ":-" not in text)
    assert without == [], f"MACHINE_SETTINGS that no script reads with a default (gone, or renamed): {without}"
    assert "${TRAINSTACK_NO_SUCH_S:-" not in text


def test_what_the_supervisor_hands_the_container_is_read_by_the_trainer():
    text = (USERDATA_DIR / "supervise.sh").read_text()
    handed = re.findall(r"(TRAINSTACK_[A-Z0-9_]+)=", "\n".join(
        line for line in text.splitlines() if "CONTAINER_ENV" in line and not line.lstrip().startswith("#")))
    assert environment.DATA_DIR in handed and environment.MACHINE_ID in handed
    unread = sorted(set(handed) - env_variables() - {environment.MACHINE_ID})
    assert unread == [], f"supervise.sh hands the container variables the trainer never reads: {unread}"


def test_the_machine_env_file_keys_are_the_tables():
    from components.userdata import BOOT_ENV_KEYS

    assert BOOT_ENV_KEYS is environment.BOOT_KEYS
    assert set(environment.SCRIPT_KEYS) <= table_names() and set(environment.BOOT_KEYS) <= table_names()
