"""Where the project's own folders are: the root (the folder with ``Pulumi.yaml``) and the
folders under it that the program, ``ops`` and the tests read.

One definition for ``components/``, ``ops/`` and ``policy/``. It lives here, standard
library only, because ``components`` must not import ``ops`` while ``ops`` imports
``components``; the policy pack puts the root on ``sys.path`` before it can import this
(policy/__main__.py).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PULUMI_YAML = ROOT / "Pulumi.yaml"
PROGRAM = ROOT / "__main__.py"
STACKS_DIR = ROOT / "stacks"
TRAINER_DIR = ROOT / "trainer"
RUNFOLDER_DIR = ROOT / "runfolder"
USERDATA_DIR = ROOT / "userdata"
BUILD_DIR = ROOT / "build"
# The stack output holding the placement controller's configuration (JSON), which ops reads to move a run.
PLACEMENTS_OUTPUT = "placements"
