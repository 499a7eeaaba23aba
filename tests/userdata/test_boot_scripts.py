"""The boot scripts every machine fetches from the bucket (components/code.py's `pack_boot_scripts`)
instead of carrying them in its user data: lib.sh's `boot_scripts`, which the supervisor runs
before each bootstrap, installs bootstrap.sh and rendezvous.sh from the archive named after its
sha256, once per disk; an archive whose bytes are not those its name says fails the run with the
reason; a store that does not give it is no verdict (the supervisor tries again)."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from components.code import BOOT_SCRIPTS, _tar_gz, boot_key, pack_boot_scripts
from components.userdata import ENV_FILE, USERDATA_DIR
from devtools.sandbox import settings_for
from tests.userdata.helpers import _s3, group_size, s3_keys

pytestmark = pytest.mark.slow  # each case runs the scripts and the fake CLIs against the emulators


def _env_file(box) -> dict[str, str]:
    """The machine's env file, as its scripts read it."""
    (text,) = [f["content"] for f in box.doc["write_files"] if f["path"] == ENV_FILE]
    return dict(shlex.split(line)[0].split("=", 1) for line in text.splitlines())


def _boot_fetches(box) -> list[list[str]]:
    return [a for cli in ("aws", "gcloud") for a in box.argvs(cli) if any("/code/boot-" in x for x in a)]


def _boot_scripts(box) -> subprocess.CompletedProcess:
    """lib.sh's boot_scripts as the supervisor runs it; its exit status."""
    (box.root / "run").mkdir(exist_ok=True)
    return subprocess.run(["bash", "-c", '. "$1"; load_env; boot_scripts', "-",
                           str(box.root / "opt/trainstack/bin/lib.sh")],
                          env=box.env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_machine_installs_its_boot_scripts_from_the_bucket_once(machines, request, cloud):
    run = request.getfixturevalue({"aws": "s3_run", "gcp": "gs_run"}[cloud])
    box = machines(run, "trainstack-x", "", settings=settings_for(cloud))
    bin_dir = box.root / "opt/trainstack/bin"
    # Not in the user data, which has no room for them.
    assert all(not (bin_dir / name).exists() for name, _mode in BOOT_SCRIPTS)
    assert all(not f["path"].endswith(tuple(name for name, _m in BOOT_SCRIPTS)) for f in box.doc["write_files"])
    assert _env_file(box)["TRAINSTACK_BOOT_URI"] == f"{run.uri.split('://')[0]}://{run.bucket}/{boot_key(pack_boot_scripts())}"
    proc = _boot_scripts(box)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = 0
    for name, mode in BOOT_SCRIPTS:
        assert (bin_dir / name).read_text() == (USERDATA_DIR / name).read_text()
        assert (bin_dir / name).stat().st_mode & 0o777 == mode
        checked += 1
    assert checked == len(BOOT_SCRIPTS) == 3
    assert len(_boot_fetches(box)) == 1, box.argvs("aws") + box.argvs("gcloud")
    # The next boot of the same disk fetches nothing again.
    assert _boot_scripts(box).returncode == 0
    assert len(_boot_fetches(box)) == 1
    assert not list(bin_dir.glob(".fetch.*"))


def test_a_boot_archive_that_is_not_what_its_name_says_ends_the_run_failed_with_the_reason(machines, s3_run, group):
    box = machines(s3_run, group, "")
    key = _env_file(box)["TRAINSTACK_BOOT_URI"].removeprefix(f"s3://{s3_run.bucket}/")
    _s3(s3_run).put_object(Bucket=s3_run.bucket, Key=key, Body=b"not the archive")
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    marker = json.loads(s3_keys(s3_run)["FAILED"])
    name = key.rsplit("/", 1)[1]
    assert f"{name}: its sha256 is" in marker["reason"] and "not the" in marker["reason"], marker
    assert len(_boot_fetches(box)) == 1  # a verdict: not fetched again
    assert not (box.root / "opt/trainstack/bin/bootstrap.sh").exists()
    assert group_size(s3_run, group)[2] == 0 and box.argvs("shutdown") == [["-h", "now"]]


def test_a_boot_archive_the_store_does_not_give_is_no_verdict(machines, s3_run):
    box = machines(s3_run, "trainstack-x", "")
    key = _env_file(box)["TRAINSTACK_BOOT_URI"].removeprefix(f"s3://{s3_run.bucket}/")
    body = _s3(s3_run).get_object(Bucket=s3_run.bucket, Key=key)["Body"].read()
    _s3(s3_run).delete_object(Bucket=s3_run.bucket, Key=key)
    proc = _boot_scripts(box)
    # Tried 5 times, then 1 for the supervisor's next try (its bootstrap wait): no failure reason.
    assert proc.returncode == 1
    assert len(_boot_fetches(box)) == 5, box.argvs("aws")
    assert "cannot fetch" in proc.stdout + proc.stderr
    assert not (box.root / "run/trainstack/failure-reason").exists()
    # Once the store gives it, the next try installs it.
    _s3(s3_run).put_object(Bucket=s3_run.bucket, Key=key, Body=body)
    assert _boot_scripts(box).returncode == 0 and (box.root / "opt/trainstack/bin/bootstrap.sh").exists()


def test_an_archive_without_every_boot_script_ends_the_run_failed_with_the_reason(machines, s3_run):
    """An archive whose name matches its bytes but that lacks rendezvous.sh installs nothing: a verdict."""
    data = _tar_gz([("bootstrap.sh", USERDATA_DIR / "bootstrap.sh")], {"bootstrap.sh": 0o755})
    _s3(s3_run).put_object(Bucket=s3_run.bucket, Key=boot_key(data), Body=data)
    box = machines(s3_run, "trainstack-x", "",
                   env_overrides={"TRAINSTACK_BOOT_URI": f"s3://{s3_run.bucket}/{boot_key(data)}"})
    proc = _boot_scripts(box)
    assert proc.returncode == 1
    reason = (box.root / "run/trainstack/failure-reason").read_text()
    assert reason.strip() == f"{boot_key(data).rsplit('/', 1)[1]} holds no rendezvous.sh", reason
    bin_dir = box.root / "opt/trainstack/bin"
    assert not (bin_dir / "bootstrap.sh").exists() and not (bin_dir / ".boot-scripts").exists()
    assert not list(bin_dir.glob(".fetch.*"))


def test_a_disk_whose_scripts_were_cut_short_installs_them_again(machines, s3_run):
    """A power-off during the install can leave the marker without a script, or a fetch's folder: the next
    boot fetches again and clears what was left."""
    box = machines(s3_run, "trainstack-x", "")
    bin_dir = box.root / "opt/trainstack/bin"
    assert _boot_scripts(box).returncode == 0 and (bin_dir / ".boot-scripts").exists()
    (bin_dir / "rendezvous.sh").unlink()
    (bin_dir / ".fetch.cutshort").mkdir()
    (bin_dir / ".fetch.cutshort" / "boot.tar.gz").write_bytes(b"half")
    proc = _boot_scripts(box)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(_boot_fetches(box)) == 2
    assert (bin_dir / "rendezvous.sh").read_text() == (USERDATA_DIR / "rendezvous.sh").read_text()
    assert not list(bin_dir.glob(".fetch.*"))
