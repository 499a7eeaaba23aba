"""Mutation testing of the boot scripts: `python -m tests.mutation.bash [SCRIPT ...] [--sample N]`.

mutmut mutates Python only. This plants one small bug at a time in `userdata/*.sh`, where the
scripts decide: a comparison flipped (`-lt`/`-le`, `-gt`/`-ge`, `-eq`/`-ne`, `==`/`!=`, and `<`,
`<=`, `>`, `>=` inside `(( ))`), a numeric bound moved by one inside `(( ))`, an exit or return
code changed (`exit 0` -> `exit 1`, `exit N` -> `exit N+1`, `return 0`/`return 1` swapped). Each
mutant is written into a scratch copy of the working tree (`build/mutation/bash/`) and the tests
that cover that script run there (`SCRIPTS`); a mutant is killed when they fail or time out.
The boot tests run the real scripts in a sandbox (seconds each), so a script's sites are sampled
(`--sample`, seeded by `--seed`). Comments are not mutated. Each run keeps its survivors in
`build/mutation/bash-survivors.txt`; `--again` runs only those (after tests were added),
`--tests` runs other tests than `SCRIPTS` lists (a quick screen with the focused tests alone).
Not CI: see tests/README.md for scores and times. Exits 1 while a mutant survives that
`bash_equivalent.txt` does not explain.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WORK = ROOT / "build" / "mutation" / "bash"
# Outside WORK, which each run makes afresh.
SURVIVORS = ROOT / "build" / "mutation" / "bash-survivors.txt"

# The tests each script's decisions reach, in two stages a mutant meets in turn: the focused tests
# that run the script's own functions in bash with fakes (milliseconds a case, script_functions.py),
# then the boot sandbox's cases by the paths they take (15-40 s a boot), which a mutant reaches only
# when it survives the first. Each stage is one pytest run: within a run the suite's conftest starts
# slow modules first, so one run of both would boot sandboxes before the focused tests.
BOOT = "tests/userdata/test_boot.py"
BOUNDS = "tests/userdata/test_supervise_bounds.py"
SANDBOX_END = [
    BOOT + "::test_ended_run_finishes_at_boot",
    BOOT + "::test_clean_run_completes_scales_to_zero_and_shuts_down",
]
SCRIPTS: dict[str, list[list[str]]] = {
    "userdata/supervise.sh": [
        [
            "tests/userdata/test_supervise_exit_trap.py",
            "tests/userdata/test_supervise_loop.py",
            "tests/userdata/test_supervise_setup.py",
        ],
        [
            BOOT + "::test_deadline_passed_times_out_without_starting_anything",
            BOOT + "::test_ended_run_finishes_at_boot",
            BOOT + "::test_crash_loop_fails_after_n_in_a_row_with_logs",
            BOOT + "::test_no_gpu_fails_fast_with_reason",
            BOOT + "::test_clean_run_completes_scales_to_zero_and_shuts_down",
            BOOT + "::test_a_run_whose_lease_another_machine_holds_is_tried_again_not_failed",
            BOOT + "::test_deadline_reached_during_training_stops_the_trainer_and_times_out",
            BOOT + "::test_sigterm_from_a_shutdown_is_no_verdict_but_an_unexpected_exit_is_failed",
            BOUNDS + "::test_a_lease_held_elsewhere_is_retried_with_pauses_then_the_group_stands_down",
            BOUNDS + "::test_a_bucket_unreadable_past_the_bound_ends_the_run_with_the_group_at_zero",
        ],
    ],
    "userdata/lib.sh": [
        [
            "tests/userdata/test_lib_functions.py",
            "tests/userdata/test_retry.py",
            "tests/userdata/test_metadata_reads.py",
            "tests/userdata/test_federation_token.py",
        ],
        [
            *SANDBOX_END,
            "tests/userdata/test_boot_scripts.py::test_a_machine_installs_its_boot_scripts_from_the_bucket_once",
        ],
    ],
    "userdata/finish.sh": [
        ["tests/userdata/test_finish_steps.py"],
        [*SANDBOX_END, BOOT + "::test_crash_loop_fails_after_n_in_a_row_with_logs"],
    ],
    "userdata/progress.sh": [
        ["tests/userdata/test_progress_watch.py"],
        [BOOT + "::test_a_trainer_that_stops_making_progress_is_stopped_and_its_machine_replaced"],
    ],
}
SWAPS = {"-lt": "-le", "-le": "-lt", "-gt": "-ge", "-ge": "-gt", "-eq": "-ne", "-ne": "-eq", "==": "!=", "!=": "=="}
ARITH = {"<=": "<", "<": "<=", ">=": ">", ">": ">="}


@dataclass(frozen=True)
class Mutant:
    """One planted bug: the line (1-based), the text it had and the text it gets."""

    script: str
    line: int
    before: str
    after: str
    kind: str

    @property
    def name(self) -> str:
        return f"{self.script}:{self.line}:{self.kind}:{self.after.strip()[:60]}"


def _code(line: str) -> str:
    """The line without a trailing comment (a `#` after whitespace, outside `${...#...}`)."""
    m = re.search(r"(^|\s)#(?![^{]*\})", line)
    return line[:m.start()] if m else line


def sites(script: str, text: str) -> list[Mutant]:
    """Every mutant of `text` (the script's content), in line order."""
    out: list[Mutant] = []
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        code = _code(line)
        if not code.strip() or code.lstrip().startswith("#"):
            continue

        def add(start: int, end: int, new: str, kind: str, n: int = n, line: str = line) -> None:
            out.append(Mutant(script, n, line, line[:start] + new + line[end:], kind))

        for m in re.finditer(r"(?<=\s)(-lt|-le|-gt|-ge|-eq|-ne|==|!=)(?=\s)", code):
            add(m.start(), m.end(), SWAPS[m.group(1)], "compare")
        for arith in re.finditer(r"\(\((.*?)\)\)", code):
            body, base = arith.group(1), arith.start(1)
            for m in re.finditer(r"(?<![<>=!])(<=|>=|<|>)(?![<>=])", body):
                add(base + m.start(), base + m.end(), ARITH[m.group(1)], "arith")
            for m in re.finditer(r"(?<![\w$.])(\d+)(?![\w.])", body):
                add(base + m.start(), base + m.end(), str(int(m.group(1)) + 1), "bound")
        for m in re.finditer(r"\b(exit|return) (\d+)\b", code):
            code_now = int(m.group(2))
            new = {"return": {0: 1, 1: 0}}.get(m.group(1), {}).get(code_now, 1 if code_now == 0 else code_now + 1)
            add(m.start(2), m.end(2), str(new), m.group(1))
    return out


def prepare() -> Path:
    """A fresh copy of the working tree (tracked and new files) under build/mutation/bash/."""
    shutil.rmtree(WORK, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            dest = WORK / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
    return WORK


def run_tests(work: Path, stages: list[list[str]], timeout: float) -> tuple[str, str]:
    """killed (a test failed), timeout, or survived, and the test that failed: each stage in one
    pytest run, in turn, up to the first that fails; `timeout` seconds for them all."""
    stop_at = time.monotonic() + timeout
    for tests in stages:
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-n0", "-p", "no:cacheprovider", *tests]
        try:
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True,
                                  timeout=max(1.0, stop_at - time.monotonic()))
        except subprocess.TimeoutExpired:
            return "timeout", ""
        if proc.returncode == 1:
            # A kill in the sandbox stage can be a case that flaked under load: the name says which.
            failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
            return "killed", failed[0] if failed else ""
        if proc.returncode != 0:
            raise RuntimeError(f"pytest could not run {' '.join(tests)} (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
    return "survived", ""


def equivalents() -> dict[str, str]:
    """Mutant name prefix -> why it stays alive (`bash_equivalent.txt`: `<prefix> ## <why>`; the
    prefix holds the mutated text, so a line that moves or changes is not excused by a stale entry)."""
    path = HERE / "bash_equivalent.txt"
    out = {}
    for n, line in enumerate(path.read_text().splitlines() if path.exists() else [], 1):
        if line.strip() and not line.startswith("#"):
            name, sep, why = line.partition(" ## ")
            if not sep or not why.strip():
                raise SystemExit(f"{path}:{n}: expected `<mutant name prefix> ## <why>`, got {line!r}")
            out[name] = why
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation.bash", description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", choices=[[], *SCRIPTS], help="default: all of them")
    parser.add_argument("--sample", type=int, default=0, help="mutants per script, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a mutant's tests may take")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--again", action="store_true",
                        help=f"run only the mutants the last run left alive ({SURVIVORS.relative_to(ROOT)})")
    parser.add_argument("--tests", nargs="+", metavar="TEST", help="run these tests for every mutant instead of SCRIPTS'")
    opts = parser.parse_args(argv)
    scripts = opts.scripts or list(SCRIPTS)
    rng = random.Random(opts.seed)
    before = set(SURVIVORS.read_text().splitlines()) if opts.again and SURVIVORS.exists() else None
    if opts.again and before is None:
        print(f"--again: no {SURVIVORS.relative_to(ROOT)}: run without --again first")
        return 2
    chosen: list[Mutant] = []
    for script in scripts:
        found = sites(script, (ROOT / script).read_text())
        if before is not None:
            picked = [m for m in found if m.name in before]
        else:
            picked = rng.sample(found, min(opts.sample, len(found))) if opts.sample else found
        chosen += sorted(picked, key=lambda m: m.line)
        print(f"{script}: {len(found)} mutants, {len(picked)} run")
    if opts.list:
        for m in chosen:
            print(f"  {m.name}")
        return 0
    tests_of = {s: [opts.tests] if opts.tests else SCRIPTS[s] for s in scripts}
    work = prepare()
    every = sorted({t for s in scripts for stage in tests_of[s] for t in stage})
    if run_tests(work, [every], max(opts.timeout, 1800.0))[0] != "survived":
        print("the tests fail on the unmutated scripts: fix that first")
        return 2
    why = equivalents()
    start, left = time.monotonic(), 0
    verdicts: dict[str, int] = {}
    alive: list[str] = []
    for m in chosen:
        path = work / m.script
        original = path.read_text()
        lines = original.splitlines(keepends=True)
        lines[m.line - 1] = m.after
        path.write_text("".join(lines))
        t0 = time.monotonic()
        try:
            verdict, by = run_tests(work, tests_of[m.script], opts.timeout)
        finally:
            path.write_text(original)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        note = next((w for n, w in why.items() if m.name.startswith(n)), None) if verdict == "survived" else None
        left += verdict == "survived" and note is None
        if verdict == "survived":
            alive.append(m.name)
        print(f"  {verdict:<9} {time.monotonic() - t0:5.0f} s  {m.name}" + (f"  [explained: {note}]" if note else "")
              + (f"  [by {by.removeprefix('tests/userdata/')}]" if by else ""), flush=True)
    killed = verdicts.get("killed", 0) + verdicts.get("timeout", 0)
    print(f"bash: {killed} / {len(chosen)} killed ({100 * killed / max(1, len(chosen)):.1f} %), "
          f"{verdicts.get('timeout', 0)} by timeout, in {time.monotonic() - start:.0f} s; "
          f"{left} surviving mutants not explained")
    SURVIVORS.parent.mkdir(parents=True, exist_ok=True)
    SURVIVORS.write_text("".join(f"{name}\n" for name in alive))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
