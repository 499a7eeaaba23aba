"""The warm server for the sandbox's fake cloud CLIs (devtools/cli_server.py) answers as the
plain fake process does: same output, exit code, pipes and environment, call by call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from devtools import cli_server
from devtools.sandbox import FAKES
from tests.userdata.helpers import wait_for


def _tools(tmp_path, run) -> tuple[dict[str, str], dict[str, str]]:
    """The same `aws` as a plain process and through the server: {mode: wrapper path}, env."""
    paths = {}
    for mode, text in (("plain", f'#!/bin/sh\nexec "{sys.executable}" "{FAKES}" aws "$@"\n'),
                       ("served", cli_server.wrapper("aws", FAKES))):
        path = tmp_path / f"aws-{mode}"
        path.write_text(text)
        path.chmod(0o755)
        paths[mode] = str(path)
    env = {**run.env, "FAKE_LOG": str(tmp_path / "calls.jsonl"), "FAKE_STATE": str(tmp_path),
           "FAKE_CLI_SOCKET": cli_server.ensure_server()}
    return paths, env


def test_a_served_call_answers_as_the_plain_process(tmp_path, s3_run):
    paths, env = _tools(tmp_path, s3_run)
    seen = {}
    for mode, aws in paths.items():
        key = f"{s3_run.uri}/{mode}.txt"
        put = subprocess.run([aws, "s3", "cp", "-", key], input=b"bytes from stdin\n", env=env, capture_output=True)
        got = subprocess.run([aws, "s3", "cp", key, "-"], env=env, capture_output=True)
        missing = subprocess.run([aws, "s3", "cp", f"{s3_run.uri}/nothing-here", "-"], env=env, capture_output=True)
        seen[mode] = [(p.returncode, p.stdout, p.stderr) for p in (put, got, missing)]
    assert seen["served"] == seen["plain"]
    assert seen["served"][1] == (0, b"bytes from stdin\n", b"")
    assert seen["served"][2][0] != 0 and b"NoSuchKey" in seen["served"][2][2]


def test_each_served_call_takes_its_own_environment(tmp_path, s3_run):
    # The endpoint, the credentials and the fakes' own files are the caller's, never the
    # previous call's: a call with a dead endpoint fails, the next one with the live one works.
    paths, env = _tools(tmp_path, s3_run)
    aws, key = paths["served"], f"{s3_run.uri}/env.txt"
    dead = {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
            "FAKE_LOG": str(tmp_path / "dead.jsonl")}
    outcomes = [subprocess.run([aws, "s3", "cp", "-", key], input=b"x", env=e, capture_output=True, timeout=120)
                .returncode for e in (env, dead, env)]
    assert outcomes[0] == 0 and outcomes[1] != 0 and outcomes[2] == 0, outcomes
    assert len((tmp_path / "calls.jsonl").read_text().splitlines()) == 2
    assert len((tmp_path / "dead.jsonl").read_text().splitlines()) == 1


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_a_call_whose_caller_is_killed_ends(tmp_path, s3_run):
    # `timeout` or a power-off kills the caller: the call it was making must not live on.
    paths, env = _tools(tmp_path, s3_run)
    server = cli_server._server[0].pid
    before = set(_children(server))  # an earlier call's child may not be reaped yet
    read, write = os.pipe()  # stdin that never ends: the upload waits on it
    caller = subprocess.Popen([paths["served"], "s3", "cp", "-", f"{s3_run.uri}/never.txt"], stdin=read, env=env)
    os.close(read)
    try:
        call = wait_for(lambda: set(_children(server)) - before, 60, "the server's child for the call")
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=30)
        wait_for(lambda: not call & set(_children(server)), 60, "the orphaned call to end")
    finally:
        os.close(write)


def test_a_call_without_credentials_gets_none_from_the_server(tmp_path, s3_run):
    # The server builds a client of each service before it forks (devtools/cli_server.py
    # `_warm_up`, with credentials of its own, then dropped): a call whose environment holds
    # none must fail as the plain process fails, never sign with the warm-up's or a caller's.
    paths, env = _tools(tmp_path, s3_run)
    bare = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    bare.update({"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    key = f"{s3_run.uri}/creds.txt"
    assert subprocess.run([paths["served"], "s3", "cp", "-", key], input=b"x", env=env, timeout=120).returncode == 0
    seen = {mode: subprocess.run([aws, "s3", "cp", key, "-"], env=bare, capture_output=True, timeout=120)
            for mode, aws in paths.items()}
    assert seen["served"].returncode == seen["plain"].returncode != 0, seen
    assert b"Unable to locate credentials" in seen["served"].stderr, seen["served"].stderr[-2000:]
    assert seen["served"].stdout == seen["plain"].stdout == b""
