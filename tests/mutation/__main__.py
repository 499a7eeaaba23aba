"""Mutation testing of the contract modules: `python -m tests.mutation [TARGET ...] [--list]`.

Each target (the run layout, the checkpoint store, the lease, storage keys and retries,
settings, the policy rules, the status classification, the user-data rendering, the placement
controller, the trainer's own modules, the operator's commands in ops/) runs `mutmut run
--max-children 1` in its own scratch copy of the working tree under `build/mutation/<target>/`,
mutating only its own files and running only the fast tests
that cover them (the `file://` backend where a test is parametrized over stores: the code
under test is the same for every store). Then it prints killed / total per target and
every mutant that was not killed, marking the ones `equivalent.txt` or `by_hand.txt` explains.

Too slow for every CI run (see tests/README.md for the time it takes); needs `mutmut`
from requirements-dev.txt. `mutmut show <name>` inside `build/mutation/<target>/` shows
a mutant's diff.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCRATCH = ROOT / "build" / "mutation"
# The packages a test may import: copied into mutmut's `mutants/` folder (only `mutate` is mutated).
SOURCES = ["trainer", "components", "ops", "policy", "runfolder", "controller"]
# What the tests read besides the packages (templates, stacks, examples, the pack's manifest).
ALSO_COPY = ["devtools", "userdata", "stacks", "examples", "bench", "docs", "Pulumi.yaml", "__main__.py", "README.md",
             "requirements.txt", "requirements-dev.txt"]
# mutmut's verdicts (its exit codes) that count as killed.
KILLED = {"killed", "timeout", "caught by type check", "segfault"}


@dataclass
class Target:
    """One contract module: the files to mutate and the tests that cover them."""

    mutate: list[str]
    tests: list[str]
    select: str = ""  # a -k expression
    # Leave out the tests that need the S3 or GCS emulator or a child process (tests/mutation/plugin.py).
    local_only: bool = True
    extra: list[str] = field(default_factory=list)


TARGETS: dict[str, Target] = {
    "layout": Target(
        ["runfolder/layout.py"],
        ["tests/runfolder/test_layout.py", "tests/trainer/test_keys_properties.py",
         "tests/trainer/test_end_marker_properties.py", "tests/userdata/test_layout_names.py"]),
    "checkpoints": Target(
        ["trainer/checkpoint_store.py", "runfolder/checkpoints.py"],
        ["tests/trainer/test_checkpoint_rules.py", "tests/trainer/test_checkpoint_store.py",
         "tests/trainer/test_checkpoint_retention.py"]),
    "lease": Target(
        ["runfolder/lease.py"], ["tests/runfolder/test_lease_rules.py", "tests/trainer/test_lease.py"],
        # Real-time twins of test_lease_rules.py's injected-clock cases (seconds each).
        select="not held_lease_is_waited_for and not nobody_renews_is_taken_over"),
    "storage": Target(
        ["runfolder/storage/keys.py", "runfolder/storage/retry.py"],
        ["tests/trainer/test_keys_properties.py", "tests/runfolder/test_storage.py",
         "tests/runfolder/test_storage_retry.py", "tests/runfolder/test_storage_keys.py"]),
    "settings": Target(
        ["components/settings/*.py"],
        ["tests/components/test_settings.py", "tests/components/test_settings_strict.py",
         "tests/components/test_settings_usercode.py", "tests/components/test_settings_command.py",
         "tests/components/test_settings_messages.py", "tests/components/test_settings_loading.py",
         "tests/components/test_settings_errors.py", "tests/components/test_settings_placements.py"],
        # Each invalid case's `ops synth` twin checks the same ConfigError line through the CLI: the
        # same verdict on the settings code, at twice the time.
        select="not test_ops_synth_exits_2_and_writes_nothing"),
    "policy": Target(
        ["policy/rules/*.py"],
        ["tests/policy/test_rules.py", "tests/policy/test_world_ingress_properties.py",
         "tests/policy/test_network_rules.py", "tests/policy/test_identity_rules.py",
         "tests/policy/test_bucket_rules.py", "tests/policy/test_tag_and_cost_rules.py",
         "tests/policy/test_machine_and_image_rules.py", "tests/policy/test_rule_context.py"],
        # The pack's manifest test compares paths of the checkout, not of mutmut's copy.
        select="not test_pack_manifest_points_at_its_own_virtualenv"),
    "runstate": Target(
        ["ops/runstate.py"],
        ["tests/ops/test_runstate.py", "tests/ops/test_runstate_details.py", "tests/ops/test_status_heartbeat.py",
         "tests/ops/test_status.py"]),
    "userdata": Target(
        ["components/userdata.py"],
        ["tests/userdata/test_render.py", "tests/userdata/test_env_file_properties.py",
         "tests/userdata/test_machine_names.py", "tests/userdata/test_jupyter.py",
         "tests/userdata/test_render_values.py",
         "tests/components/test_pricing.py::test_the_machines_get_a_price_per_machine_hour_that_the_trainer_records",
         "tests/components/test_pricing.py::test_no_recorded_price_gives_the_machines_none"],
        # shellcheck and cloud-init's schema take ~15 s a case and test the scripts, not the rendering.
        select="not shellcheck and not schema"),
    # The trainer's endings and the operator's listing: the in-process cases (the endings' `slow`
    # ones run a trainer as a child, which mutmut cannot follow).
    "export": Target(
        ["trainer/export.py"],
        ["tests/trainer/test_catch_endings.py", "tests/trainer/test_catch_export_model.py",
         "tests/trainer/test_events.py", "tests/runfolder/test_cost.py"],
        # The Keras export runs in this process (TensorFlow imported once); the script-mode endings do not.
        select="not after_two_preempted and not failed_and_cancelled"),
    "cost": Target(
        ["runfolder/cost.py"],
        ["tests/runfolder/test_cost.py", "tests/runfolder/test_catch_cost.py", "tests/trainer/test_catch_endings.py",
         "tests/ops/test_runs.py::test_runs_shows_each_runs_cost"],
        extra=["-m", "not slow"]),
    "events": Target(
        ["trainer/events.py", "runfolder/events.py"],
        ["tests/trainer/test_events.py", "tests/trainer/test_catch_events.py", "tests/trainer/test_catch_endings.py",
         "tests/runfolder/test_cost.py"],
        extra=["-m", "not slow"]),
    "runs": Target(
        ["ops/runs.py"], ["tests/ops/test_runs.py", "tests/ops/test_catch_runs.py", "tests/ops/test_catch_runs_commands.py"],
        extra=["-m", "not slow"]),
    # The placement controller: its pure decision, its ticks over a `file://` run folder with groups kept
    # in memory, the GCP groups' fake REST API, and the simulator's kept schedules (a fraction of a
    # second each); the simulator's long runs over the CI schedules stay with the ordinary test run.
    "controller": Target(
        ["controller/*.py"],
        ["tests/controller/test_decide.py", "tests/controller/test_catch_decide.py",
         "tests/controller/test_decide_properties.py", "tests/controller/test_control_plane.py",
         "tests/controller/test_tick.py", "tests/controller/test_record.py", "tests/controller/test_config.py",
         "tests/controller/test_handler.py", "tests/controller/test_gcp_groups.py", "tests/controller/test_sim.py",
         "tests/controller/test_catch_controller.py", "tests/controller/test_catch_record.py",
         "tests/controller/test_catch_clouds.py", "tests/controller/test_catch_grants_and_handler.py",
         "tests/controller/test_catch_config.py"],
        select="not every_invariant_holds_over_the_ci_schedules"),
    # The trainer's own modules, each through in-process tests of its functions (the trainer runs
    # of tests/trainer/test_stop.py, test_resume.py... are children, which mutmut cannot follow).
    "signals": Target(["trainer/signals.py"], ["tests/trainer/test_signals.py"]),
    "cadence": Target(["trainer/cadence.py"], ["tests/trainer/test_cadence.py"]),
    "data_state": Target(
        ["trainer/data_state.py"],
        ["tests/trainer/test_data_state_saves.py", "tests/trainer/test_data_state.py"], extra=["-m", "not slow"]),
    "metrics": Target(
        ["trainer/metrics.py"],
        ["tests/trainer/test_metric_states.py", "tests/trainer/test_catch_metrics.py", "tests/trainer/test_metrics.py"],
        extra=["-m", "not slow"]),
    "run_attempt": Target(
        ["trainer/run_attempt.py"],
        ["tests/trainer/test_run_attempt.py", "tests/trainer/test_end_marker_properties.py"], extra=["-m", "not slow"]),
    "loop_attempt": Target(["trainer/loop_attempt.py"], ["tests/trainer/test_loop_attempt.py"]),
    "loop": Target(["trainer/loop.py"], ["tests/trainer/test_loop_steps.py", "tests/trainer/test_loop_real_step.py"]),
    # The operator's other commands, each over a local store, in-memory groups or moto in this process.
    "move": Target(["ops/move.py"], ["tests/ops/test_catch_move.py"], extra=["-m", "not slow"]),
    # The plan's text from figures given by the test: the synth tests run Pulumi's mock runtime (see plugin.py).
    "plan": Target(["ops/plan.py"], ["tests/ops/test_catch_plan.py"]),
    "hosts": Target(["ops/hosts.py"], ["tests/ops/test_catch_hosts.py"]),
    # `ops synth` with the program's run replaced by a given result (the mock runtime hangs in mutmut's workers).
    "synth": Target(["ops/synth.py"], ["tests/ops/test_catch_synth.py"]),
    "status": Target(
        ["ops/status.py"],
        ["tests/ops/test_status.py", "tests/ops/test_status_heartbeat.py", "tests/ops/test_status_readers_properties.py",
         "tests/ops/test_status_signature.py", "tests/ops/test_runstate_details.py", "tests/ops/test_catch_status.py"],
        extra=["-m", "not slow"]),
    # AWS through moto in this process and EC2 clients answered from tables, GCP through test_preflight.py's fake API.
    "preflight": Target(
        ["ops/preflight/aws.py", "ops/preflight/gcp.py", "ops/preflight/common.py", "ops/preflight/__init__.py"],
        ["tests/ops/test_preflight.py", "tests/ops/test_preflight_network.py",
         "tests/ops/test_catch_preflight_routes.py", "tests/ops/test_catch_gcp_aws.py",
         "tests/ops/test_catch_preflight.py", "tests/ops/test_catch_preflight_aws.py",
         "tests/ops/test_preflight_signing.py"],
        extra=["-m", "not slow"]),
    # Script mode's parent in this process, the user's command a small stand-in (test_script.py's
    # cases run the trainer as a child, which mutmut cannot follow).
    "script": Target(["trainer/script.py", "trainer/script_folders.py", "trainer/script_messages.py",
                       "trainer/script_child.py"], ["tests/trainer/test_catch_script.py"]),
    # The fit helper and RunCheckpoint on a tiny Keras model. A graph `fit` hangs in mutmut's
    # forked workers; the plugin runs test_catch_fit.py's `fit` eagerly there, which trains.
    "fit": Target(["trainer/fit.py"], ["tests/trainer/test_catch_fit.py", "tests/trainer/test_fit.py"],
                  extra=["-m", "not slow"]),
}


def equivalents() -> dict[str, str]:
    """Mutant name (or fnmatch pattern) → why it stays alive here: `equivalent.txt` (no test can tell
    it from the original) and `by_hand.txt` (a test kills it when planted by hand, but mutmut
    cannot run or tie that test to it)."""
    out = {}
    for name, label in (("equivalent.txt", "equivalent"), ("by_hand.txt", "killed by hand")):
        for line in (HERE / name).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                mutant, _, reason = line.partition(" ")
                out[mutant] = f"{label}: {reason.strip()}"
    return out


def explained(name: str, equivalent: dict[str, str]) -> str | None:
    """Why `name` is alive, if a line of `equivalent.txt` or `by_hand.txt` says so."""
    return equivalent.get(name) or next((why for pat, why in equivalent.items() if fnmatch.fnmatchcase(name, pat)),
                                        None)


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def prepare(name: str, target: Target) -> Path:
    """A fresh copy of the working tree (tracked and new files) with mutmut's config for `target`."""
    work = SCRATCH / name
    shutil.rmtree(work, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            dest = work / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
    tests = [t for t in target.tests if (ROOT / t.split("::")[0]).exists()]
    # One process: mutmut traces which tests call a function in its own process, and the suite's
    # addopts spread tests over xdist workers (pyproject.toml).
    args = ["-q", "-p", "no:cacheprovider", "-n0"]
    if target.select:
        args += ["-k", target.select]
    if target.local_only:
        args += ["-p", "tests.mutation.plugin"]
    config = f"""
[tool.mutmut]
source_paths = {_toml_list(SOURCES)}
only_mutate = {_toml_list(target.mutate)}
also_copy = {_toml_list(ALSO_COPY)}
pytest_add_cli_args = {_toml_list(args + target.extra)}
pytest_add_cli_args_test_selection = {_toml_list(tests)}
use_git_change_detection = false
"""
    with open(work / "pyproject.toml", "a") as f:
        f.write(config)
    return work


def results(work: Path, target: Target) -> dict[str, str]:
    """Mutant name → mutmut's verdict, from the `.meta` files of the mutated files."""
    from mutmut.stats import status_by_exit_code

    out = {}
    for pattern in target.mutate:
        for meta in sorted((work / "mutants").glob(pattern + ".meta")):
            codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
            out.update({k: status_by_exit_code[v] for k, v in codes.items()})
    return out


def run(name: str, target: Target, equivalent: dict[str, str], *, again: bool = False) -> list[str] | None:
    """Run mutmut on one target and print its score; the mutants not killed, None when mutmut failed.

    `again`: check only the mutants the last run of this target left alive (after tests were
    added; the code under test unchanged) and keep that run's other verdicts.
    """
    saved = SCRATCH / f"{name}.json"
    before: dict[str, str] = json.loads(saved.read_text()) if again and saved.exists() else {}
    only = sorted(k for k, v in before.items() if v not in KILLED)
    if before and not only:
        verdicts, took = before, 0.0
    else:
        work = prepare(name, target)
        start = time.monotonic()
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        with open(SCRATCH / f"{name}.log", "w") as log:
            proc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "1", *only], cwd=work,
                                  env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        took = time.monotonic() - start
        found = results(work, target)
        if proc.returncode != 0 or not found:
            print(f"{name}: mutmut failed (exit {proc.returncode}) after {took:.0f} s; see {SCRATCH / name}.log")
            return None
        verdicts = {**before, **{k: v for k, v in found.items() if not before or k in only}}
        saved.write_text(json.dumps(verdicts, indent=1, sort_keys=True))
    killed = sum(1 for v in verdicts.values() if v in KILLED)
    left = sorted(k for k, v in verdicts.items() if v not in KILLED)
    total = len(verdicts)
    print(f"{name}: {killed} / {total} killed ({100 * killed / total:.1f} %), "
          f"{sum(1 for k in left if explained(k, equivalent))} explained, in {took:.0f} s"
          + (f" (again: {len(only)} checked)" if only else ""))
    for k in left:
        why = explained(k, equivalent)
        print(f"    {verdicts[k]:<10} {k}" + (f"  [{why}]" if why else ""))
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", choices=[[], *TARGETS], help="default: all of them")
    parser.add_argument("--list", action="store_true", help="print the targets, their files and tests")
    parser.add_argument("--again", action="store_true",
                        help="check only the mutants the last run left alive (after adding tests)")
    parser.add_argument("--only", metavar="FILE", action="append", default=[],
                        help="mutate only this file of the target (repeatable); its run is kept apart as "
                             "<target>-<file stem>, so a large target can be run, and run --again, a file at a time")
    opts = parser.parse_args(argv)
    names = opts.targets or list(TARGETS)
    if opts.only:
        narrowed = {}
        for n in names:
            files = [f for f in opts.only if any(fnmatch.fnmatchcase(f, m) for m in TARGETS[n].mutate)]
            if files:
                t = TARGETS[n]
                narrowed[n + "-" + "-".join(Path(f).stem for f in files)] = Target(
                    files, t.tests, select=t.select, local_only=t.local_only, extra=t.extra)
        if not narrowed:
            parser.error(f"--only {' '.join(opts.only)}: no file of {', '.join(names)}")
        targets = narrowed
    else:
        targets = {n: TARGETS[n] for n in names}
    names = list(targets)
    if opts.list:
        for n in names:
            print(f"{n}: mutate {' '.join(targets[n].mutate)}; tests {' '.join(targets[n].tests)}")
        return 0
    equivalent = equivalents()
    start = time.monotonic()
    unexplained, failed = 0, []
    for n in names:
        left = run(n, targets[n], equivalent, again=opts.again)
        if left is None:
            failed.append(n)
        else:
            unexplained += sum(1 for k in left if not explained(k, equivalent))
    print(f"all: {time.monotonic() - start:.0f} s; {unexplained} surviving mutants neither killed nor explained"
          + (f"; mutmut failed on {', '.join(failed)}" if failed else ""))
    return 1 if unexplained or failed else 0


if __name__ == "__main__":
    sys.exit(main())
