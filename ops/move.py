"""`ops move`: move a run to another of its stack's placements now, as the controller would.

``python -m ops move --stack NAME --to us-west-2`` reads the stack's ``placements`` output (the
controller's configuration document, :mod:`controller.config`), or ``--config FILE`` the same
document from a file; ``--run-uri`` names another run of the stack. The move goes through
:func:`controller.tick.move`, the function the controller's tick uses: ``placement.json`` records
it (a conditional write), the active group goes to zero, the old lease must have expired (this
command waits up to ``--wait`` seconds for it), the new placement's group goes to ``nodes`` and a
``moved`` event is written. A move still waiting for the lease when ``--wait`` runs out stays
recorded: the controller's next tick, or this command again, finishes it.

Exit status (ops/cli.py): 0 moved; 1 recorded but still waiting for the old lease; 2 the move
cannot be made (bad arguments or stack, no such placement, the run ended or is already there,
a group could not be read or sized).
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import socket
import sys
from pathlib import Path

from components.project import PLACEMENTS_OUTPUT
from ops.cli import EXIT_ERROR, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, OpsError, positive_float

# The old lease's TTL, the clock skew allowed and a margin: a preempted trainer's lease (not
# released) has expired by then.
DEFAULT_WAIT_S = 90.0


def load_config(args: argparse.Namespace):
    """The controller's configuration: ``--config FILE`` or the stack's ``placements`` output; ``--run-uri`` wins."""
    from controller.config import parse

    if args.config:
        try:
            text = Path(args.config).read_text()
        except OSError as e:
            raise OpsError(f"cannot read --config {args.config}: {e.strerror}") from None
    else:
        from ops import hosts

        value = hosts.stack_outputs(args.stack).get(PLACEMENTS_OUTPUT)
        if not value:
            raise OpsError(f"stack {args.stack} has no {PLACEMENTS_OUTPUT} output: it has one placement, or run "
                           "`pulumi up` for it first")
        text = value if isinstance(value, str) else json.dumps(value)
    config = parse(text)
    if args.run_uri:
        config = dataclasses.replace(config, run_uri=args.run_uri.rstrip("/"))
    return config


def cmd_move(args: argparse.Namespace) -> int:
    """``ops move``: move the run to the placement ``--to`` names."""
    from controller.clouds import CloudError, Clouds
    from controller.config import ConfigError
    from controller.tick import MoveError, move
    from ops import hosts
    from runfolder.storage import PreconditionFailed

    try:
        config = load_config(args)
        to = config.find(args.to)
        by = f"{getpass.getuser()}@{socket.gethostname()}"
        reason = f"asked by {by} (ops move)" + (f": {args.reason}" if args.reason else "")
        # The operator's own credentials reach every placement (not the function's federation).
        result = move(config, Clouds(federate=False), to, reason, wait_s=args.wait)
    except (ConfigError, MoveError, OpsError, hosts.HostsError, CloudError, ValueError) as e:
        print(f"ops move: {e}", file=sys.stderr)
        return EXIT_ERROR
    except PreconditionFailed:
        print("ops move: the controller moved the run meanwhile; see python -m ops status", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    m = result.move or {}
    src = config.placements[m.get("from", 0)]
    where = f"from {src.index} ({src.label}) to {to.index} ({to.label})"
    if result.waiting:
        print(f"the move {where} is recorded; {result.waiting}.")
        print("  the controller's next tick (or this command again) finishes it")
        return EXIT_FAILED
    step = m.get("step")
    print(f"moved {config.run_uri} {where}; it resumes from "
          + (f"step {step}" if step is not None else "the start (no checkpoint committed yet)"))
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``move`` command to ``python -m ops``."""
    p = sub.add_parser("move", help="move the run to another placement of its stack (region or cloud)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="stack name: the placements come from its outputs (pulumi CLI)")
    where.add_argument("--config", help="the controller's configuration document (JSON file)")
    p.add_argument("--to", required=True, help="the placement: its index, region, or cloud:region")
    p.add_argument("--run-uri", help="another run of the stack (default: the configuration's run)")
    p.add_argument("--reason", default="", help="why, recorded with the move")
    p.add_argument("--wait", type=positive_float, default=DEFAULT_WAIT_S,
                   help="seconds to wait for the old placement's lease to expire (default: %(default)s)")
    p.set_defaults(func=cmd_move)
