"""The opt-in Jupyter unit (access.jupyter: true) on a booting sandbox machine.

The rendered user data installs userdata/jupyter.sh and its unit; the machine boots as usual
(the trainer unit's bootstrap brings the image), then the Jupyter unit's script runs as
systemd would start it. The fake `docker` records the Jupyter container's argv
(`docker-jupyter`). What must hold: the server binds 127.0.0.1 only and gets no GPU, the token
is made on the machine into one 0600 file (the login user's, mounted read-only for Jupyter), and
the token is in no user data, argv, environment, log, journal or bucket object.

The fake runs no Jupyter. The real one was run by hand here as jupyter.sh runs it (JupyterLab
4.6.6 installed with `pip install --target DIR -c <freeze>`, then `PYTHONPATH=DIR python -m
jupyterlab --ip=127.0.0.1 --port=N --no-browser --allow-root --ServerApp.port_retries=0` with
JUPYTER_TOKEN_FILE): it listened on 127.0.0.1:N only, answered 200 with the token and 403
without, and logged its URL as `?token=...`, never the token.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import stat
import subprocess

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from components.settings import load_settings
from components.userdata import JUPYTER_UNIT, boot_env, render_user_data
from tests.userdata.helpers import installed_scripts, s3_keys, shellcheck

pytestmark = pytest.mark.slow


def _public_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def jupyter_settings(cloud: str = "aws", jupyter: bool = True):
    raw = {
        "cloud": cloud,
        "region": "us-east-1" if cloud == "aws" else "us-central1",
        "run": {"model": "mlp", "synthetic": True, "steps": 20, "batchSize": 16, "checkpointEverySteps": 10},
        "compute": {"instanceTypes": ["g5.xlarge"] if cloud == "aws" else ["g2-standard-4"], "maxRuntimeHours": 1},
        "access": {"sshPublicKey": _public_key(), "allowedCidrs": ["203.0.113.7/32"], "jupyter": jupyter},
    }
    if cloud == "gcp":
        raw["project"] = "trainstack-test"
    return load_settings(raw, stack="sandbox")


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
@pytest.mark.parametrize("jupyter", [True, False])
def test_user_data_installs_and_enables_the_jupyter_unit_only_when_asked(cloud, jupyter):
    s = jupyter_settings(cloud, jupyter)
    scheme = "s3" if cloud == "aws" else "gs"
    env = boot_env(s, run_uri=f"{scheme}://b/runs/x", group="g", code_uri="", boot_uri="s3://b/code/boot-0123456789abcdef.tar.gz")
    doc = yaml.safe_load(render_user_data(cloud, env))
    paths = [f["path"] for f in doc["write_files"]]
    enabled = doc["runcmd"][1]
    assert ("/opt/trainstack/bin/jupyter.sh" in paths) is jupyter
    assert (f"/etc/systemd/system/{JUPYTER_UNIT}" in paths) is jupyter
    assert (JUPYTER_UNIT in enabled) is jupyter
    assert enabled[:4] == ["systemctl", "enable", "--now", "--no-block"]


def test_rendered_jupyter_document_passes_cloud_init_schema_and_shellcheck(tmp_path):
    env = boot_env(jupyter_settings(), run_uri="s3://b/runs/x", group="g", code_uri="", boot_uri="s3://b/code/boot-0123456789abcdef.tar.gz")
    text = render_user_data("aws", env)
    (tmp_path / "user-data.yaml").write_text(text)
    schema = subprocess.run(["cloud-init", "schema", "--config-file", str(tmp_path / "user-data.yaml")],
                            capture_output=True, text=True, timeout=120)
    assert schema.returncode == 0 and "Valid cloud-config" in schema.stdout, schema.stdout + schema.stderr
    scripts = installed_scripts(text, tmp_path)
    assert "jupyter.sh" in [p.name for p in scripts]
    code, output = shellcheck([p.name for p in scripts], tmp_path)
    assert code == 0, output


def test_jupyter_binds_loopback_with_a_token_made_on_the_machine(sandbox_factory, s3_run):
    box = sandbox_factory(settings=jupyter_settings())
    box.env["TRAINSTACK_SSH_USER"] = getpass.getuser()
    trainer = box.boot()
    jupyter = box._start("jupyter", "jupyter.sh")  # systemd starts the enabled unit at boot
    assert jupyter.wait(timeout=240) == 0, box.journal("jupyter")
    assert trainer.wait(timeout=240) == 0, box.journal()

    runtime = box.root / "run/trainstack/jupyter"
    token_file = runtime / "token"
    token = token_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token), token  # no newline: Jupyter reads the bytes as they are
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.stat().st_uid == os.getuid()  # the SSH login user's own file
    assert sorted(p.name for p in runtime.iterdir()) == ["token"]

    # The server: loopback only, port 8888, no GPU, the token from the read-only file only.
    [run] = box.calls("docker-jupyter")
    assert run["argv"][:2] == ["--ip=127.0.0.1", "--port=8888"]
    assert run["mounts"]["/run/secrets/jupyter-token"] == str(token_file)
    assert "JUPYTER_TOKEN" not in run["env_keys"] and "JUPYTER_TOKEN_FILE" in run["env_keys"]
    [argv] = [a for a in box.argvs("docker") if a[0] == "run" and "jupyterlab" in a]
    assert argv[argv.index("--network") + 1] == "host"
    assert f"{token_file}:/run/secrets/jupyter-token:ro" in argv
    assert "JUPYTER_TOKEN_FILE=/run/secrets/jupyter-token" in argv
    assert "--gpus" not in argv and "0.0.0.0" not in " ".join(argv)
    # Its pinned JupyterLab was installed once, in the run's image.
    installs = [p.read_text() for p in box.root.rglob("opt/trainstack/jupyter/*/INSTALLED_BY_FAKE_PIP")]
    assert len(installs) == 1 and '"$PIN"' in installs[0]
    assert [a for a in box.argvs("docker") if "PIN=jupyterlab==4.6.6" in a]

    # Nowhere else: user data, any command line, the machine's logs and journals, the bucket.
    assert token not in box.user_data
    assert not [c for c in box.calls() if token in json.dumps(c)]
    logs = [p.read_text(errors="replace") for p in (box.root / "var/log").rglob("*") if p.is_file()]
    logs += [box.journal(u) for u in ("trainer", "watcher", "jupyter")]
    assert len(logs) >= 4 and not [t for t in logs if token in t]
    assert "Jupyter token in" in box.journal("jupyter")
    objects = s3_keys(s3_run)
    assert "COMPLETE" in objects and not [k for k, v in objects.items() if token.encode() in v]
    # (The same run, end to end: the price the stack put in the env file reaches COMPLETE's total.)
    done = json.loads(objects["COMPLETE"])
    assert done["cost_note"].startswith("spot estimate") and done["machine_hours"] > 0
    assert done["cost_usd"] == pytest.approx(done["machine_hours"] * 1.006 * 0.4, abs=0.01)

    # The unit restarting in the same boot keeps the token the user already has.
    again = box._start("jupyter", "jupyter.sh")
    assert again.wait(timeout=60) == 0, box.journal("jupyter")
    assert token_file.read_text() == token
    assert len(box.calls("docker-jupyter")) == 2
