"""userdata/rendezvous.sh on its own: who joins a generation, who is in its sealed list.

The functions run in bash as the machines run them (lib.sh and rendezvous.sh sourced, the
fake cloud CLIs on PATH, moto_server / the GCS emulator behind them), without booting.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import boto3
import pytest

from components.userdata import USERDATA_DIR
from devtools.sandbox import settings_for
from runfolder import layout
from tests.userdata.cluster import Machine
from tests.userdata.helpers import wait_for

pytestmark = pytest.mark.slow  # each case runs the scripts and the fake CLIs against the emulators


def bash(box: Machine, script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs `script` with lib.sh and rendezvous.sh sourced and the env loaded, as supervise.sh has them
    (rendezvous.sh as bootstrap.sh installs it from the boot archive: tests/userdata/test_boot_scripts.py)."""
    bin_dir = box.root / "opt/trainstack/bin"
    prelude = (f'set -euo pipefail; . "{bin_dir}/lib.sh"; . "{USERDATA_DIR}/rendezvous.sh"; load_env; '
               f'DEADLINE=$(($(date +%s) + 600)); CLUSTER_POLL_S=0.2; RENDEZVOUS_TTL_S=30; '
               f'WORKER_PORT=$TRAINSTACK_WORKER_PORT; CONTAINER_ENV="$RUNTIME_DIR/container.env"; '
               f'mkdir -p "$RUNTIME_DIR"; : >"$CONTAINER_ENV"; ')
    return subprocess.run(["bash", "-c", prelude + script], env=box.env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def make_machine(tmp_path):
    made: list[Machine] = []

    def make(run, number: int, *, cloud: str = "aws", nodes: int = 2) -> Machine:
        box = Machine(tmp_path / f"m{number}", run, "trainstack-dev", "", number=number,
                      settings=settings_for(cloud), env_overrides={"TRAINSTACK_NODES": str(nodes)})
        made.append(box)
        return box

    yield make
    for box in made:
        box.close()


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_only_the_first_create_of_a_name_succeeds(make_machine, s3_run, gs_run, cloud):
    run = s3_run if cloud == "aws" else gs_run
    box = make_machine(run, 0, cloud=cloud)
    uri = f"{run.uri}/{layout.RENDEZVOUS_PREFIX}gen-0/sealed"
    proc = bash(box, f'echo first | store_create "{uri}"; echo "rc=$?"; '
                     f'rc=0; echo second | store_create "{uri}" || rc=$?; echo "rc=$rc"; store_cat "{uri}"')
    assert proc.stdout.split() == ["rc=0", "rc=1", "first"], proc.stderr
    # The real CLIs' spelling of the condition, and nothing else.
    if cloud == "aws":
        puts = [a for a in box.argvs("aws") if a[:2] == ["s3api", "put-object"]]
        assert len(puts) == 2 and all(a[-2:] == ["--if-none-match", "*"] for a in puts)
    else:
        cps = [a for a in box.argvs("gcloud") if "--if-generation-match=0" in a]
        assert len(cps) == 2


def test_the_fake_cli_refuses_a_condition_the_real_one_does_not_take(make_machine, s3_run):
    box = make_machine(s3_run, 0)
    body = box.tmp / "body"
    body.write_text("x")
    bucket, key = s3_run.bucket, "runs/x/y"
    proc = subprocess.run(["aws", "s3api", "put-object", "--bucket", bucket, "--key", key, "--body", str(body),
                           "--if-none-match", "\"etag\""], env=box.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 254 and "NotImplemented" in proc.stderr
    proc = subprocess.run(["aws", "s3api", "put-object", "--bucket", bucket, "--key", key, "--body", str(body),
                           "--if-not-exists", "true"], env=box.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 252


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_two_machines_joining_at_once_get_one_worker_list(make_machine, s3_run, gs_run, cloud):
    run = s3_run if cloud == "aws" else gs_run
    boxes = [make_machine(run, n, cloud=cloud) for n in (0, 1)]
    script = 'join_generation; cat "$CONTAINER_ENV"; echo "gen=$(cat "$LAST_GENERATION_FILE")"'
    results = []
    threads = [threading.Thread(target=lambda b=b: results.append((b, bash(b, script, timeout=120)))) for b in boxes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert len(results) == 2
    configs = {}
    for box, proc in results:
        assert proc.returncode == 0, proc.stderr
        line = next(x for x in proc.stdout.splitlines() if x.startswith("TF_CONFIG="))
        configs[box.number] = json.loads(line.removeprefix("TF_CONFIG="))
        assert "gen=0" in proc.stdout
    lists = {json.dumps(c["cluster"]["worker"]) for c in configs.values()}
    assert len(lists) == 1
    assert sorted(c["task"]["index"] for c in configs.values()) == [0, 1]
    assert sorted(json.loads(lists.pop())) == sorted(b.endpoint for b in boxes)


def _member(run, gen: int, member: str, endpoint: str, *, age: float = 0, left: bool = False) -> None:
    body = json.dumps({"member": member, "machine": member.rsplit("-", 1)[0], "endpoint": endpoint,
                       "time": time.time() - age, "left": left}) + "\n"  # as lib.sh's json() writes it
    key = f"{run.uri.removeprefix(f's3://{run.bucket}/')}/{layout.RENDEZVOUS_PREFIX}gen-{gen}/members/{member}"
    boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"]).put_object(Bucket=run.bucket, Key=key,
                                                                              Body=body.encode())


def test_live_members_leave_out_stale_heartbeats_and_machines_that_left(make_machine, s3_run):
    box = make_machine(s3_run, 0)
    _member(s3_run, 0, "i-aaa-1", "10.0.0.9:2222")
    _member(s3_run, 0, "i-bbb-1", "10.0.0.30:2222", age=120)  # gone without a word
    _member(s3_run, 0, "i-ccc-1", "10.0.0.4:2222", left=True)  # a notice came while it waited
    _member(s3_run, 0, "i-ddd-1", "10.0.0.10:2222")
    _member(s3_run, 0, "i-eee-1", "10.0.0.5:2222", age=120)  # this machine, its store call slow
    proc = bash(box, "generation_objects 0 | live_members; echo; generation_objects 0 | live_members i-eee-1")
    assert proc.returncode == 0, proc.stderr
    # Sorted as the proposed order: by address, numerically (any one order serves: the sealed one rules).
    others, mine = proc.stdout.split("\n\n")
    assert others.splitlines() == ["10.0.0.9:2222 i-aaa-1 i-aaa", "10.0.0.10:2222 i-ddd-1 i-ddd"]
    # A machine's own heartbeat counts however old it reads; one that left does not.
    assert mine.splitlines() == ["10.0.0.5:2222 i-eee-1 i-eee", "10.0.0.9:2222 i-aaa-1 i-aaa",
                                 "10.0.0.10:2222 i-ddd-1 i-ddd"]


def test_a_machine_with_a_pending_notice_never_joins(make_machine, s3_run):
    box = make_machine(s3_run, 0)
    _member(s3_run, 0, "i-aaa-1", "10.0.0.9:2222")  # a peer waiting for a second machine
    proc = bash(box, 'touch "$NOTICE_FILE"; rc=0; join_generation || rc=$?; echo "rc=$rc JOIN_NOTICE=$JOIN_NOTICE"; '
                     'generation_objects 0 | live_members')
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "rc=1 JOIN_NOTICE=1"
    assert lines[1:] == ["10.0.0.9:2222 i-aaa-1 i-aaa"]  # this machine is not a live member
    assert not [k for k in _keys(s3_run) if k.endswith("/sealed")]


def _keys(run) -> list[str]:
    out = boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"]).list_objects_v2(Bucket=run.bucket)
    return [o["Key"] for o in out.get("Contents", [])]


def test_a_machine_left_out_of_a_sealed_generation_joins_the_next(make_machine, s3_run):
    # Generation 0 was sealed with two other machines (this one came late, or sorts first
    # and would have made its own list): it never runs generation 0, it waits in 1.
    box = make_machine(s3_run, 0)
    sealed = {"generation": 0, "workers": [{"endpoint": "10.0.0.20:2222", "member": "i-a-1", "machine": "i-a"},
                                            {"endpoint": "10.0.0.21:2222", "member": "i-b-1", "machine": "i-b"}]}
    prefix = s3_run.uri.removeprefix(f"s3://{s3_run.bucket}/")
    boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"]).put_object(
        Bucket=s3_run.bucket, Key=f"{prefix}/{layout.RENDEZVOUS_PREFIX}gen-0/sealed", Body=json.dumps(sealed).encode())
    done: list[subprocess.CompletedProcess] = []
    joining = threading.Thread(target=lambda: done.append(bash(box, 'join_generation; cat "$CONTAINER_ENV"', 120)))
    joining.start()
    wait_for(lambda: any(f"gen-1/members/{box.instance_id}-" in k for k in _keys(s3_run)), 60, "its heartbeat in 1")
    assert not any(f"gen-0/members/{box.instance_id}-" in k for k in _keys(s3_run))
    _member(s3_run, 1, "i-a-1", "10.0.0.20:2222")  # a survivor of generation 0 joins 1
    joining.join(timeout=120)
    proc = done[0]
    assert proc.returncode == 0, proc.stderr
    conf = json.loads(proc.stdout.strip().removeprefix("TF_CONFIG="))
    assert sorted(conf["cluster"]["worker"]) == sorted(["10.0.0.20:2222", box.endpoint])
    assert "generation 0 was sealed without this machine: joining 1" in proc.stderr


def test_a_seal_that_fails_is_retried_each_poll_then_ends_with_its_reason(make_machine, s3_run):
    # A CLI without conditional writes (an image's own old awscli): every seal fails for a
    # reason, not because another machine sealed first. Each try waits a poll (no hot loop of
    # S3 calls), and TRAINSTACK_SEAL_TRIES failures in a row end the wait with the CLI's words.
    box = make_machine(s3_run, 0)
    box.env.update({"FAKE_AWS_NO_CONDITIONAL_WRITES": "1", "TRAINSTACK_SEAL_TRIES": "3"})
    _member(s3_run, 0, "i-aaa-1", "10.0.0.9:2222")  # the peer is there: a seal is due
    proc = bash(box, 'rc=0; join_generation || rc=$?; echo "rc=$rc JOIN_FAILED=$JOIN_FAILED"; echo "$JOIN_REASON"',
                timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "rc=5 JOIN_FAILED=5", proc.stderr[-3000:]
    assert lines[1].startswith("could not write generation 0's worker list (3 tries): "), lines[1]
    assert "Unknown options: --if-none-match" in lines[1]
    puts = [a for a in box.argvs("aws") if a[:2] == ["s3api", "put-object"]]
    assert len(puts) == 3, len(puts)
    assert not [k for k in _keys(s3_run) if k.endswith("/sealed")]


def test_a_seal_lost_to_another_machine_reads_that_machines_list(make_machine, s3_run):
    # Two machines see two live members at once: one seal wins, the other is told "exists" and
    # takes the stored list without counting it as a failed seal.
    box = make_machine(s3_run, 0)
    _member(s3_run, 0, "i-aaa-1", "10.0.0.9:2222")
    proc = bash(box, f'''
        seal 0 2 "$(printf '10.0.0.9:2222 i-aaa-1 i-aaa\\n{box.endpoint} me-1 me\\n')"; echo "first=$?"
        rc=0; seal 0 2 "$(printf '10.0.0.9:2222 i-aaa-1 i-aaa\\n')" || rc=$?; echo "second=$rc"''')
    assert proc.stdout.split() == ["first=0", "second=1"], proc.stderr
    assert f"sealed generation 0: 10.0.0.9:2222 {box.endpoint}" in proc.stderr
