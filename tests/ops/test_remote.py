"""`ops logs` and `ops tunnel` (ops/remote.py) over a real OpenSSH sshd on 127.0.0.1, and the SSH
transport under them (ops/ssh.py): host-key checks, streaming, local forwards.

The machine is the ``sshd`` fixture (tests/fixtures/sshd.py): sessions run with a PATH
the tests control, so a fake ``journalctl`` / ``tail`` there stands in for the machine's
logs. Streaming is proven by a follower that only prints its second line after the test
has read the first one.
"""

from __future__ import annotations

import http.client
import http.server
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ops import remote, ssh
from ops.ssh import ForwardSpec, LocalForward, RemoteError, Target
from tests.ops.helpers import ctrl_c_reaches_it

ROOT = Path(__file__).resolve().parents[2]


def target(sshd, **kw) -> Target:
    return Target(sshd.host, port=sshd.port, user=sshd.user, key_path=str(sshd.key_path), **kw)


def ops_cli(*args: str, home: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "ops", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=ctrl_c_reaches_it, **popen,
    )


def ssh_args(sshd) -> list[str]:
    return ["--host", sshd.host, "--port", str(sshd.port), "--user", sshd.user, "--key", str(sshd.key_path)]


def read_line(stream, timeout: float = 20.0) -> bytes:
    """One line from a pipe, failing the test instead of hanging."""
    box: list[bytes] = []
    t = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    assert box, f"no line within {timeout} s"
    return box[0]


# -- logs ------------------------------------------------------------------------------


def test_logs_follow_streams_the_journal_as_it_is_written(sshd, ssh_home, tmp_path):
    args_file, go = tmp_path / "journal-args", tmp_path / "go"
    sshd.fake_tool(
        "journalctl",
        f'printf "%s\\n" "$@" > {args_file}\n'
        'echo "trainer: step 10 loss 0.5"\n'
        # The second line waits for the test to have read the first: proof it streamed.
        f"i=0; while [ ! -e {go} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n"
        'echo "trainer: step 20 loss 0.4"\n',
    )
    try:
        proc = ops_cli("logs", *ssh_args(sshd), "--follow", "--lines", "7", home=ssh_home)
        try:
            first = read_line(proc.stdout)
            assert not go.exists()
            go.touch()
            rest, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        sshd.remove_tool("journalctl")
    assert first == b"trainer: step 10 loss 0.5\n", (first, sshd.log()[-2000:])
    assert rest == b"trainer: step 20 loss 0.4\n", err
    assert proc.returncode == 0, err
    assert args_file.read_text().split() == [
        "-u", "trainstack-trainer.service", "-u", "trainstack-watcher.service", "--no-pager", "-n", "7", "-f",
    ]


def test_logs_fall_back_to_the_log_files_without_journalctl(sshd, ssh_home, tmp_path):
    args_file = tmp_path / "tail-args"
    sshd.remove_tool("journalctl")
    sshd.fake_tool("tail", f'printf "%s\\n" "$@" > {args_file}\necho "==> /var/log/trainstack/boot.log <=="\necho booted\n')
    out = io.BytesIO()
    try:
        client = ssh.connect(target(sshd))
        try:
            rc = ssh.run(client, remote.logs_command(lines=5, follow=False), out)
        finally:
            client.close()
    finally:
        sshd.remove_tool("tail")
    assert rc == 0
    assert out.getvalue() == b"==> /var/log/trainstack/boot.log <==\nbooted\n"
    argv = args_file.read_text().split()
    assert argv[:2] == ["-n", "5"] and argv[2].startswith("/var/log/trainstack/"), argv


def test_run_returns_the_remote_exit_status_and_stderr(sshd, ssh_home):
    out = io.BytesIO()
    client = ssh.connect(target(sshd))
    try:
        rc = ssh.run(client, "echo out; echo err >&2; exit 3", out)
    finally:
        client.close()
    assert (rc, sorted(out.getvalue().split())) == (3, [b"err", b"out"])


def test_run_with_a_terminal_gives_plain_newlines_across_reads(sshd, ssh_home):
    out = io.BytesIO()
    client = ssh.connect(target(sshd))
    try:
        # Enough output to span many reads: no "\r" may survive, wherever the reads split.
        rc = ssh.run(client, 'i=0; while [ $i -lt 4000 ]; do echo "line $i"; i=$((i+1)); done', out, pty=True)
    finally:
        client.close()
    assert rc == 0
    assert out.getvalue() == b"".join(b"line %d\n" % i for i in range(4000))


def test_logs_from_bucket_prints_every_uploaded_file(file_run, capsysbinary):
    from ops.__main__ import main
    from runfolder.storage import open_store

    store = open_store(file_run.uri)
    store.put_bytes("logs/i-0abc/journal.log", b"a1\na2\na3\n")
    store.put_bytes("logs/i-0abc/cloud-init-output.log", b"boot ok")
    store.put_bytes("logs/i-0def/journal.log", b"b1\nb2\n")
    assert main(["logs", "--run-uri", file_run.uri, "--from-bucket", "--lines", "2"]) == 0
    out = capsysbinary.readouterr().out.decode()
    assert out == (
        "==> logs/i-0abc/cloud-init-output.log <==\nboot ok\n"
        "==> logs/i-0abc/journal.log <==\na2\na3\n"
        "==> logs/i-0def/journal.log <==\nb1\nb2\n"
    )


def test_logs_from_bucket_says_when_nothing_was_uploaded(file_run, capsys):
    from ops.__main__ import main

    assert main(["logs", "--run-uri", file_run.uri, "--from-bucket"]) == 1
    err = capsys.readouterr().err
    assert "no logs under" in err and "/logs/" in err


# -- host keys -------------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_a_clear_message(sshd, ssh_home):
    (ssh_home / ".ssh" / "known_hosts").unlink()
    proc = ops_cli("logs", *ssh_args(sshd), home=ssh_home)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out == b""
    message = err.decode().strip()
    assert message.startswith(f"ops logs: host key of [{sshd.host}]:{sshd.port} is unknown"), message
    assert "--accept-new-host-key" in message and len(message.splitlines()) == 1
    assert not (ssh_home / ".ssh" / "known_hosts").exists()


def test_accept_new_host_key_trusts_on_first_use_and_saves_it(sshd, ssh_home):
    known = ssh_home / ".ssh" / "known_hosts"
    known.unlink()
    client = ssh.connect(target(sshd, accept_new_host_key=True))
    client.close()
    assert known.read_text() == sshd.known_hosts_line()
    # Saved: the next connection passes the strict check without the option.
    client = ssh.connect(target(sshd))
    out = io.BytesIO()
    try:
        rc = ssh.run(client, "echo again", out)
    finally:
        client.close()
    assert (rc, out.getvalue()) == (0, b"again\n")


@pytest.mark.parametrize("accept_new", [False, True])
def test_a_changed_host_key_is_always_refused(sshd, ssh_home, tmp_path, accept_new):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = Path(f"{other}.pub").read_text().split()[:2]
    known = ssh_home / ".ssh" / "known_hosts"
    known.write_text(f"[{sshd.host}]:{sshd.port} {kind} {blob}\n")
    with pytest.raises(RemoteError, match="has CHANGED") as info:
        ssh.connect(target(sshd, accept_new_host_key=accept_new))
    assert f"ssh-keygen -R [{sshd.host}]:{sshd.port}" in str(info.value)
    assert known.read_text() == f"[{sshd.host}]:{sshd.port} {kind} {blob}\n"  # nothing added


def test_a_wrong_client_key_is_refused_with_a_clear_message(sshd, ssh_home, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    t = Target(sshd.host, port=sshd.port, user=sshd.user, key_path=str(stranger))
    with pytest.raises(RemoteError, match=r"refused .*check --user and --key"):
        ssh.connect(t)


# -- tunnel ----------------------------------------------------------------------------


class _Echo:
    """A TCP echo server on 127.0.0.1 (what a machine's service looks like from sshd)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


def _round_trip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:

        def send() -> None:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)

        # Read while sending, as a real client does: an echo of a big payload fills every buffer.
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
        sender.join(20)
    return b"".join(chunks)


def test_local_forward_carries_bytes_both_ways_for_parallel_connections(sshd, ssh_home):
    echo = _Echo()
    client = ssh.connect(target(sshd))
    try:
        with LocalForward(client, 0, "127.0.0.1", echo.port) as fwd:
            listening = socket.getaddrinfo("127.0.0.1", fwd.local_port)[0][4]
            assert fwd.server.server_address == listening  # 127.0.0.1 only, never 0.0.0.0
            payloads = [os.urandom(700_000), b"small", os.urandom(65_537)]
            results: dict[int, bytes] = {}

            def go(i: int) -> None:
                results[i] = _round_trip(fwd.local_port, payloads[i])

            threads = [threading.Thread(target=go, args=(i,)) for i in range(len(payloads))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
    finally:
        client.close()
        echo.close()
    assert [results.get(i) == p for i, p in enumerate(payloads)] == [True, True, True]
    assert echo.accepted == 3


def test_tunnel_cli_forwards_http_until_interrupted(sshd, ssh_home):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"tensorboard says hi to {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        protocol_version = "HTTP/1.1"  # keeps the connection open between requests

        def log_message(self, *a):
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    proc = ops_cli("tunnel", *ssh_args(sshd), "-L", f"0:{web.server_address[1]}", home=ssh_home)
    try:
        line = read_line(proc.stdout).decode()
        assert line.startswith("http://127.0.0.1:"), line
        local = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        # As a browser does: both requests on one connection, which stays open afterwards.
        conn = http.client.HTTPConnection("127.0.0.1", local, timeout=20)
        bodies = []
        for i in range(2):
            conn.request("GET", f"/run/{i}")
            bodies.append(conn.getresponse().read())
        # Ctrl-C with the browser's connection still open ends the command at once.
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        web.shutdown()
    assert bodies == [b"tensorboard says hi to /run/0", b"tensorboard says hi to /run/1"]
    assert proc.returncode == 0, err
    assert f"-> 127.0.0.1:{web.server_address[1]} on {sshd.host}" in line
    # The listener is gone with the command.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", local), timeout=2).close()


def test_tunnel_needs_something_to_forward(capsys):
    from ops.__main__ import main

    assert main(["tunnel", "--host", "127.0.0.1"]) == 2
    assert "pass --jupyter or -L LOCAL:REMOTE" in capsys.readouterr().err


def test_tunnel_tensorboard_points_to_ops_tensorboard(capsys):
    from ops.__main__ import main

    assert main(["tunnel", "--host", "127.0.0.1", "--tensorboard"]) == 2
    err = capsys.readouterr().err
    assert "python -m ops tensorboard --stack NAME" in err and len(err.strip().splitlines()) == 1


def _tunnel_with_machine_paths(sshd, home: Path, *, port: int, token_file: Path, jupyter: str) -> subprocess.Popen:
    """`python -m ops tunnel --jupyter` with the machine's Jupyter port and token path moved to
    where this test's stand-ins are (the "machine" is this host, reached through sshd)."""
    code = ("import sys; from ops import remote; "
            f"remote.JUPYTER_PORT = {port}; remote.JUPYTER_TOKEN_FILE = {str(token_file)!r}; "
            "from ops.__main__ import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", code, "tunnel", *ssh_args(sshd), "--jupyter", jupyter],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=ctrl_c_reaches_it)


def test_tunnel_jupyter_prints_the_machines_token_and_forwards_to_it(sshd, ssh_home, tmp_path):
    token = "0123456789abcdef" * 4
    token_file = tmp_path / "token"
    token_file.write_text(token)  # as userdata/jupyter.sh writes it: no newline
    token_file.chmod(0o600)
    seen: list[str] = []

    class Jupyter(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            ok = self.path.endswith(f"token={token}")
            body = b"JupyterLab" if ok else b"403: token missing"
            self.send_response(200 if ok else 403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Jupyter)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    proc = _tunnel_with_machine_paths(sshd, ssh_home, port=web.server_address[1], token_file=token_file, jupyter="0")
    try:
        line = read_line(proc.stdout).decode().strip()
        assert line.startswith("jupyter: http://127.0.0.1:"), line
        url = line.removeprefix("jupyter: ").split(" ")[0]
        import urllib.request

        body = urllib.request.urlopen(url, timeout=20).read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        web.shutdown()
    assert url.endswith(f"/lab?token={token}"), line
    assert body == b"JupyterLab" and seen == [f"/lab?token={token}"]
    assert line.endswith(f"-> 127.0.0.1:{web.server_address[1]} on {sshd.host}")
    assert proc.returncode == 0, err


def test_tunnel_jupyter_without_a_token_on_the_machine_says_how_to_turn_it_on(sshd, ssh_home, tmp_path):
    proc = _tunnel_with_machine_paths(sshd, ssh_home, port=1, token_file=tmp_path / "absent", jupyter="0")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert out == b""
    assert b"no Jupyter token at" in err and b"access.jupyter: true" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["abc", "70000", "-1"])
def test_tunnel_jupyter_local_port_is_checked(capsys, value):
    from ops.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["tunnel", "--host", "127.0.0.1", "--jupyter", value])
    assert e.value.code == 2
    assert "expected a local port 0-65535" in capsys.readouterr().err


def test_forward_to_a_port_nothing_listens_on_drops_only_that_connection(sshd, ssh_home, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    echo = _Echo()
    client = ssh.connect(target(sshd))
    try:
        with LocalForward(client, 0, "127.0.0.1", dead) as bad, LocalForward(client, 0, "127.0.0.1", echo.port) as ok:
            assert _round_trip(bad.local_port, b"hello?") == b""
            assert _round_trip(ok.local_port, b"still fine") == b"still fine"
    finally:
        client.close()
        echo.close()
    assert f"could not open 127.0.0.1:{dead}" in capsys.readouterr().err


# -- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("6006:6006", ForwardSpec(6006, "127.0.0.1", 6006)),
        ("0:8888", ForwardSpec(0, "127.0.0.1", 8888)),
        ("9000:10.0.0.5:80", ForwardSpec(9000, "10.0.0.5", 80)),
    ],
)
def test_forward_spec_parses(text, spec):
    assert ForwardSpec.parse(text) == spec


@pytest.mark.parametrize("text", ["6006", "a:b", "1:2:3:4", "70000:80", "80:0", "80::81"])
def test_forward_spec_refuses_with_the_expected_form(text):
    import argparse
    import re

    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(text))):
        ForwardSpec.parse(text)


@pytest.mark.parametrize(
    ("lines", "follow", "journal", "tail"),
    [
        (100, False, "--no-pager -n 100;", "tail -n 100 /var/log"),
        (0, True, "--no-pager -n 0 -f;", "tail -n 0 -F /var/log"),
    ],
)
def test_logs_command(lines, follow, journal, tail):
    cmd = remote.logs_command(lines=lines, follow=follow)
    assert cmd.startswith("if command -v journalctl")
    assert "journalctl -u trainstack-trainer.service -u trainstack-watcher.service " + journal in cmd
    assert tail in cmd and cmd.endswith("/var/log/trainstack/*.log; fi")


def test_logs_command_refuses_negative_lines():
    with pytest.raises(ValueError, match="lines must be >= 0"):
        remote.logs_command(lines=-1, follow=False)


# -- finding the machines --------------------------------------------------------------


@pytest.fixture
def aws_env(moto_server, monkeypatch):
    """boto3 clients in this process talk to moto_server (ec2, autoscaling)."""
    for k, v in {"AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    return moto_server


@pytest.fixture
def aws_clients(aws_env):
    """(ec2, autoscaling) clients on moto_server."""
    import boto3

    session = boto3.session.Session()
    return session.client("ec2", region_name="us-east-1"), session.client("autoscaling", region_name="us-east-1")


def spot_group(clients, name: str, size: int) -> list[str]:
    """An Auto Scaling group of ``size`` instances on moto; returns their ids."""
    ec2, asg = clients
    ec2.create_launch_template(LaunchTemplateName=f"{name}-lt",
                               LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
    asg.create_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, MaxSize=size, DesiredCapacity=size,
                                  LaunchTemplate={"LaunchTemplateName": f"{name}-lt", "Version": "$Latest"},
                                  AvailabilityZones=["us-east-1a"])
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return [i["InstanceId"] for i in groups[0]["Instances"]]


@pytest.mark.slow  # the first EC2 call loads moto's AMI catalogue
def test_aws_hosts_are_the_groups_running_instances(aws_clients):
    import uuid

    from ops import hosts

    group = f"trainstack-{uuid.uuid4().hex[:8]}"
    mine = spot_group(aws_clients, group, 3)
    spot_group(aws_clients, f"{group}-other", 1)  # another stack's machine: never listed
    aws_clients[0].stop_instances(InstanceIds=[mine[0]])
    found = hosts.aws_hosts(group, "us-east-1")
    assert sorted(h.name for h in found) == sorted(mine[1:])
    for h in found:
        assert h.address() == h.public_ip and h.address(private=True) == h.private_ip
        assert h.private_ip.startswith("10.") and h.zone == "us-east-1a"


def test_stack_machines_come_from_the_stack_outputs(aws_clients, tmp_path, monkeypatch):
    import argparse
    import uuid

    from ops import hosts
    from tests.ops.test_status import fake_pulumi

    group = f"trainstack-{uuid.uuid4().hex[:8]}"
    ids = spot_group(aws_clients, group, 2)
    fake_pulumi(tmp_path / "bin", {"runUri": "s3://b/runs/dev", "groupName": group, "region": "us-east-1"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    found = {h.name: h for h in hosts.stack_hosts("dev")}
    assert sorted(found) == sorted(ids)
    public = hosts.machine_addresses(argparse.Namespace(host=None, stack="dev", private=False))
    private = hosts.machine_addresses(argparse.Namespace(host=None, stack="dev", private=True))
    assert sorted(public) == sorted(h.public_ip for h in found.values())
    assert sorted(private) == sorted(h.private_ip for h in found.values())
    assert set(public).isdisjoint(private) and len(public) == 2


def test_a_stack_without_running_machines_says_so(aws_env, tmp_path, monkeypatch):
    import argparse

    from ops import hosts
    from tests.ops.test_status import fake_pulumi

    fake_pulumi(tmp_path / "bin", {"runUri": "s3://b/runs/dev", "groupName": "no-such-group", "region": "us-east-1"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(hosts.HostsError, match="stack dev has no running machine"):
        hosts.machine_addresses(argparse.Namespace(host=None, stack="dev", private=False))


def test_gcp_hosts_from_gcloud(tmp_path, monkeypatch):
    from ops import hosts

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    listing = [
        {"name": "trainstack-dev-b2c3", "zone": "https://x/projects/p/zones/europe-west4-b",
         "creationTimestamp": "2026-01-02T00:00:00Z",
         "networkInterfaces": [{"networkIP": "10.0.0.3", "accessConfigs": [{"natIP": "34.1.2.3"}]}]},
        {"name": "trainstack-dev-a1b2", "zone": "https://x/projects/p/zones/europe-west4-a",
         "creationTimestamp": "2026-01-01T00:00:00Z", "networkInterfaces": [{"networkIP": "10.0.0.2"}]},
    ]
    (bin_dir / "out.json").write_text(json.dumps(listing))
    (bin_dir / "gcloud").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {bin_dir}/args\ncat {bin_dir}/out.json\n')
    (bin_dir / "gcloud").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    found = hosts.gcp_hosts("trainstack-dev", "europe-west4")
    assert [(h.name, h.public_ip, h.private_ip, h.zone) for h in found] == [
        ("trainstack-dev-a1b2", None, "10.0.0.2", "europe-west4-a"),
        ("trainstack-dev-b2c3", "34.1.2.3", "10.0.0.3", "europe-west4-b"),
    ]
    args = (bin_dir / "args").read_text().splitlines()
    assert args == ["compute", "instances", "list", "--format=json",
                    "--filter=name~'^trainstack\\-dev-[a-z0-9]{4}$' AND status=RUNNING "
                    "AND zone~'/zones/europe\\-west4-'"]
    with pytest.raises(hosts.HostsError, match="no public IP; reach it over a VPN with --private"):
        found[0].address()
