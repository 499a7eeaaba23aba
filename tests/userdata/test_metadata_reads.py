"""`lib.sh`'s instance metadata reads (`md_get`, `md_read`, `imds_token`), as the notice watcher makes
them every few seconds for a machine's whole life.

It runs in bash as the boot runs it (`load_env` on an env file) against the sandbox's metadata server:
one IMDSv2 token serves every read until it is 21,000 s old or answered 401, a read is one process
(curl) once the token is kept, and a value, an absent path (1) and an error (2) read as before.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from components.userdata import USERDATA_DIR
from devtools.metadata import INSTANCE_ID, MetadataServer


@pytest.fixture
def md():
    server = MetadataServer()
    yield server
    server.close()


def _run(root: Path, md: MetadataServer, script: str, *, cloud: str = "aws", path: str | None = None
         ) -> subprocess.CompletedProcess:
    root.mkdir(exist_ok=True)
    env_file = root / "env"
    env_file.write_text(f"TRAINSTACK_CLOUD={cloud}\nTRAINSTACK_REGION=r\nTRAINSTACK_RUN_URI=s3://b/runs/r\n"
                        "TRAINSTACK_GROUP=g\nTRAINSTACK_IMAGE=i\n")
    env = {"PATH": os.environ["PATH"], "TRAINSTACK_ROOT": str(root), "TRAINSTACK_ENV_FILE": str(env_file),
           "TRAINSTACK_METADATA_URL": md.url}
    # `load_env` first (it makes the folders), then the script on PATH, when given.
    lines = f'set -euo pipefail; . "{USERDATA_DIR / "lib.sh"}"; load_env; '
    if path is not None:
        lines += f'PATH="{path}"; '
    return subprocess.run([os.environ.get("BASH", "/bin/bash"), "-c", lines + script], env=env,
                          capture_output=True, text=True, timeout=60)


def _puts(md: MetadataServer) -> int:
    return [r[0] for r in md.requests].count("PUT")


def test_reads_answer_the_value_absent_or_error_with_one_token(tmp_path, md):
    proc = _run(tmp_path, md, "md_get instance-id; echo; rc=0; md_get spot/instance-action || rc=$?; echo $rc; "
                              "md_read value local-ipv4; echo \"$value\"")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [INSTANCE_ID, "1", "10.0.0.10"]
    assert _puts(md) == 1 and all(ok for _m, _p, ok in md.requests)
    token = tmp_path / "run/trainstack/imds-token"
    assert oct(token.stat().st_mode & 0o777) == "0o600"
    # A later process reads the kept token: no new one.
    assert _run(tmp_path, md, "md_get instance-id").stdout == INSTANCE_ID
    assert _puts(md) == 1
    # GCE: the header, no token.
    gce = _run(tmp_path / "gce", md, "md_get name; echo; rc=0; md_get nothing || rc=$?; echo $rc", cloud="gcp")
    assert gce.stdout.splitlines() == [md.name, "1"], gce.stderr
    assert _puts(md) == 1


def test_a_read_is_one_process_once_the_token_is_kept(tmp_path, md):
    """The watcher's poll: with only curl on PATH, a kept token still reads (no mktemp, cat, date, stat, rm)."""
    assert _run(tmp_path, md, "md_get instance-id").returncode == 0
    only = tmp_path / "only-curl"
    only.mkdir()
    (only / "curl").symlink_to(subprocess.run(["bash", "-c", "command -v curl"], capture_output=True,
                                              text=True).stdout.strip())
    proc = _run(tmp_path, md, "md_get instance-id; rc=0; md_get spot/instance-action || rc=$?; echo \" $rc\"",
                path=str(only))
    assert (proc.returncode, proc.stdout) == (0, f"{INSTANCE_ID} 1\n"), proc.stderr
    assert _puts(md) == 1


def test_an_old_or_refused_token_is_replaced(tmp_path, md):
    token = tmp_path / "run/trainstack/imds-token"
    assert _run(tmp_path, md, "md_get instance-id").returncode == 0
    at, value = token.read_text().split()
    assert abs(int(at) - time.time()) < 60
    # 21,000 s old (of its 21,600): fetched again.
    token.write_text(f"{int(time.time()) - 21_001} {value}\n")
    assert _run(tmp_path, md, "md_get instance-id").stdout == INSTANCE_ID
    assert _puts(md) == 2
    # A token the service refuses (401: it expired early): that read fails (2), the next asks anew.
    token.write_text(f"{int(time.time())} stale\n")
    proc = _run(tmp_path, md, "rc=0; md_get instance-id || rc=$?; echo $rc; [[ -e $RUNTIME_DIR/imds-token ]] || echo gone; "
                              "md_get instance-id")
    assert proc.stdout.splitlines() == ["2", "gone", INSTANCE_ID], proc.stderr
    assert _puts(md) == 3
