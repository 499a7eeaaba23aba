"""What every ``python -m ops`` command shares: its error, the run URI it was given, the
argument types and the exit statuses.

The exit statuses are the ones ops/README.md documents, named once so a command says
which one it means; a test checks that no command returns a bare number. The project's
own folders are in ``components/project.py`` (``components`` cannot import ``ops``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

# -- exit statuses (ops/README.md) -------------------------------------------------------

EXIT_OK = 0
# The run ended badly (FAILED, TIMED_OUT, a stop that did not end CANCELLED), preflight
# found problems, or there is nothing to show yet.
EXIT_FAILED = 1
# The command could not do what was asked: bad arguments or stack, no run at the URI, the
# run or machine could not be read or reached. argparse exits 2 for usage errors too.
EXIT_ERROR = 2
# `ops status`: the trainer's heartbeat stopped with nothing to explain it.
EXIT_STALLED = 3
# Ctrl-C (128 + SIGINT), as a shell reports it.
EXIT_INTERRUPTED = 130


class OpsError(Exception):
    """The command cannot do what was asked; the message says why and what to do."""


def run_uri(args: argparse.Namespace) -> str:
    """The run the command is about: ``--run-uri``, else the ``runUri`` output of ``--stack``."""
    from ops import hosts

    return args.run_uri or hosts.run_uri_for_stack(args.stack)


# -- argument types ---------------------------------------------------------------------


def port_type(*, any_free: bool = False) -> Callable[[str], int]:
    """argparse type for a TCP port, 1-65535; ``any_free`` also takes 0 (the system picks a free one)."""
    low = 0 if any_free else 1

    def port(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = -1
        if not low <= v <= 65535:
            hint = " (0: any free port)" if any_free else ""
            raise argparse.ArgumentTypeError(f"{text!r}: expected a local port {low}-65535{hint}")
        return v

    return port


def _number(text: str, convert: Callable[[str], float], noun: str, ok: Callable[[float], bool], bound: str):
    try:
        v = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
    if not ok(v):
        raise argparse.ArgumentTypeError(f"{text!r}: must be {bound}")
    return v


def positive_float(text: str) -> float:
    """argparse type: a number above 0 (seconds, intervals)."""
    return _number(text, float, "a number", lambda v: v > 0, "more than 0")


def non_negative_int(text: str) -> int:
    """argparse type: a whole number, 0 or more."""
    return _number(text, int, "a whole number", lambda v: v >= 0, "0 or more")
