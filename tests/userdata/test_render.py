"""The rendered `#cloud-config`: valid for cloud-init, says the right things, fits EC2's limit,
and every script it installs passes shellcheck (run on the rendered copies, which are
what machines execute)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from components.code import BOOT_SCRIPTS
from components.settings import load_stack_file
from components.userdata import (
    AWS_USER_DATA_LIMIT,
    BOOT_ENV_KEYS,
    ENV_FILE,
    FEDERATION_FILES,
    FILES,
    USERDATA_DIR,
    boot_env,
    decode_user_data,
    encode_user_data,
    gcs_store_env,
    render_env,
    render_user_data,
    shipped,
)
from devtools.sandbox import settings_for
from tests.userdata.helpers import installed_scripts, shellcheck

ROOT = Path(__file__).resolve().parents[2]
STACKS = sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))


def _settings(name: str):
    if name.startswith("stack:"):
        return load_stack_file(ROOT / "stacks" / name.removeprefix("stack:"))
    return settings_for(name.removesuffix(ACROSS))


# An AWS machine whose run folder is in GCS (a GCP-home stack's AWS placement): federation-gcp.sh beside the rest.
ACROSS = "+gcs"
CASES = [f"stack:{p.name}" for p in STACKS] + ["aws", "gcp", f"aws{ACROSS}"]


def _render(name: str) -> tuple[str, dict]:
    s = _settings(name)
    scheme = "s3" if s.cloud == "aws" and not name.endswith(ACROSS) else "gs"
    env = boot_env(s, run_uri=f"{scheme}://bucket-x/runs/{s.run_id}", group=f"trainstack-{s.stack}",
                   code_uri=f"{scheme}://bucket-x/code/trainer-0123456789abcdef.tar.gz",
                   boot_uri=f"{scheme}://bucket-x/code/boot-0123456789abcdef.tar.gz")
    if name.endswith(ACROSS):
        env.update(gcs_store_env(
            audience="//iam.googleapis.com/projects/418026337123/locations/global/workloadIdentityPools/trainstack-x"
                     "/providers/aws-p1", service_account="trainstack-x-p1@home-proj.iam.gserviceaccount.com"))
    return render_user_data(s.cloud, env), env


def _installed(name: str) -> tuple[tuple[str, str, str], ...]:
    return FILES + (FEDERATION_FILES["gcp"] if name.endswith(ACROSS) else ())


@pytest.mark.parametrize("name", CASES)
def test_document_passes_cloud_init_schema(name, tmp_path):
    text, _env = _render(name)
    path = tmp_path / "user-data.yaml"
    path.write_text(text)
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Valid cloud-config" in proc.stdout


@pytest.mark.parametrize("name", CASES)
def test_document_installs_scripts_units_env_and_enables_units(name):
    text, env = _render(name)
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    assert set(doc) == {"write_files", "runcmd"}
    files = {f["path"]: f for f in doc["write_files"]}
    assert list(files) == [ENV_FILE] + [path for _n, path, _m in _installed(name)]
    for name_, path, mode in _installed(name):
        assert files[path]["content"] == shipped(name_)
        assert files[path]["permissions"] == mode and files[path]["owner"] == "root:root"
    assert files[ENV_FILE]["content"] == render_env(env)
    # The scripts appear as literal blocks, readable in the console's user data view.
    assert "  content: |\n    #!/usr/bin/env bash\n    # trainstack supervisor" in text
    assert doc["runcmd"] == [["systemctl", "daemon-reload"],
                             ["systemctl", "enable", "--now", "--no-block",
                              "trainstack-watcher.service", "trainstack-trainer.service"]]
    for unit in ("trainstack-trainer.service", "trainstack-watcher.service"):
        content = files[f"/etc/systemd/system/{unit}"]["content"]
        assert "WantedBy=multi-user.target" in content  # enabled units start on every boot
    assert "ExecStart=/opt/trainstack/bin/supervise.sh" in files["/etc/systemd/system/trainstack-trainer.service"]["content"]


@pytest.mark.parametrize("name", CASES)
def test_env_file_holds_the_contract_and_no_secrets(name):
    text, env = _render(name)
    s = _settings(name)
    assert set(BOOT_ENV_KEYS) <= set(env)
    assert env["TRAINSTACK_CLOUD"] == s.cloud
    assert env["TRAINSTACK_NOTICE_GRACE_S"] == {"aws": "100", "gcp": "25"}[s.cloud]
    assert env["TRAINSTACK_MAX_RUNTIME_S"] == str(int(s.compute.max_runtime_hours * 3600))
    assert env["TRAINSTACK_IMAGE"] == s.image.reference
    env_text = yaml.safe_load(text)["write_files"][0]["content"]
    checked = 0
    for word in ("SECRET", "PASSWORD", "PRIVATE KEY", "ACCESS_KEY", "TOKEN", "CREDENTIAL"):
        assert word not in env_text.upper(), word
        checked += 1
    assert checked == 6
    # No credentials anywhere in the document: no access key ids, no key material.
    assert not __import__("re").search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text)
    assert "BEGIN" not in text


def test_user_data_fits_ec2_limit_gzipped_and_round_trips(monkeypatch):
    sizes = []
    for name in CASES:
        text, _env = _render(name)
        encoded = encode_user_data(text)
        assert decode_user_data(encoded) == text
        sizes.append(len(__import__("base64").b64decode(encoded)))
    assert len(sizes) == len(CASES) and max(sizes) < AWS_USER_DATA_LIMIT, sizes
    # No timestamp: the same text gives the same bytes at any time, or every `pulumi up` would
    # replace the launch template. Two encodings made in the same second prove nothing, so the
    # clock gzip reads is moved a day between them; the header's MTIME field itself is zero.
    import base64
    import gzip
    import struct
    import types

    clock = [1_700_000_000.0]
    monkeypatch.setattr(gzip, "time", types.SimpleNamespace(time=lambda: clock[0]))
    first = encode_user_data("#cloud-config\n")
    clock[0] += 86_400.0
    assert encode_user_data("#cloud-config\n") == first
    header = base64.b64decode(first)[:10]
    assert header[:2] == b"\x1f\x8b" and struct.unpack("<L", header[4:8]) == (0,), header
    assert decode_user_data(__import__("base64").b64encode(b"#cloud-config\n").decode()) == "#cloud-config\n"


@pytest.mark.parametrize("name", [c for c in CASES if _settings(c).cloud == "aws"])
def test_every_optional_part_of_the_user_data_fits_ec2_with_room_left(name):
    # Jupyter on a group of several machines went past EC2's 16 KiB when bootstrap.sh and rendezvous.sh
    # were in the document too: each stack's user data with every option it may turn on keeps 3.5 KiB free (an AWS machine of a GCS home with Jupyter: 12.4 KB of 16 KiB).
    _text, env = _render(name)
    sizes = {}
    for nodes in ("1", "2"):
        for jupyter in ("0", "1"):
            e = {**env, "TRAINSTACK_NODES": nodes, "TRAINSTACK_JUPYTER": jupyter}
            sizes[nodes, jupyter] = len(__import__("base64").b64decode(encode_user_data(render_user_data("aws", e))))
    assert len(sizes) == 4 and max(sizes.values()) <= AWS_USER_DATA_LIMIT - 3584, sizes


def test_every_machine_needs_its_boot_archive():
    _text, env = _render("aws")
    with pytest.raises(ValueError, match="TRAINSTACK_BOOT_URI is empty"):
        render_user_data("aws", {**env, "TRAINSTACK_BOOT_URI": ""})
    text = render_user_data("aws", {**env, "TRAINSTACK_BOOT_URI": "s3://b/code/boot-1.tar.gz"})
    assert "TRAINSTACK_BOOT_URI='s3://b/code/boot-1.tar.gz'" in text


def test_render_refuses_bad_input():
    _text, env = _render("aws")
    with pytest.raises(ValueError, match="cloud must be aws or gcp"):
        render_user_data("azure", env)
    with pytest.raises(ValueError, match="env is for 'aws'"):
        render_user_data("gcp", env)
    with pytest.raises(ValueError, match="lacks TRAINSTACK_GROUP"):
        render_user_data("aws", {k: v for k, v in env.items() if k != "TRAINSTACK_GROUP"})
    # A quote is carried (written '\'' in the env file); a line break cannot be, in docker's --env-file.
    with pytest.raises(ValueError, match="may not contain newlines"):
        render_user_data("aws", {**env, "TRAINSTACK_GROUP": "two\nlines"})


@pytest.mark.parametrize("name", ["aws", "gcp", f"aws{ACROSS}"])
def test_rendered_scripts_pass_shellcheck(name, tmp_path):
    text, _env = _render(name)
    scripts = installed_scripts(text, tmp_path)
    # The document's five (six with federation-gcp.sh), and the boot archive's three, which boot_scripts
    # installs beside them.
    assert len(scripts) == sum(1 for n, _p, _m in _installed(name) if n.endswith(".sh")) + len(BOOT_SCRIPTS) == (
        9 if name.endswith(ACROSS) else 8)
    code, output = shellcheck([p.name for p in scripts], tmp_path)
    assert code == 0, output
    for path in scripts:
        body = path.read_text()
        assert "set -euo pipefail" in body or "set -Eeuo pipefail" in body or path.name in (
            "lib.sh", "rendezvous.sh", "progress.sh", "federation-gcp.sh")  # sourced, never run


@pytest.mark.slow
def test_ops_synth_dev_user_data_passes_schema_and_shellcheck(tmp_path):
    from ops.synth import synthesize

    result = synthesize(ROOT / "stacks" / "Pulumi.dev.yaml")
    assert len(result.user_data) == 1
    text = next(iter(result.user_data.values()))
    path = tmp_path / "user-data.yaml"
    path.write_text(text)
    schema = subprocess.run(["cloud-init", "schema", "--config-file", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert schema.returncode == 0, schema.stdout + schema.stderr
    scripts = installed_scripts(text, tmp_path)
    assert len(scripts) == 8
    code, output = shellcheck([p.name for p in scripts], tmp_path)
    assert code == 0, output


@pytest.mark.parametrize("name", [n for n, _p, _m in FILES + FEDERATION_FILES["aws"] + FEDERATION_FILES["gcp"]
                                  if n.endswith(".sh")])
def test_shipped_scripts_lose_only_their_whole_line_comments(name):
    source = (USERDATA_DIR / name).read_text().splitlines()
    kept = shipped(name).splitlines()
    dropped = [line for line in source if line not in kept]
    assert dropped and all(line.lstrip().startswith("#") for line in dropped)
    assert kept[:2] == source[:2]  # the shebang (or shell line) and the title
    code = [line for line in source if not line.lstrip().startswith("#")]
    assert [line for line in kept if not line.lstrip().startswith("#")] == code
    assert [line for line in source if line.lstrip().startswith("# shellcheck")] == [
        line for line in kept[2:] if line.lstrip().startswith("#")] or kept[0].startswith("# shellcheck")


@pytest.mark.parametrize("name", ["aws", "gcp", f"aws{ACROSS}"])
def test_cloud_init_itself_holds_the_nvidia_driver_before_apts_timers(name, tmp_path):
    """The unattended-upgrades drop-in is in the document (write_files, cloud-init's network stage, before
    sysinit.target and so before any apt timer), not written by bootstrap after network-online, when
    apt-daily-upgrade may already have started unattended-upgrades, which reads its configuration once."""
    import re

    from components.userdata import APT_HOLD

    text, _env = _render(name)
    files = {f["path"]: f for f in yaml.safe_load(text)["write_files"]}
    dropin = files["/etc/apt/apt.conf.d/51trainstack-hold-nvidia"]
    assert APT_HOLD[1] == dropin["path"] and dropin["permissions"] == "0644" and dropin["owner"] == "root:root"
    (tmp_path / "hold").write_text(dropin["content"])
    dump = subprocess.run(["apt-config", "-c", str(tmp_path / "hold"), "dump", "Unattended-Upgrade::Package-Blacklist"],
                          capture_output=True, text=True, check=True, timeout=30).stdout
    patterns = re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', dump, re.M)
    # unattended-upgrades matches each as a Python regex at the start of the package name.
    held = {n for n in ("nvidia-driver-570-server", "libnvidia-compute-570-server", "nvidia-dkms-570-server",
                        "nvidia-kernel-common-570-server", "linux-modules-nvidia-570-server-aws",
                        "nvidia-utils-570-server", "linux-image-aws", "openssl", "docker.io")
            if any(re.match(p, n) for p in patterns)}
    assert held == {"nvidia-driver-570-server", "libnvidia-compute-570-server", "nvidia-dkms-570-server",
                    "nvidia-kernel-common-570-server", "linux-modules-nvidia-570-server-aws", "nvidia-utils-570-server"}
    # One writer: the boot scripts no longer write it (they ran after network-online).
    assert "51trainstack-hold-nvidia" not in (USERDATA_DIR / "bootstrap.sh").read_text()
