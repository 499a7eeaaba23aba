"""`python -m ops`: the operator's commands. `synth` writes what a stack would create, offline (ops/synth.py); `status`, `logs` and `tunnel` (ops/status.py, ops/remote.py) follow a run and reach its machines; `stop`, `runs` and `pull` (ops/runs.py) end, list and fetch runs; `tensorboard` (ops/tensorboard.py) serves a run's TensorBoard from its bucket."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m ops", description="Operate trainstack stacks.")
    sub = parser.add_subparsers(dest="command", required=True)
    from ops import preflight, remote, runs, status, synth, tensorboard

    synth.register(sub)
    status.register(sub)
    remote.register(sub)
    runs.register(sub)
    preflight.register(sub)
    tensorboard.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
