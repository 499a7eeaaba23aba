"""`python -m ops`: the operator's commands. `synth` writes what a stack would create, offline; `status`, `logs` and `tunnel` (ops/status.py, ops/remote.py) follow a run and reach its machines; `stop`, `runs` and `pull` (ops/runs.py) end, list and fetch runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _synth(args: argparse.Namespace) -> int:
    from components.settings import ConfigError
    from ops import synth

    stack_file = Path(args.stacks_dir) / f"Pulumi.{args.stack}.yaml"
    if not stack_file.is_file():
        print(f"ops synth: no stack file {stack_file}", file=sys.stderr)
        return 2
    try:
        # Validate before importing the program or touching DIR: a bad stack writes nothing.
        synth.load_source(stack_file, args.stack)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    try:
        result = synth.synthesize(stack_file, stack=args.stack)
    except synth.ProgramError as e:
        # The program itself failed (not the config): one line, nothing written.
        print(f"ops synth: the program failed: {e}", file=sys.stderr)
        return 1
    out = Path(args.out)
    written = synth.write(result, out)
    print(f"synth {args.stack}: {len(result.resources)} resources, {len(result.user_data)} user-data file(s) -> {out}")
    for p in written:
        print(f"  {p}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; returns the exit status."""
    from ops.synth import STACKS_DIR

    parser = argparse.ArgumentParser(prog="python -m ops", description="Operate trainstack stacks.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("synth", help="run the Pulumi program offline under mocks and write what it would create")
    p.add_argument("--stack", required=True, help="stack name: stacks/Pulumi.<NAME>.yaml")
    p.add_argument("--out", required=True, help="folder for resources.json, outputs.json, user-data/")
    p.add_argument("--stacks-dir", default=str(STACKS_DIR), help="folder of the stack files (default: %(default)s)")
    p.set_defaults(func=_synth)
    from ops import remote, runs, status

    status.register(sub)
    remote.register(sub)
    runs.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
