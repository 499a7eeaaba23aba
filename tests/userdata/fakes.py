"""Stand-ins for the machine's commands in the boot sandbox: `fakes.py NAME ARGS...`.

Each call is appended to `$FAKE_LOG` as one JSON line (`cmd`, `argv`, `t`) before it acts,
so tests can assert which commands ran, in what order and with which arguments.

- `aws`: the subset of the AWS CLI the boot scripts use (`s3 cp/ls`, `autoscaling
  update-auto-scaling-group`, `ecr get-login-password`), done with boto3 against
  `AWS_ENDPOINT_URL` (moto_server). `$FAKE_STATE/s3-outage-until` makes the bucket not answer
  until that time (`s3-outage-only`: only for calls naming that text); `FAKE_AWS_NO_CONDITIONAL_WRITES=1` is a CLI without `--if-none-match`. The real AWS CLI v1 cannot be installed beside the
  project's botocore pin (every awscli release pins its own botocore).
- `docker`: `run` executes the container's command on the host (the code and pip mounts
  mapped to host paths, `--env-file` read the way docker reads it: values literal), keeps
  a pid per `--name` so `stop --time N` can send SIGTERM, then SIGKILL after N seconds;
  `python -m jupyterlab` (the Jupyter unit) is only recorded (`docker-jupyter`) and returns.
- `nvidia-smi` answers when `FAKE_GPU=1`; `apt-get install nvidia-container-toolkit=…`
  installs a fake `nvidia-ctk` next to this script; the rest record and succeed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_STATE", "/tmp/fake-state"))


def record(name: str, argv: list[str], **extra) -> None:
    line = json.dumps({"cmd": name, "argv": argv, "t": time.time(), **extra}) + "\n"
    fd = os.open(os.environ["FAKE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------- aws


def _s3():
    import boto3

    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def aws(argv: list[str]) -> int:
    args = [a for a in argv if a not in ("--only-show-errors", "--quiet")]
    region = None
    if "--region" in args:
        i = args.index("--region")
        region = args[i + 1]
        del args[i : i + 2]
    service, op, rest = args[0], args[1], args[2:]
    outage, only = STATE / "s3-outage-until", STATE / "s3-outage-only"
    if (service in ("s3", "s3api") and outage.exists() and time.time() < float(outage.read_text())
            and (not only.exists() or any(only.read_text() in a for a in args))):
        # `$FAKE_STATE/s3-outage-until` (epoch seconds): the bucket does not answer until then
        # (only for calls naming `$FAKE_STATE/s3-outage-only`, when that is there).
        print(f'\nCould not connect to the endpoint URL: "{os.environ["AWS_ENDPOINT_URL"]}/"', file=sys.stderr)
        return 255
    if service == "s3" and op == "cp":
        recursive = "--recursive" in rest
        src, dst = [a for a in rest if a != "--recursive"]
        s3 = _s3()
        try:
            if recursive and src.startswith("s3://"):
                bucket, prefix = _split(src)
                for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                    for o in page.get("Contents", []):
                        target = Path(dst) / o["Key"][len(prefix):].lstrip("/")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        s3.download_file(bucket, o["Key"], str(target))
            elif recursive:
                base = Path(src)
                bucket, prefix = _split(dst)
                for p in sorted(base.rglob("*")):
                    if p.is_file():
                        s3.upload_file(str(p), bucket, prefix + str(p.relative_to(base)))
            elif src.startswith("s3://") and dst == "-":
                sys.stdout.buffer.write(s3.get_object(Bucket=_split(src)[0], Key=_split(src)[1])["Body"].read())
            elif src.startswith("s3://"):
                s3.download_file(*_split(src), dst)
            elif src == "-":
                s3.put_object(Bucket=_split(dst)[0], Key=_split(dst)[1], Body=sys.stdin.buffer.read())
            else:
                s3.upload_file(src, *_split(dst))
        except s3.exceptions.ClientError as e:
            print(f"fatal error: {e}", file=sys.stderr)
            return 1
        return 0
    if service == "s3" and op == "ls" and "--recursive" in rest:
        bucket, prefix = _split(next(a for a in rest if a != "--recursive"))
        lines = []
        for page in _s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                lines.append(f"{o['LastModified']:%Y-%m-%d %H:%M:%S} {o['Size']:>10} {o['Key']}")
        if not lines:
            return 1
        print("\n".join(lines))
        return 0
    if service == "s3" and op == "ls":
        bucket, prefix = _split(rest[0])
        out = _s3().list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/")
        lines = [f"                           PRE {p['Prefix'][len(prefix):]}" for p in out.get("CommonPrefixes", [])]
        for o in out.get("Contents", []):
            lines.append(f"{o['LastModified']:%Y-%m-%d %H:%M:%S} {o['Size']:>10} {o['Key'][len(prefix):]}")
        if not lines:
            return 1  # the real CLI: an empty listing exits 1 with nothing on stderr
        print("\n".join(lines))
        return 0
    if service == "s3api" and op == "put-object":
        return _s3api_put_object(rest)
    if service == "autoscaling" and op == "update-auto-scaling-group":
        import boto3

        # `$FAKE_STATE/scale-failures`: how many more calls fail ("always": every one), with the
        # CLI's words for the error in `$FAKE_STATE/scale-error` (AccessDenied when absent).
        failures = STATE / "scale-failures"
        left = failures.read_text().strip() if failures.exists() else "0"
        if left == "always" or int(left) > 0:
            if left != "always":
                failures.write_text(str(int(left) - 1))
            error = STATE / "scale-error"
            print(error.read_text() if error.exists() else
                  "\nAn error occurred (AccessDenied) when calling the UpdateAutoScalingGroup operation: User: "
                  "arn:aws:sts::123456789012:assumed-role/trainstack-machine/i-0 is not authorized to perform: "
                  "autoscaling:UpdateAutoScalingGroup", file=sys.stderr)
            return 254

        opts = dict(zip(rest[::2], rest[1::2], strict=True))
        boto3.client("autoscaling", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=region).update_auto_scaling_group(
            AutoScalingGroupName=opts["--auto-scaling-group-name"],
            MinSize=int(opts["--min-size"]),
            MaxSize=int(opts["--max-size"]),
            DesiredCapacity=int(opts["--desired-capacity"]),
        )
        return 0
    if service == "ec2" and op == "describe-instances":
        import boto3
        import jmespath

        filters, query, i = [], None, 0
        while i < len(rest):
            if rest[i] == "--filters":
                i += 1
                while i < len(rest) and not rest[i].startswith("--"):
                    name, values = rest[i].removeprefix("Name=").split(",Values=")
                    filters.append({"Name": name, "Values": values.split(",")})
                    i += 1
            elif rest[i] == "--query":
                query, i = rest[i + 1], i + 2
            else:
                i += 2  # --output text
        out = boto3.client("ec2", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=region).describe_instances(
            Filters=filters)
        found = jmespath.search(query, out) if query else out
        print("\t".join(str(v) for v in found))  # --output text puts a list on one line
        return 0
    if service == "ecr" and op == "get-login-password":
        print("ecr-token-from-the-instance-role")
        return 0
    print(f"fake aws: unsupported {argv}", file=sys.stderr)
    return 2


def _s3api_put_object(rest: list[str]) -> int:
    """`aws s3api put-object --bucket B --key K --body FILE [--if-none-match '*']`, the way
    CLI v2 takes it: each option is a PutObject parameter in botocore's model (`--if-none-match`
    is `IfNoneMatch`), `--body` is a file path, and a failed condition is the service's
    error (412 PreconditionFailed) with exit 254. moto_server checks the condition."""
    import botocore.session

    members = botocore.session.get_session().get_service_model("s3").operation_model("PutObject").input_shape.members
    if rest == ["--generate-cli-skeleton"]:  # the input's every member, as the CLI prints it (no call)
        print(json.dumps(dict.fromkeys(members, ""), indent=4))
        return 0
    opts = dict(zip(rest[::2], rest[1::2], strict=True))
    if os.environ.get("FAKE_AWS_NO_CONDITIONAL_WRITES") == "1" and "--if-none-match" in opts:
        # A CLI older than S3's conditional writes (an image's own old awscli).
        print("\nusage: aws [options] <command> <subcommand> [<subcommand> ...] [parameters]\n"
              "aws: error: Unknown options: --if-none-match, *", file=sys.stderr)
        return 252
    params = {}
    for flag, value in opts.items():
        name = "".join(part.capitalize() for part in flag.removeprefix("--").split("-"))
        if name not in members or flag not in ("--bucket", "--key", "--body", "--if-none-match"):
            print(f"fake aws: put-object option {flag} is not one the scripts may use", file=sys.stderr)
            return 252
        params[name] = value
    if params.get("IfNoneMatch", "*") != "*":
        print("An error occurred (NotImplemented) when calling the PutObject operation: "
              "If-None-Match takes only *", file=sys.stderr)
        return 254
    s3 = _s3()
    try:
        with open(params.pop("Body"), "rb") as body:
            out = s3.put_object(Body=body.read(), **params)
    except s3.exceptions.ClientError as e:
        print(f"\nAn error occurred ({e.response['Error']['Code']}) when calling the PutObject operation: "
              f"{e.response['Error'].get('Message', '')}", file=sys.stderr)
        return 254
    print(json.dumps({"ETag": out["ETag"]}))
    return 0


# ---------------------------------------------------------------- gcloud


def gcloud(argv: list[str]) -> int:
    """`gcloud storage cp/ls` against STORAGE_EMULATOR_HOST; the rest record and succeed."""
    args = [a for a in argv if a != "--quiet"]
    if args[:2] == ["auth", "print-access-token"]:
        print("ya29.token-from-the-service-account")
        return 0
    if args[:3] == ["storage", "cp", "--help"]:  # the flags the boot scripts look for, as gcloud's help has them
        print("NAME\n    gcloud storage cp - upload, download, and copy Cloud Storage objects\n"
              "FLAGS\n     --if-generation-match=GENERATION\n     --recursive, -R, -r")
        return 0
    if args[0] != "storage":
        return 0  # compute instance-groups managed resize: recorded, no GCE emulator here
    import fnmatch
    import glob

    from google.cloud import storage

    client = storage.Client()

    def split(uri: str):
        bucket, _, key = uri.removeprefix("gs://").partition("/")
        return client.bucket(bucket), key

    op, rest = args[1], args[2:]
    if op == "cat":
        bucket, pattern = split(rest[0])
        prefix = pattern.split("*", 1)[0]
        # `*` matches within one folder, `**` at any depth (gcloud's wildcards).
        deep = pattern.endswith("**")
        blobs = [b for b in client.list_blobs(bucket, prefix=prefix) if fnmatch.fnmatchcase(b.name, pattern)
                 and (deep or "/" not in b.name[len(prefix):])]
        if not blobs:
            print(f"ERROR: (gcloud.storage.cat) The following URLs matched no objects or files:\n-{rest[0]}",
                  file=sys.stderr)
            return 1
        for b in blobs:
            sys.stdout.buffer.write(b.download_as_bytes())
        return 0
    if op == "ls" and rest[0].endswith("**"):
        bucket, prefix = split(rest[0].removesuffix("**"))
        lines = [f"gs://{bucket.name}/{b.name}" for b in client.list_blobs(bucket, prefix=prefix)]
        if not lines:
            print("ERROR: (gcloud.storage.ls) One or more URLs matched no objects.", file=sys.stderr)
            return 1
        print("\n".join(lines))
        return 0
    if op == "ls":
        bucket, prefix = split(rest[0])
        blobs = client.list_blobs(bucket, prefix=prefix, delimiter="/")
        lines = [f"gs://{bucket.name}/{b.name}" for b in blobs]
        lines += [f"gs://{bucket.name}/{p}" for p in sorted(blobs.prefixes)]
        if not lines:
            print("ERROR: (gcloud.storage.ls) One or more URLs matched no objects.", file=sys.stderr)
            return 1
        print("\n".join(lines))
        return 0
    if op == "cp":
        recursive = "--recursive" in rest
        condition = [a for a in rest if a.startswith("--if-generation-match")]
        src, dst = [a for a in rest if a != "--recursive" and a not in condition]
        if condition:
            # `--if-generation-match=0`: create only if absent (GCS checks it atomically; the
            # emulator does not, so this stand-in holds a host-wide lock per object name).
            if condition != ["--if-generation-match=0"] or recursive or src == "-":
                print(f"fake gcloud: unsupported precondition {condition}", file=sys.stderr)
                return 2
            return _gcs_create(client, split(dst), Path(src).read_bytes())
        if recursive:
            bucket, prefix = split(dst)
            for pattern_match in glob.glob(src):
                base = Path(pattern_match)
                for p in [base] if base.is_file() else sorted(base.rglob("*")):
                    if p.is_file():
                        rel = p.name if base.is_file() else f"{base.name}/{p.relative_to(base)}"
                        bucket.blob(prefix + rel).upload_from_filename(str(p))
            return 0
        try:
            if src.startswith("gs://"):
                bucket, key = split(src)
                data = bucket.blob(key).download_as_bytes()
                if dst == "-":
                    sys.stdout.buffer.write(data)
                else:
                    Path(dst).write_bytes(data)
            else:
                bucket, key = split(dst)
                data = sys.stdin.buffer.read() if src == "-" else Path(src).read_bytes()
                bucket.blob(key).upload_from_string(data)
        except Exception as e:  # noqa: BLE001 (the CLI reports any failure as one line)
            print(f"ERROR: (gcloud.storage.cp) {e}", file=sys.stderr)
            return 1
        return 0
    print(f"fake gcloud: unsupported {argv}", file=sys.stderr)
    return 2


def _gcs_create(client, where, data: bytes) -> int:
    import fcntl
    import hashlib
    import tempfile

    bucket, key = where
    lock = Path(tempfile.gettempdir()) / f"fake-gcs-{hashlib.sha256(f'{bucket.name}/{key}'.encode()).hexdigest()[:16]}"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if bucket.blob(key).exists():
            print("ERROR: (gcloud.storage.cp) HTTPError 412: At least one of the pre-conditions you specified "
                  "did not hold.", file=sys.stderr)
            return 1
        bucket.blob(key).upload_from_string(data)
    return 0


# ---------------------------------------------------------------- docker


def _env_file(path: str) -> dict[str, str]:
    env = {}
    for line in Path(path).read_text().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k] = v  # docker takes the value literally: quotes would stay quotes
    return env


def _container_pid(name: str) -> Path:
    return STATE / "containers" / f"{name}.pid"


def docker_run(argv: list[str]) -> int:
    mounts, env, name, workdir, i = {}, {}, None, None, 0
    flags_with_value = {"--name", "--network", "--ipc", "--gpus", "--stop-timeout", "--env-file", "-v", "-e", "-w"}
    while argv[i].startswith("-"):
        flag = argv[i]
        if flag == "--rm":
            i += 1
            continue
        if flag not in flags_with_value:
            print(f"fake docker: unknown flag {flag}", file=sys.stderr)
            return 125
        value = argv[i + 1]
        i += 2
        if flag == "--name":
            name = value
        elif flag == "--env-file":
            env.update(_env_file(value))
            record("docker-env-file", Path(value).read_text().splitlines())
        elif flag == "-v":
            host, container = value.split(":")[:2]
            mounts[container] = host
        elif flag == "-e":
            k, _, v = value.partition("=")
            env[k] = v
        elif flag == "-w":
            workdir = value
    cmd = argv[i + 1 :]  # argv[i] is the image

    def host_path(value: str) -> str:
        for container, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            value = value.replace(container, host)
        return value

    if cmd[:2] == ["sh", "-c"] and "pip install" in cmd[2]:
        # Installing the trainer's requirements: the test's interpreter already has them.
        target = Path(mounts["/opt/trainstack/pip"])
        text = cmd[2].replace("$MORE_REQUIREMENTS", env.get("MORE_REQUIREMENTS", ""))
        (target / "INSTALLED_BY_FAKE_PIP").write_text(text)
        if "requirements-gpu.txt" in text:
            # NVIDIA's wheels unpack their libraries into nvidia/<name>/lib (empty stand-ins here).
            for name in ("cudnn", "cublas"):
                (target / "nvidia" / name / "lib").mkdir(parents=True, exist_ok=True)
        return 0
    if cmd[:3] == ["python", "-m", "jupyterlab"]:
        # The Jupyter unit's server (userdata/jupyter.sh): recorded with the address it binds and
        # the names (not values) of its environment; it "serves" until the unit restarts it.
        record("docker-jupyter", cmd[3:], env_keys=sorted(env), mounts=mounts, container=name)
        return 0
    if cmd[:3] != ["python", "-m", "trainer"]:
        print(f"fake docker: unsupported command {cmd}", file=sys.stderr)
        return 125
    child_env = {**os.environ, **{k: host_path(v) for k, v in env.items()}}
    child_env.pop("FAKE_LOG", None)
    if os.environ.get("FAKE_GPU") == "1" and os.environ.get("FAKE_CHECK_GPUS") != "1":
        # The sandbox's GPU is a fake one that TensorFlow on this CPU cannot see: the trainer's
        # device check (tests/trainer/test_devices.py) would refuse every run. FAKE_CHECK_GPUS=1
        # keeps it, to see a machine whose TensorFlow finds no GPU.
        child_env.pop("TRAINSTACK_GPUS_PER_NODE", None)
    proc = subprocess.Popen([sys.executable, "-m", "trainer", *cmd[3:]], env=child_env,
                            cwd=host_path(workdir) if workdir else None)
    if name:
        _container_pid(name).parent.mkdir(parents=True, exist_ok=True)
        _container_pid(name).write_text(str(proc.pid))
    # docker run proxies signals to the container (--sig-proxy defaults to true).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    rc = proc.wait()
    if name:
        _container_pid(name).unlink(missing_ok=True)
    return 128 - rc if rc < 0 else rc


def docker_stop(argv: list[str]) -> int:
    grace = int(argv[argv.index("--time") + 1]) if "--time" in argv else 10
    name = argv[-1]
    pid_file = _container_pid(name)
    if not pid_file.exists():
        print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
        return 1
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGTERM)

    def running() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return pid_file.exists()

    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and running():
        time.sleep(0.05)
    if running():
        os.kill(pid, signal.SIGKILL)
        record("docker-sigkill", [name])
    while running():
        time.sleep(0.05)
    print(name)
    return 0


def docker(argv: list[str]) -> int:
    sub = argv[0]
    if sub == "run":
        return docker_run(argv[1:])
    if sub == "stop":
        return docker_stop(argv[1:])
    if sub == "image" and argv[1] == "inspect":
        return 0 if (STATE / "images" / argv[2].replace("/", "_")).exists() else 1
    if sub == "pull":
        (STATE / "images").mkdir(parents=True, exist_ok=True)
        (STATE / "images" / argv[-1].replace("/", "_")).write_text("pulled")
        return 0
    if sub == "login":
        password = sys.stdin.read().strip()
        record("docker-login-password", [str(bool(password))])
        return 0 if password else 1
    if sub == "rm":
        return 0
    print(f"fake docker: unsupported {argv}", file=sys.stderr)
    return 125


# ---------------------------------------------------------------- the rest


def apt_get(argv: list[str]) -> int:
    """apt-get as dpkg's lock makes it behave: `$FAKE_STATE/dpkg-lock` holds the time (epoch
    seconds) until which another apt run (the image's first-boot updates) holds the lock.
    Without `-o DPkg::Lock::Timeout=N` apt fails at once; with it, apt waits up to N seconds.
    `$FAKE_STATE/apt-network-failures` holds how many more calls fail as a mirror that does
    not answer."""
    lock = STATE / "dpkg-lock"
    if lock.exists():
        held_until = float(lock.read_text())
        wait = 0.0
        for i, a in enumerate(argv[:-1]):
            if a == "-o" and argv[i + 1].startswith("DPkg::Lock::Timeout="):
                wait = float(argv[i + 1].split("=", 1)[1])
        while time.time() < held_until and wait > 0:
            time.sleep(0.05)
            wait -= 0.05
        if time.time() < held_until:
            print("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1234 (unattended-upgr)",
                  file=sys.stderr)
            return 100
    failures = STATE / "apt-network-failures"
    if failures.exists() and int(failures.read_text() or 0) > 0:
        failures.write_text(str(int(failures.read_text()) - 1))
        print("E: Failed to fetch http://archive.ubuntu.com/ubuntu/dists/jammy/InRelease  "
              "Temporary failure resolving 'archive.ubuntu.com'", file=sys.stderr)
        return 100
    if "install" in argv and any(a.startswith("nvidia-container-toolkit=") for a in argv):
        bin_dir = Path(__file__).parent if os.environ.get("FAKE_BIN") is None else Path(os.environ["FAKE_BIN"])
        ctk = bin_dir / "nvidia-ctk"
        ctk.write_text((bin_dir / "nvidia-smi").read_text().replace(" nvidia-smi ", " nvidia-ctk "))
        ctk.chmod(0o755)
    return 0


def nvidia_ctk(argv: list[str]) -> int:
    if argv[:2] == ["runtime", "configure"]:
        config = next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
        Path(config).parent.mkdir(parents=True, exist_ok=True)
        Path(config).write_text(json.dumps({"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}))
        return 0
    print("NVIDIA Container Toolkit CLI version 1.17.8")
    return 0


def nvidia_smi(argv: list[str]) -> int:
    if os.environ.get("FAKE_GPU") == "1":
        print("GPU 0: NVIDIA A10G (UUID: GPU-00000000-1111-2222-3333-444444444444)")
        return 0
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    return 9


def gpg(argv: list[str]) -> int:
    out = argv[argv.index("-o") + 1]
    data = sys.stdin.buffer.read()
    if b"BEGIN PGP PUBLIC KEY BLOCK" not in data:
        print("gpg: no valid OpenPGP data found.", file=sys.stderr)
        return 2
    Path(out).write_bytes(b"dearmored:" + data)
    return 0


def journalctl(argv: list[str]) -> int:
    print(f"-- journal of {shlex.join(argv)} (sandbox) --")
    return 0


def _mark(kind: str, path: str) -> None:
    (STATE / kind).mkdir(parents=True, exist_ok=True)
    (STATE / kind / path.replace("/", "_")).touch()


def _marked(kind: str, path: str) -> bool:
    return (STATE / kind / path.replace("/", "_")).exists()


def _signature(dev: str) -> str:
    path = STATE / "signatures" / dev.replace("/", "_")
    return path.read_text().strip() if path.exists() else ""


def _blkid(argv: list[str]) -> int:
    """`blkid DEV` / `blkid -o value -s TAG DEV`: 2 when the device holds no signature."""
    dev = argv[-1]
    tags = {"TYPE": _signature(dev)} if _signature(dev) else {}
    if _marked("formatted", dev):
        tags = {"LABEL": "trainstack-data", "TYPE": "ext4"}
    if not tags:
        return 2
    if "-s" in argv:
        tag = argv[argv.index("-s") + 1]
        if tag not in tags:
            return 2
        print(tags[tag])
        return 0
    print(f"{dev}: " + " ".join(f'{k}="{v}"' for k, v in tags.items()))
    return 0


def main() -> int:
    name, argv = sys.argv[1], sys.argv[2:]
    record(name, argv)
    handlers = {"aws": aws, "gcloud": gcloud, "docker": docker, "apt-get": apt_get, "nvidia-ctk": nvidia_ctk,
                "nvidia-smi": nvidia_smi, "gpg": gpg, "journalctl": journalctl}
    # Disks: a formatted device stays formatted; mounts last until the machine powers off.
    # `$FAKE_STATE/signatures/<device>` holds a signature another owner left (blkid's TYPE,
    # e.g. LVM2_member): such a device is refused by `mount`, as the kernel refuses it.
    if name == "mkfs.ext4":
        if os.environ.get("FAKE_MKFS_FAILS") == "1":
            print(f"mke2fs: Device or resource busy while setting up superblock on {argv[-1]}", file=sys.stderr)
            return 1
        _mark("formatted", argv[-1])
        return 0
    if name == "blkid":
        return _blkid(argv)
    if name == "mount":
        dev = argv[-2]
        foreign = _signature(dev)
        if foreign:
            print(f"mount: {argv[-1]}: unknown filesystem type '{foreign}'.", file=sys.stderr)
            return 32
        _mark("mounts", argv[-1])
        _mark("mounted-sources", dev)
        return 0
    if name == "mountpoint":
        return 0 if _marked("mounts", argv[-1]) else 1
    if name == "findmnt":
        return 0 if _marked("mounted-sources", argv[-1]) else 1
    return handlers.get(name, lambda _a: 0)(argv)


if __name__ == "__main__":
    sys.exit(main())
