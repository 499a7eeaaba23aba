"""The boot scripts a group of several machines fetches from the bucket (components/code.py's
`pack_boot_scripts`): bootstrap.sh's `boot_scripts` step installs rendezvous.sh from the archive
named after its sha256, once per disk; a machine of a group of one fetches nothing; an archive
whose bytes are not those its name says fails the run with the reason; a store that does not
answer is no verdict (bootstrap exits for the supervisor to try again)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from components.code import BOOT_SCRIPTS, boot_key, pack_boot_scripts
from components.userdata import ENV_FILE, USERDATA_DIR
from devtools.sandbox import settings_for
from tests.userdata.helpers import _s3

pytestmark = pytest.mark.slow  # each case runs bootstrap.sh and the fake CLIs against moto_server


def _bootstrap(box) -> subprocess.CompletedProcess:
    (box.root / "run").mkdir(exist_ok=True)
    return subprocess.run([str(box.root / "opt/trainstack/bin/bootstrap.sh")], env=box.env,
                          capture_output=True, text=True, timeout=120)


def _env_file(box) -> dict[str, str]:
    """The machine's env file, as its scripts read it."""
    (text,) = [f["content"] for f in box.doc["write_files"] if f["path"] == ENV_FILE]
    return dict(shlex.split(line)[0].split("=", 1) for line in text.splitlines())


def _boot_fetches(box) -> list[list[str]]:
    return [a for cli in ("aws", "gcloud") for a in box.argvs(cli) if any("/code/boot-" in x for x in a)]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_cluster_machine_installs_its_boot_scripts_from_the_bucket_once(machines, request, cloud):
    run = request.getfixturevalue({"aws": "s3_run", "gcp": "gs_run"}[cloud])
    box = machines(run, "trainstack-x", "", settings=settings_for(cloud), env_overrides={"TRAINSTACK_NODES": "2"})
    installed = box.root / "opt/trainstack/bin/rendezvous.sh"
    # Not in the user data: the document has no room for it.
    assert not installed.exists()
    assert all(not f["path"].endswith("/rendezvous.sh") for f in box.doc["write_files"])
    uri = _env_file(box)["TRAINSTACK_BOOT_URI"]
    assert uri == f"{run.uri.split('://')[0]}://{run.bucket}/{boot_key(pack_boot_scripts())}"
    proc = _bootstrap(box)
    assert proc.returncode == 0, proc.stderr
    checked = 0
    for name in BOOT_SCRIPTS:
        assert (box.root / "opt/trainstack/bin" / name).read_text() == (USERDATA_DIR / name).read_text()
        checked += 1
    assert checked == len(BOOT_SCRIPTS) >= 1
    assert len(_boot_fetches(box)) == 1, box.argvs("aws")
    # The next boot of the same disk fetches nothing again.
    assert _bootstrap(box).returncode == 0
    assert len(_boot_fetches(box)) == 1
    assert not list((box.root / "opt/trainstack/bin").glob(".fetch.*"))


def test_a_machine_of_a_group_of_one_fetches_no_boot_scripts(machines, s3_run, group):
    box = machines(s3_run, group, "")
    assert "TRAINSTACK_BOOT_URI" not in _env_file(box)
    proc = _bootstrap(box)
    assert proc.returncode == 0, proc.stderr
    assert "step scripts done" in proc.stdout + proc.stderr and _boot_fetches(box) == []
    assert not (box.root / "opt/trainstack/bin/rendezvous.sh").exists()


def test_a_boot_archive_that_is_not_what_its_name_says_fails_the_run_with_the_reason(machines, s3_run):
    box = machines(s3_run, "trainstack-x", "", env_overrides={"TRAINSTACK_NODES": "2"})
    key = _env_file(box)["TRAINSTACK_BOOT_URI"].removeprefix(f"s3://{s3_run.bucket}/")
    _s3(s3_run).put_object(Bucket=s3_run.bucket, Key=key, Body=b"not the archive")
    proc = _bootstrap(box)
    assert proc.returncode != 0
    reason = (box.root / "run/trainstack/failure-reason").read_text()
    assert f"{key.rsplit('/', 1)[1]}: its sha256 is" in reason and "not the" in reason, reason
    assert not (box.root / "opt/trainstack/bin/rendezvous.sh").exists()


def test_a_boot_archive_the_store_does_not_give_is_no_verdict(machines, s3_run):
    box = machines(s3_run, "trainstack-x", "", env_overrides={"TRAINSTACK_NODES": "2"})
    key = _env_file(box)["TRAINSTACK_BOOT_URI"].removeprefix(f"s3://{s3_run.bucket}/")
    _s3(s3_run).delete_object(Bucket=s3_run.bucket, Key=key)
    proc = _bootstrap(box)
    assert proc.returncode != 0
    # Tried again (retry 5), then bootstrap exits for the supervisor's next try: no failure reason.
    assert len(_boot_fetches(box)) == 5, box.argvs("aws")
    assert "cannot fetch" in proc.stdout + proc.stderr
    assert not (box.root / "run/trainstack/failure-reason").exists()
