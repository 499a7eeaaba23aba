"""A stand-in for the trainer under MultiWorkerMirroredStrategy, for the several-machine scenarios.

Shipped as `trainer/__main__.py` in a code archive (tests/userdata/cluster.py), it behaves as
the real trainer does towards the machine, in a fraction of a second per step instead of
TensorFlow's start-up, so the scenarios where the real trainer adds nothing stay cheap:

- workers from `TF_CONFIG`; worker 0 (the chief) listens on its endpoint, the others
  connect to it. A cluster not formed within `TRAINSTACK_STARTUP_TIMEOUT` exits 75
  (EXIT_NO_CLUSTER); a peer whose connection closes (on a read or a write) or goes silent exits 76 (EXIT_PEER_LOST);
- each step, the chief asks every worker whether it has been signalled; a signal on any
  worker stops all of them after the same step, the chief commits that step first
  (checkpoints/ckpt-<step>/COMMITTED) and all exit 143;
- the chief resumes from the newest committed step, commits every
  `TRAINSTACK_CHECKPOINT_EVERY_STEPS`, writes `events.jsonl` (started with its workers,
  resumed, preempted, finished) and, `FAKE_EXPORT_S` seconds after the last step (the
  model export), COMPLETE; the others exit 0 at the last step without waiting.
"""

import json
import os
import signal
import socket
import sys
import time

import boto3

EXIT_NO_CLUSTER, EXIT_PEER_LOST, EXIT_PREEMPTED = 75, 76, 143

conf = json.loads(os.environ["TF_CONFIG"])
workers, index = conf["cluster"]["worker"], conf["task"]["index"]
steps = int(os.environ["TRAINSTACK_STEPS"])
every = int(os.environ.get("TRAINSTACK_CHECKPOINT_EVERY_STEPS") or 10)
startup = float(os.environ.get("TRAINSTACK_STARTUP_TIMEOUT", "600"))
step_s = float(os.environ.get("FAKE_STEP_S", "0.05"))
bucket, _, prefix = os.environ["TRAINSTACK_RUN_URI"].removeprefix("s3://").partition("/")
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
signalled = False


def on_term(_sig, _frame):
    global signalled
    signalled = True


signal.signal(signal.SIGTERM, on_term)


def say(msg: str) -> None:
    print(f"cluster-trainer[{index}/{len(workers)}]: {msg}", file=sys.stderr, flush=True)


def endpoint(i: int) -> tuple[str, int]:
    host, _, port = workers[i].rpartition(":")
    return host, int(port)


def event(name: str, **fields) -> None:
    key = f"{prefix}/events.jsonl"
    try:
        old = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        old = b""
    line = json.dumps({"event": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()), **fields})
    s3.put_object(Bucket=bucket, Key=key, Body=old + line.encode() + b"\n")


def newest_committed() -> int:
    found = [-1]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/checkpoints/"):
        for o in page.get("Contents", []):
            name = o["Key"].removeprefix(f"{prefix}/checkpoints/")
            if name.startswith("ckpt-") and name.endswith("/COMMITTED"):
                found.append(int(name.split("/")[0].removeprefix("ckpt-")))
    return max(found)


def commit(step: int) -> None:
    s3.put_object(Bucket=bucket, Key=f"{prefix}/checkpoints/ckpt-{step}/COMMITTED", Body=b"{}")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/progress.json", Body=json.dumps({"step": step}).encode())


def lost(msg: str) -> None:
    say(f"peer lost: {msg}")
    sys.exit(EXIT_PEER_LOST)


def readline(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(1)
        except OSError as e:  # reset, or silent past the timeout
            lost(str(e))
        if not chunk:
            lost("connection closed")
        data += chunk
    return data.decode().strip()


def send(conn: socket.socket, text: str) -> None:
    try:
        conn.sendall(text.encode())
    except OSError as e:  # reset or broken pipe: the peer is gone (its machine was taken)
        lost(str(e))


def chief() -> int:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(endpoint(0))
    listener.listen()
    listener.settimeout(startup)
    peers = []
    try:
        while len(peers) < len(workers) - 1:
            conn, _ = listener.accept()
            conn.settimeout(10)
            peers.append(conn)
    except TimeoutError:
        say(f"the cluster did not form in {startup}s: waited for {workers}")
        return EXIT_NO_CLUSTER
    step = newest_committed()
    step = max(step, 0)
    event("started", workers=workers)
    if step:
        event("resumed", step=step)
    while step < steps:
        time.sleep(step_s)
        step += 1
        for conn in peers:
            send(conn, f"step {step}\n")
        stop = signalled
        for conn in peers:
            stop = readline(conn) == "stop" or stop
        if stop or step % every == 0 or step == steps:
            commit(step)
        verdict = "stop" if stop else "done" if step == steps else "go"
        for conn in peers:
            send(conn, f"{verdict} {step}\n")
        if stop:
            event("preempted", step=step)
            say(f"stopped after step {step}")
            return EXIT_PREEMPTED
    time.sleep(float(os.environ.get("FAKE_EXPORT_S", "0")))
    event("finished", step=step)
    s3.put_object(Bucket=bucket, Key=f"{prefix}/COMPLETE", Body=json.dumps({"step": step, "attempts": 1}).encode())
    return 0


def worker() -> int:
    deadline = time.monotonic() + startup
    while True:
        try:
            conn = socket.create_connection(endpoint(0), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                say(f"the cluster did not form in {startup}s: waited for {workers[0]}")
                return EXIT_NO_CLUSTER
            time.sleep(0.2)
    conn.settimeout(30)
    while True:
        kind, _, step = readline(conn).partition(" ")
        if kind == "step":
            send(conn, "stop\n" if signalled else "ok\n")
        elif kind == "stop":
            say(f"stopped with the others after step {step}")
            return EXIT_PREEMPTED
        elif kind == "done":
            return 0


say(f"starting as worker {index} of {workers}")
sys.exit(chief() if index == 0 else worker())
