"""`python -m ops`: the operator's commands. `synth` writes what a stack would create, offline (ops/synth.py); `status`, `logs` and `tunnel` (ops/status.py, ops/remote.py) follow a run and reach its machines; `stop`, `runs` and `pull` (ops/runs.py) end, list and fetch runs; `tensorboard` (ops/tensorboard.py) serves a run's TensorBoard from its bucket; `move` (ops/move.py) moves a run to another placement; `start` (ops/jobs.py) submits a SageMaker stack's training job; `dashboard` (ops/dashboard/) shows a bucket's runs in a browser.

A mistyped command or flag gets one line with the nearest real one, not the whole usage."""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from ops.cli import EXIT_ERROR


class OpsParser(argparse.ArgumentParser):
    """argparse with one-line errors that point to the nearest command or flag and to --help."""

    def error(self, message: str):
        m = re.match(r"argument command: invalid choice: '([^']*)'", message)
        if m:
            commands = re.findall(r"'([^']+)'", message.split("(choose from", 1)[-1])
            near = difflib.get_close_matches(m.group(1), commands, n=1)
            message = f"unknown command {m.group(1)!r}" + (f" (did you mean {near[0]}?)" if near else "") + \
                f"; commands: {', '.join(commands)}"
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def unknown_options(self, extra: list[str]) -> None:
        """Refuse arguments this command does not take, naming the nearest flag of each."""
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        hints = []
        for arg in extra:
            if not arg.startswith("-"):
                hints.append(repr(arg))
                continue
            near = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1, cutoff=0.7)
            hints.append(f"{arg} (did you mean {near[0]}?)" if near else arg)
        self.error("unknown option " + ", ".join(hints) if any(a.startswith("-") for a in extra)
                   else "unexpected argument " + ", ".join(hints))


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; returns the exit status."""
    parser = OpsParser(prog="python -m ops", description="Operate trainstack stacks.")
    sub = parser.add_subparsers(dest="command", required=True)
    from ops import dashboard, jobs, kube, move, preflight, remote, runs, status, synth, tensorboard

    synth.register(sub)
    status.register(sub)
    remote.register(sub)
    runs.register(sub)
    preflight.register(sub)
    tensorboard.register(sub)
    move.register(sub)
    jobs.register(sub)
    kube.register(sub)
    dashboard.register(sub)
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub.choices[args.command].unknown_options(extra)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
