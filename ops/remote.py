"""``ops logs`` and ``ops tunnel``: a machine's trainer and watcher logs (streamed over SSH,
or the ones the machines uploaded to the bucket), and local ports forwarded to it (its
Jupyter, with its token, or any port) on 127.0.0.1.

The SSH transport and the forwarding are ``ops/ssh.py``; this module decides what to run
and forward, and says what went wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
import time

import paramiko

from components.machine import JUPYTER_PORT, JUPYTER_TOKEN_FILE, LOG_GLOB, TRAINER_UNIT, WATCHER_UNIT
from ops.cli import EXIT_ERROR, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, non_negative_int, port_type, run_uri
from ops.ssh import ForwardSpec, LocalForward, RemoteError, Target, connect, run

# The machine's names (its units, log files, Jupyter's port and token) are components/machine.py's.
UNITS = (TRAINER_UNIT, WATCHER_UNIT)


def logs_command(*, lines: int, follow: bool) -> str:
    """The shell command that prints the trainer's and watcher's logs on a machine.

    The journal when ``journalctl`` exists, else the last lines of the log files.
    """
    if lines < 0:
        raise ValueError(f"lines must be >= 0, got {lines}")
    units = " ".join(f"-u {shlex.quote(u)}" for u in UNITS)
    journal = f"journalctl {units} --no-pager -n {lines}" + (" -f" if follow else "")
    tail = f"tail -n {lines}" + (" -F" if follow else "") + f" {LOG_GLOB}"
    return f"if command -v journalctl >/dev/null 2>&1; then exec {journal}; else exec {tail}; fi"


def read_jupyter_token(client: paramiko.SSHClient, host: str) -> str:
    """The token the machine made for its Jupyter, read over SSH (it is nowhere else)."""
    out = io.BytesIO()
    status = run(client, f"cat -- {shlex.quote(JUPYTER_TOKEN_FILE)}", out)
    token = out.getvalue().decode(errors="replace").strip()
    if status != 0 or not re.fullmatch(r"[0-9a-f]{32,128}", token):
        raise RemoteError(
            f"no Jupyter token at {JUPYTER_TOKEN_FILE} on {host}: set access.jupyter: true in the stack and "
            "`pulumi up`, then wait for the machine to finish booting (python -m ops logs shows it)"
        )
    return token


# -- commands --------------------------------------------------------------------------


def _targets(args: argparse.Namespace) -> list[Target]:
    from ops import hosts

    return [
        Target(a, port=args.port, user=args.user, key_path=args.key, accept_new_host_key=args.accept_new_host_key)
        for a in hosts.machine_addresses(args)
    ]


def _logs_from_bucket(args: argparse.Namespace) -> int:
    from runfolder import layout
    from runfolder.storage import open_store

    if args.host:
        print("ops logs: --from-bucket reads the run's bucket: give --stack or --run-uri, not --host", file=sys.stderr)
        return EXIT_ERROR
    uri = run_uri(args)
    store = open_store(uri)
    keys = sorted(k for k in store.list(layout.LOGS_PREFIX) if not k.endswith("/"))
    if not keys:
        print(f"ops logs: no logs under {uri.rstrip('/')}/{layout.LOGS_PREFIX} yet (machines upload them when the run ends)",
              file=sys.stderr)
        return EXIT_FAILED
    out = sys.stdout.buffer
    for key in keys:
        out.write(f"==> {key} <==\n".encode())
        data = store.get_bytes(key)
        if args.lines is not None:
            data = b"".join(data.splitlines(keepends=True)[-args.lines:]) if args.lines else b""
        out.write(data if data.endswith(b"\n") or not data else data + b"\n")
        out.flush()
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """``ops logs``: stream the machines' trainer and watcher logs, or print the uploaded ones."""
    from ops.hosts import HostsError

    try:
        if args.from_bucket:
            return _logs_from_bucket(args)
        if args.run_uri:
            print("ops logs: --run-uri reads the bucket; add --from-bucket (or use --stack/--host)", file=sys.stderr)
            return EXIT_ERROR
        if getattr(args, "stack", None):
            from ops import kube

            try:  # a Job stack: its pods' logs through the cluster's API, not SSH
                if args.follow:
                    ended = kube.follow_for_stack(args.stack, sys.stdout.buffer, tail_lines=args.lines)
                    if ended is not None:
                        print(f"ops logs: the pod ended: {ended}; a replacement's log: python -m ops logs "
                              f"--stack {args.stack} --follow", file=sys.stderr)
                        return EXIT_OK
                pods = None if args.follow else kube.logs_for_stack(args.stack, tail_lines=100 if args.lines is None
                                                                    else args.lines)
            except Exception as e:  # noqa: BLE001 - the client raises many types; each gets the same one line
                print(f"ops logs: the Job's logs were not read: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                      file=sys.stderr)
                return EXIT_ERROR
            if pods is not None:
                for name, text in pods:
                    sys.stdout.write(f"==> {name} <==\n{text}")
                return EXIT_OK
        targets = _targets(args)
        if args.follow and len(targets) > 1:
            names = ", ".join(t.host for t in targets)
            print(f"ops logs: --follow reads one machine; choose one with --host ({names})", file=sys.stderr)
            return EXIT_ERROR
        lines = 100 if args.lines is None else args.lines
        command = logs_command(lines=lines, follow=args.follow)
        status = 0
        for t in targets:
            if len(targets) > 1:
                sys.stdout.write(f"==> {t.host} <==\n")
                sys.stdout.flush()
            try:
                with contextlib.closing(connect(t)) as client:
                    status = run(client, command, sys.stdout.buffer, pty=args.follow) or status
            except RemoteError as e:
                if len(targets) == 1:
                    raise
                # One unreachable machine (being preempted) must not hide the others' logs.
                print(f"ops logs: {t.host}: {e}", file=sys.stderr)
                status = 2
        return status
    except (HostsError, RemoteError, ValueError) as e:
        print(f"ops logs: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def cmd_tunnel(args: argparse.Namespace) -> int:
    """``ops tunnel``: forward local ports to the machine until Ctrl-C."""
    from ops.hosts import HostsError

    # Nothing serves TensorBoard on the machines: forwarding its port would reach nothing.
    # The flag stays only to say where to go instead.
    if args.tensorboard:
        print("ops tunnel: nothing serves TensorBoard on the machines; run `python -m ops tensorboard "
              "--stack NAME` (it reads the run's bucket, no SSH)", file=sys.stderr)
        return EXIT_ERROR
    specs = list(args.forward or [])
    if args.jupyter is not None:
        specs.insert(0, ForwardSpec(args.jupyter, "127.0.0.1", JUPYTER_PORT, label="jupyter"))
    if not specs:
        print("ops tunnel: nothing to forward; pass --jupyter or -L LOCAL:REMOTE (TensorBoard: python -m ops "
              "tensorboard)", file=sys.stderr)
        return EXIT_ERROR
    forwards: list[LocalForward] = []
    client = None
    try:
        targets = _targets(args)
        target = targets[0]
        if len(targets) > 1:
            print(f"ops tunnel: {len(targets)} machines; using the oldest, {target.host} (choose with --host)",
                  file=sys.stderr)
        client = connect(target)
        token = read_jupyter_token(client, target.host) if args.jupyter is not None else ""
        for spec in specs:
            fwd = LocalForward(client, spec.local_port, spec.remote_host, spec.remote_port)
            forwards.append(fwd)
            label = f"{spec.label}: " if spec.label else ""
            path = f"lab?token={token}" if spec.label == "jupyter" else ""
            print(f"{label}http://127.0.0.1:{fwd.local_port}/{path} -> {spec.remote_host}:{spec.remote_port} "
                  f"on {target.host}", flush=True)
        print("ops tunnel: forwarding; Ctrl-C to stop", file=sys.stderr, flush=True)
        transport = client.get_transport()
        while transport is not None and transport.is_active():
            time.sleep(0.5)
        print("ops tunnel: the SSH connection closed", file=sys.stderr)
        return EXIT_FAILED
    except (HostsError, RemoteError) as e:
        print(f"ops tunnel: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        for fwd in forwards:
            fwd.close()
        if client is not None:
            client.close()


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``logs`` and ``tunnel`` commands to ``python -m ops``."""
    from ops import hosts

    p = sub.add_parser("logs", help="stream a machine's trainer and watcher logs over SSH, or the uploaded ones")
    hosts.add_machine_args(p, extra_source=True)
    p.add_argument("--follow", "-f", action="store_true", help="keep streaming new lines until Ctrl-C")
    p.add_argument("--lines", "-n", type=non_negative_int, help="how many recent lines (default: 100 over SSH, all "
                   "from the bucket)")
    p.add_argument("--from-bucket", action="store_true", help="print the logs the machines uploaded to "
                   "<run-uri>/logs/ (no machine needed; with --stack or --run-uri)")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("tunnel", help="forward local ports (127.0.0.1) to a machine over SSH until Ctrl-C")
    hosts.add_machine_args(p)
    p.add_argument("--tensorboard", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--jupyter", nargs="?", const=JUPYTER_PORT, type=port_type(any_free=True), metavar="LOCAL_PORT",
                   help="forward 127.0.0.1:LOCAL_PORT (default 8888; 0: any free port) to the machine's Jupyter "
                   "(stack setting access.jupyter: true) and print its URL with the token")
    p.add_argument("-L", dest="forward", action="append", type=ForwardSpec.parse, metavar="LOCAL:[HOST:]REMOTE",
                   help="forward 127.0.0.1:LOCAL to REMOTE on the machine (LOCAL 0: any free port); repeatable")
    p.set_defaults(func=cmd_tunnel)


