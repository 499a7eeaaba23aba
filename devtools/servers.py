"""Local stand-ins as child processes on 127.0.0.1: moto_server (S3), gcp-storage-emulator (GCS), an OCI
registry (Debian's `docker-registry`, distribution 2.8.2), free ports; and `Run`, a run root on one of them.

`tests/fixtures/emulators.py` wraps these in pytest fixtures; `bench/` starts them directly,
so the two start them one way. A server is found only through the URL it is given
(`AWS_ENDPOINT_URL`, `STORAGE_EMULATOR_HOST`), and its own process sees none of the
caller's `AWS_*` or `STORAGE_EMULATOR*` variables.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devtools.fault_proxy import FaultProxy

START_TIMEOUT_S = 60.0
# What a client of moto_server needs besides its endpoint (any keys do; these are moto's own).
AWS_VARS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class Run:
    """A run root on one of these servers (or on local files): its URI and what a client needs to reach it."""

    uri: str
    bucket: str | None = None
    vars: dict[str, str] = field(default_factory=dict)
    proxy: FaultProxy | None = None

    @property
    def env(self) -> dict[str, str]:
        """The current environment plus this run's variables, for subprocesses."""
        return {**os.environ, **self.vars}


def free_port() -> int:
    """A port free on 127.0.0.1 just now (the caller binds it next; it can be taken meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 just now (the workers bind them next)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def venv_tool(name: str) -> str:
    """Path of a console script installed next to this interpreter, else from PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed; pip install -r requirements-dev.txt")
    return found


class Server:
    """A child process serving HTTP on a port, started and waited for, stopped on close.

    `.url` is `http://127.0.0.1:<port>`; the process's output goes to a temporary log,
    shown in the error when it does not answer within `START_TIMEOUT_S`.
    """

    def __init__(self, name: str, argv_for_port: Callable[[int], list[str]], probe_path: str) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)  # noqa: SIM115
        last_error = ""
        for _ in range(3):  # a free port can be taken between probing and binding: try again
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STORAGE_EMULATOR"))}
            self.proc = subprocess.Popen(
                argv_for_port(port), stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    urllib.request.urlopen(self.url + probe_path, timeout=2).close()  # noqa: S310 (our own http:// URL)
                    return
                except urllib.error.HTTPError:
                    return  # it answered, even if with an error status
                except OSError as e:
                    last_error = str(e)
                    time.sleep(0.1)
            self.close(keep_log=True)
        with open(self.log.name, errors="replace") as f:
            tail = f.read()[-2000:]
        self.close()
        raise RuntimeError(f"{name} did not answer on {self.url}: {last_error}\n{tail}")

    def close(self, *, keep_log: bool = False) -> None:
        """Stop the process (terminate, then kill) and, unless asked to keep it, drop its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if not keep_log:
            self.log.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log.name)


def start_moto_server() -> Server:
    """Start `moto_server` (S3) on a free port of 127.0.0.1; `.url` is its endpoint, `.close()` stops it."""
    exe = venv_tool("moto_server")
    return Server("moto_server", lambda port: [exe, "-H", "127.0.0.1", "-p", str(port)], "/")


def start_gcs_emulator() -> Server:
    """Start `gcp-storage-emulator` in memory on a free port of 127.0.0.1; `.url` is its host URL."""
    exe = venv_tool("gcp-storage-emulator")
    return Server("gcp-storage-emulator",
                  lambda port: [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory", "-q"],
                  "/storage/v1/b")


def start_registry(root: Path) -> Server:
    """Start Debian's `docker-registry` (distribution) on a free port of 127.0.0.1, its blobs under `root`;
    `.url` is its base URL, and `127.0.0.1:<port>/<name>` an image repository on it (plain HTTP)."""
    exe = shutil.which("docker-registry")
    if not exe:
        raise RuntimeError("docker-registry is not installed; run .ci/setup (Debian package docker-registry)")

    def argv(port: int) -> list[str]:
        config = root / f"registry-{port}.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
            f"http:\n  addr: 127.0.0.1:{port}\n"
        )
        return [exe, "serve", str(config)]

    return Server("docker-registry", argv, "/v2/")
