"""The boot scripts speak the run folder's contract (`runfolder/layout.py`) with the same names.

The scripts cannot import Python, so `lib.sh` holds a copy of each name the machine uses.
These tests source `lib.sh` in bash and compare every copy with the layout, and read
every script to check that no run-folder name, marker or trainer exit code is spelled
by hand outside that block (a typo there would be a file nobody reads).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from components.userdata import FILES, USERDATA_DIR
from runfolder import exits, layout

# lib.sh variable -> the layout's value (the same name in both, so a reader finds one from the other).
SCALARS = ("CACHE_PREFIX", "PIP_CACHE_DIR", "EVENTS_KEY", "PROGRESS_KEY", "CHECKPOINTS_PREFIX", "CHECKPOINT_DIR", "COMMITTED", "DEADLINE_KEY", "LOGS_PREFIX", "MACHINE_EVENTS_PREFIX", "STOP_KEY", "RENDEZVOUS_PREFIX",
           "COMPLETE", "FAILED", "TIMED_OUT", "CANCELLED", "MARKER_STEP", "MARKER_ATTEMPTS", "MARKER_REASON",
           "EVENT", "TIME", "FAILED_EVENT", "SPOT_NOTICE", "REBALANCE", "MACHINE_FINISH", "MACHINE_SCALE_FAILED", "MACHINE_STALLED",
           "WAITING_FOR_MACHINES")
# lib.sh's EXIT_<NAME> -> runfolder.exits.<NAME>: the trainer's exit codes the supervisor acts on.
EXITS = ("OK", "FAILED", "NO_CLUSTER", "PEER_LOST", "LEASE_HELD", "UNUSABLE", "PREEMPTED")
SCRIPTS = [name for name, _path, _mode in FILES if name.endswith(".sh")]


def _lib_values() -> dict[str, str]:
    names = " ".join(SCALARS + tuple(f"EXIT_{name}" for name in EXITS))
    script = (f'. "{USERDATA_DIR / "lib.sh"}"; for n in {names}; do printf "%s=%s\\n" "$n" "${{!n}}"; done; '
              'printf "END_MARKERS=%s\\n" "${END_MARKERS[*]}"')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_lib_sh_names_equal_the_layout():
    values = _lib_values()
    compared = []
    for name in SCALARS:
        assert values[name] == str(getattr(layout, name)), name
        compared.append(name)
    for name in EXITS:
        assert values[f"EXIT_{name}"] == str(getattr(exits, name)), f"EXIT_{name}"
        compared.append(name)
    assert values["END_MARKERS"].split() == list(layout.END_MARKERS)
    assert len(compared) == len(SCALARS) + len(EXITS) == len(SCALARS) + len(vars(exits)) - sum(
        n.startswith("_") or n == "annotations" for n in vars(exits))


def test_the_machine_events_object_is_the_layouts():
    script = (f'. "{USERDATA_DIR / "lib.sh"}"; RUN_URI=s3://b/runs/r; instance_id() {{ echo i-0abc; }}; '
              'machine_events_uri')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.strip() == "s3://b/runs/r/" + layout.machine_events_key("i-0abc")


PIP_CACHE = USERDATA_DIR.parent / "trainer" / "pip_cache.sh"  # sourced from the code archive


def test_the_package_cache_is_the_layouts():
    script = f'. "{USERDATA_DIR / "lib.sh"}"; . "{PIP_CACHE}"; RUN_URI=gs://b/runs/r; pip_cache_uri 0123abcd'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.strip() + "/" == "gs://b/" + layout.pip_cache_prefix("0123abcd")


def test_the_package_cache_script_passes_shellcheck_and_spells_no_name():
    # Not in the user data (FILES): it travels in the code archive, so it is checked here.
    proc = subprocess.run(["shellcheck", "-x", "--severity=style", str(PIP_CACHE)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout
    text = PIP_CACHE.read_text()
    assert "$COMMITTED" in text and "$CACHE_PREFIX" in text
    assert not re.search(r"(?<![$\w])(?:COMMITTED|cache/)", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))


def _code_lines(name: str) -> list[tuple[int, str]]:
    """The script's lines without comments, and without lib.sh's block of names."""
    lines = (USERDATA_DIR / name).read_text().splitlines()
    out, in_names = [], False
    for no, line in enumerate(lines, 1):
        if line.startswith("# ---- the run folder's names"):
            in_names = True
        elif in_names and line.startswith("EXIT_PREEMPTED="):
            in_names = False
            continue
        if in_names or line.lstrip().startswith("#"):
            continue
        out.append((no, line))
    return out


# Spelled by hand, each of these would bypass lib.sh's names: (pattern, what, scripts it applies to).
HAND_SPELLED = [
    (r"\$\{?RUN_URI\}?/[A-Za-z]", "a run-folder path built from a literal, not a name", None),
    (r"\b(?<![$])(?:COMPLETE|FAILED|TIMED_OUT|CANCELLED)\b(?!=)", "an end marker spelled out", None),
    (r"(?<![\w-])(?:events\.jsonl|progress\.json|machine-events)", "a run-folder key spelled out", None),
    # The supervisor's `rc` is the trainer's exit status (elsewhere `rc` is a command's own).
    (r"\(\(\s*rc\s*==\s*\d", "a trainer exit code spelled out", {"supervise.sh"}),
]


def hand_spelled(name: str) -> tuple[list[str], int]:
    """Lines of the script that spell a name by hand, and how many checks ran."""
    found, checked = [], 0
    for no, line in _code_lines(name):
        # Log messages may name a marker in prose; a variable reference is the name itself.
        code = re.sub(r'\blog "[^"]*"', "", line)
        bare = re.sub(r'\$\{?[A-Z_]+\}?', "", code)
        for pattern, what, scripts in HAND_SPELLED:
            if scripts is not None and name not in scripts:
                continue
            checked += 1
            if re.search(pattern, code if "RUN_URI" in pattern else bare):
                found.append(f"{name}:{no}: {what}: {line.strip()}")
    return found, checked


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_script_spells_a_run_folder_name_by_hand(name):
    found, checked = hand_spelled(name)
    assert checked > 0
    assert found == []


def test_the_check_finds_a_hand_spelled_name(tmp_path, monkeypatch):
    # The check above is only worth having if it fails on the old spelling.
    (tmp_path / "supervise.sh").write_text(
        'grep -qx COMPLETE <<<"$entries" && finish COMPLETE\n'
        'DEADLINE="$(store_cat "$RUN_URI/deadline")"\n'
        'log "run is COMPLETE"\n'  # prose in a log message is allowed
        'if ((rc == 143)); then continue; fi\n'
        'store_cat "$RUN_URI/$EVENTS_KEY"\n')  # a name: allowed
    monkeypatch.setattr("tests.userdata.test_layout_names.USERDATA_DIR", tmp_path)
    found, _checked = hand_spelled("supervise.sh")
    assert [line.split(": ")[1] for line in found] == [
        "an end marker spelled out", "a run-folder path built from a literal, not a name",
        "a trainer exit code spelled out"]
