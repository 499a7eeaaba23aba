"""Runs a boot script's own functions in bash, with fakes for what lies outside them.

The boot sandbox runs whole machines (15-40 s a boot); the decisions inside `supervise.sh`,
`finish.sh` and `lib.sh` (how many failures end a run, which pause follows which exit, what
`finish` is told) are cheaper to pin one function at a time. `run_script` sources the real
script without its last line (`main "$@"`), so every function it defines is the shipped one,
then runs a test's body, which replaces what the test keeps out (the trainer's container, the
store, `finish`) with shell functions that write what they were asked to a file.

The clock is virtual: `EPOCHSECONDS` becomes a plain variable and `sleep N` adds N to it
(and writes `sleep N` to the file; inside `$(...)` the clock moves in that subshell only), so a loop bounded by an hour runs in milliseconds and its
pauses can be read back exactly.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

USERDATA = Path(__file__).resolve().parents[2] / "userdata"
START = 1_000_000  # the virtual clock's first second

# What every body may use: the machine's env file read (`load_env`), the record file ($OUT),
# the virtual clock, and `finish` and `shutdown` as records (a finish ends the shell, as the
# real one's exec does).
PRELUDE = """
load_env
unset EPOCHSECONDS
EPOCHSECONDS={start}
sleep() {{ echo "sleep $1" >>"$OUT"; EPOCHSECONDS=$((EPOCHSECONDS + ${{1%%.*}})); }}
record() {{ echo "$*" >>"$OUT"; }}
finish() {{ trap - EXIT; record "finish $*"; exit 0; }}
shutdown() {{ record "shutdown $*"; }}
instance_id() {{ echo i-0fake; }}
# The fakes above replace the library's own: a body that tests one of them sources it again
# (`. "$USERDATA/lib.sh"`).
# count NAME: how many times it was called with NAME, this one included (kept in a file, so a
# call inside $(...) counts too).
count() {{ local n; n=$(($(cat "$OUT.$1" 2>/dev/null || echo 0) + 1)); echo "$n" >"$OUT.$1"; echo "$n"; }}
"""

ENV = ("TRAINSTACK_CLOUD=aws\nTRAINSTACK_REGION=us-east-1\nTRAINSTACK_RUN_URI=s3://bucket/runs/r1\n"
       "TRAINSTACK_GROUP=trainstack-g\nTRAINSTACK_IMAGE=tensorflow/tensorflow:2.21.0-gpu\n")


@dataclass
class Ran:
    """What a body did: its exit status, the lines it recorded, and its stderr (the scripts' log)."""

    rc: int
    lines: list[str]
    log: str

    def starting(self, prefix: str) -> list[str]:
        """The recorded lines that start with `prefix`."""
        return [line for line in self.lines if line.startswith(prefix)]


def script_without_main(name: str) -> str:
    """`userdata/NAME` with its closing `main "$@"` line taken off, so sourcing it only defines."""
    text = (USERDATA / name).read_text()
    assert text.rstrip().endswith('main "$@"'), f"userdata/{name} no longer ends with main \"$@\""
    return text.rstrip().removesuffix('main "$@"')


def run_script(tmp_path: Path, name: str | None, body: str, *, env: str = "", rendezvous: str = "", progress: str = "",
               extra_env: dict[str, str] | None = None, timeout: float = 30) -> Ran:
    """Sources `userdata/NAME` (lib.sh alone when NAME is None) in a machine root under tmp_path,
    then the prelude and `body`. `env` adds lines to the machine's env file; `rendezvous` is
    what `supervise.sh`'s main sources as rendezvous.sh, after the real one; `progress` the same for
    progress.sh."""
    root = tmp_path / "root"
    bin_dir = root / "opt/trainstack/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (root / "var/lib/trainstack").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/trainstack/paths").write_text("")
    env_file = root / "env"
    env_file.write_text(ENV + env)
    # The scripts find lib.sh (and supervise.sh rendezvous.sh and progress.sh) beside TRAINSTACK_LIB.
    (bin_dir / "lib.sh").write_text(f'. "{USERDATA / "lib.sh"}"\n')
    (bin_dir / "rendezvous.sh").write_text(f'. "{USERDATA / "rendezvous.sh"}"\n{rendezvous}\n')
    (bin_dir / "progress.sh").write_text(f'. "{USERDATA / "progress.sh"}"\n{progress}\n')
    out = tmp_path / "out"
    out.write_text("")
    source = ""
    if name is not None:
        src = tmp_path / name
        src.write_text(script_without_main(name))
        source = f'. "{src}"'
    script = "\n".join([
        "set -euo pipefail",
        f'. "{USERDATA / "lib.sh"}"' if name is None else source,
        PRELUDE.format(start=START),
        body,
    ])
    full = {"PATH": os.environ["PATH"], "TRAINSTACK_ROOT": str(root), "TRAINSTACK_ENV_FILE": str(env_file),
            "TRAINSTACK_LIB": str(bin_dir / "lib.sh"), "TRAINSTACK_RETRY_BASE_S": "2",
            "TRAINSTACK_METADATA_URL": "http://127.0.0.1:9", "OUT": str(out), "USERDATA": str(USERDATA),
            **(extra_env or {})}
    proc = subprocess.run(["bash", "-c", script], env=full, capture_output=True, text=True, timeout=timeout)
    return Ran(proc.returncode, out.read_text().splitlines(), proc.stderr)
