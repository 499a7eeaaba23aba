"""SSH to a training machine with paramiko: log in, run a command and stream its output,
forward local ports through the connection.

The transport only; the commands built on it (``ops logs``, ``ops tunnel``) are in
``ops/remote.py``.

Host keys are checked against ``~/.ssh/known_hosts`` and an unknown machine is refused;
``Target.accept_new_host_key`` trusts a machine on first use and saves its key there. A key
that differs from the saved one is always refused (paramiko raises before any policy is
asked). Local forwards listen on 127.0.0.1 only, never on every interface.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import socketserver
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import paramiko

CONNECT_TIMEOUT_S = 15
KEEPALIVE_S = 30
_CHUNK = 32768


class RemoteError(Exception):
    """Reaching or using a machine failed; the message says what to do."""


def known_hosts_path() -> Path:
    """The user's ``~/.ssh/known_hosts`` (what OpenSSH reads too)."""
    return Path(os.path.expanduser("~/.ssh/known_hosts"))


class SaveNewHostKey(paramiko.MissingHostKeyPolicy):
    """Trust on first use: accept a host missing from known_hosts and append its key there."""

    def __init__(self, path: Path, *, say: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.say = say or (lambda msg: print(msg, file=sys.stderr))

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        """Record ``key`` for ``hostname`` (already ``[host]:port`` off port 22) in the client and the file."""
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.path, "a", encoding="ascii") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        self.say(f"ops: trusted new host key {key.fingerprint} for {hostname}; saved to {self.path}")


@dataclass
class Target:
    """Where and as whom to log in."""

    host: str
    port: int = 22
    user: str = "ubuntu"
    key_path: str | None = None
    accept_new_host_key: bool = False


def connect(target: Target, *, timeout: float = CONNECT_TIMEOUT_S) -> paramiko.SSHClient:
    """Log in to ``target`` after checking its host key; returns a connected client (close it)."""
    client = paramiko.SSHClient()
    known = known_hosts_path()
    try:
        client.load_system_host_keys()  # ~/.ssh/known_hosts, hashed entries included
    except (OSError, paramiko.SSHException) as e:
        raise RemoteError(f"cannot read {known}: {e}") from None
    if target.accept_new_host_key:
        client.set_missing_host_key_policy(SaveNewHostKey(known))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    where = f"{target.user}@{target.host}" + (f":{target.port}" if target.port != 22 else "")
    try:
        client.connect(
            target.host,
            port=target.port,
            username=target.user,
            key_filename=target.key_path,
            look_for_keys=target.key_path is None,
            allow_agent=True,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
        )
    except paramiko.BadHostKeyException as e:
        client.close()
        raise RemoteError(
            f"host key of {target.host} has CHANGED (got {e.key.fingerprint}, {known} has "
            f"{e.expected_key.fingerprint}); refusing to connect. If the machine was replaced, remove its old "
            f"line with: ssh-keygen -R {_known_name(target)}"
        ) from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise RemoteError(f"SSH login {where} refused ({e}); check --user and --key") from None
    except paramiko.SSHException as e:
        client.close()
        if "not found in known_hosts" in str(e):
            raise RemoteError(
                f"host key of {_known_name(target)} is unknown (not in {known}); verify it and add it "
                f"(ssh-keyscan -p {target.port} {target.host} >> {known}), or pass --accept-new-host-key "
                "to trust it on first use"
            ) from None
        raise RemoteError(f"SSH to {where} failed: {e}") from None
    except OSError as e:
        client.close()
        raise RemoteError(f"cannot reach {where}: {e}") from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_S)
    return client


def _known_name(target: Target) -> str:
    return target.host if target.port == 22 else f"[{target.host}]:{target.port}"


def run(
    client: paramiko.SSHClient,
    command: str,
    out: BinaryIO,
    *,
    pty: bool = False,
    poll_s: float = 0.5,
) -> int:
    """Run ``command`` on the machine, copying its output (stderr merged) to ``out`` as it arrives.

    Returns the command's exit status. ``pty`` gives the command a terminal, so it ends
    when the connection closes (a ``-f`` follower never outlives the operator's Ctrl-C).
    """
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise RemoteError("the SSH connection is closed")
    chan = transport.open_session()
    try:
        if pty:
            chan.get_pty(term="dumb", width=200)
        chan.set_combine_stderr(True)
        chan.settimeout(poll_s)  # wake up now and then so Ctrl-C is seen at once
        chan.exec_command(command)
        held = b""  # a terminal's "\r\n" can be split between two reads
        while True:
            try:
                data = chan.recv(_CHUNK)
            except TimeoutError:
                continue
            if not data:
                break
            if pty:
                data = (held + data).replace(b"\r\n", b"\n")
                held, data = (b"\r", data[:-1]) if data.endswith(b"\r") else (b"", data)
            out.write(data)
            out.flush()
        if held:
            out.write(held)
            out.flush()
        return chan.recv_exit_status()
    finally:
        chan.close()


# -- local port forwarding -------------------------------------------------------------


class _ForwardServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    transport: paramiko.Transport
    remote: tuple[str, int]


class _ForwardHandler(socketserver.BaseRequestHandler):
    """One local connection, carried to the remote address over a ``direct-tcpip`` channel."""

    server: _ForwardServer

    def handle(self) -> None:
        try:
            chan = self.server.transport.open_channel(
                "direct-tcpip", self.server.remote, self.request.getpeername(), timeout=CONNECT_TIMEOUT_S
            )
        except (paramiko.SSHException, OSError) as e:
            host, port = self.server.remote
            print(f"ops tunnel: the machine could not open {host}:{port}: {e}", file=sys.stderr)
            return
        try:
            _pump(self.request, chan)
        finally:
            chan.close()


def _pump(sock: socket.socket, chan: paramiko.Channel) -> None:
    """Copy bytes both ways until both sides have finished sending.

    One thread per direction: a single loop blocked on a full SSH window in one direction
    would stop draining the other, and an echoing service would then wait forever. A side
    that finishes sending is half-closed on the other, so a client that shuts down its
    writes (a request, then wait for the answer) still gets the whole answer.
    """

    def upstream() -> None:
        with contextlib.suppress(OSError, EOFError):
            while data := sock.recv(_CHUNK):
                chan.sendall(data)
        with contextlib.suppress(OSError, EOFError):
            chan.shutdown_write()

    up = threading.Thread(target=upstream, name="forward-up", daemon=True)
    up.start()
    with contextlib.suppress(OSError, EOFError):
        while data := chan.recv(_CHUNK):
            sock.sendall(data)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    up.join()


class LocalForward:
    """Listens on 127.0.0.1:``local_port`` (0: any free port) and forwards to ``remote`` via the machine."""

    def __init__(self, client: paramiko.SSHClient, local_port: int, remote_host: str, remote_port: int) -> None:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError("the SSH connection is closed")
        try:
            self.server = _ForwardServer(("127.0.0.1", local_port), _ForwardHandler)
        except OSError as e:
            raise RemoteError(f"cannot listen on 127.0.0.1:{local_port}: {e}; pick another local port") from None
        self.server.transport = transport
        self.server.remote = (remote_host, remote_port)
        self.remote_host = remote_host
        self.remote_port = remote_port
        self.local_port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, name=f"forward-{self.local_port}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop listening (connections in flight end with the SSH connection)."""
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LocalForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ForwardSpec:
    """``LOCAL:[HOST:]REMOTE`` as given to ``-L`` (HOST as seen from the machine)."""

    local_port: int
    remote_host: str
    remote_port: int
    label: str = ""

    @classmethod
    def parse(cls, text: str) -> ForwardSpec:
        """Read ``LOCAL:REMOTE`` or ``LOCAL:HOST:REMOTE``; raises ``argparse.ArgumentTypeError``."""
        parts = text.split(":")
        if len(parts) == 2:
            host, (local, remote) = "127.0.0.1", parts
        elif len(parts) == 3:
            local, host, remote = parts
        else:
            raise argparse.ArgumentTypeError(f"{text!r}: expected LOCAL:REMOTE or LOCAL:HOST:REMOTE (e.g. 6006:6006)")
        try:
            lp, rp = int(local), int(remote)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: ports must be numbers (e.g. 8080:80)") from None
        if not (0 <= lp <= 65535 and 1 <= rp <= 65535) or not host:
            raise argparse.ArgumentTypeError(f"{text!r}: local port 0-65535 (0: any free), remote port 1-65535")
        return cls(lp, host, rp)
