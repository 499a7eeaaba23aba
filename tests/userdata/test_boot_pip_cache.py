"""The bucket's package cache, through booting machines on the S3 emulator.

The first machine to install a (requirements, image) key archives its packages to
`cache/pip/<key>/<sha256>.tar.gz` and then creates `cache/pip/<key>/COMMITTED` naming it; every
later machine unpacks that archive instead of asking the package index. Only a committed archive
whose bytes have the committed sha256 is used; anything else (nothing committed, a damaged
archive, a store that does not answer in time) falls back to the index. Each machine here runs
`bootstrap.sh` alone (the supervisor's step that installs), with the fake `pip` of
`devtools/machine_commands.py`.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

import boto3
import pytest

from devtools.fault_proxy import FaultProxy
from runfolder import layout
from tests.userdata.helpers import wait_for

pytestmark = pytest.mark.slow


def _s3(run):
    return boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"])


def _cache(run) -> dict[str, bytes]:
    """Every object under cache/, by key."""
    s3, out = _s3(run), {}
    for o in s3.list_objects_v2(Bucket=run.bucket, Prefix=layout.CACHE_PREFIX).get("Contents", []):
        out[o["Key"]] = s3.get_object(Bucket=run.bucket, Key=o["Key"])["Body"].read()
    return out


def _committed(run, timeout: float = 120) -> tuple[str, str]:
    """(prefix, sha256) of the one committed key, once it is there."""
    def find():
        found = [k for k in _cache(run) if k.endswith("/" + layout.COMMITTED)]
        return found[0] if len(found) == 1 else None
    key = wait_for(find, timeout, "the package cache's COMMITTED")
    return key.removesuffix(layout.COMMITTED), _cache(run)[key].decode().strip()


def _pip_runs(box) -> list[list[str]]:
    return [a for a in box.argvs("docker") if a[0] == "run" and any("pip install" in x for x in a)]


def _installed(box) -> list[str]:
    """The pip folders this machine has, by the file the fake pip wrote in each."""
    return sorted(str(p.relative_to(box.root)) for p in box.root.glob("opt/trainstack/pip/*/INSTALLED_BY_FAKE_PIP"))


def test_the_first_machine_caches_its_packages_and_the_next_installs_none(sandbox_factory, s3_run):
    first = sandbox_factory()
    assert first.bootstrap() == 0, first.journal("bootstrap")
    assert len(_pip_runs(first)) == 1
    prefix, digest = _committed(s3_run)
    assert re.fullmatch(rf"{layout.CACHE_PREFIX}{layout.PIP_CACHE_DIR}/[0-9a-f]{{16}}/", prefix), prefix
    archive = _cache(s3_run)[f"{prefix}{digest}.tar.gz"]
    assert hashlib.sha256(archive).hexdigest() == digest
    assert set(_cache(s3_run)) == {f"{prefix}{layout.COMMITTED}", f"{prefix}{digest}.tar.gz"}
    wait_for(lambda: "cached in the bucket" in first.journal("bootstrap"), 30, "the first machine's log line")

    second = sandbox_factory()
    assert second.bootstrap() == 0, second.journal("bootstrap")
    assert _pip_runs(second) == []  # no package index at all
    assert _installed(second) == _installed(first) and len(_installed(second)) == 1
    (folder,) = second.root.glob("opt/trainstack/pip/*/")
    assert (folder / "nvidia/cudnn/lib").is_dir() and (folder / "nvidia/cublas/lib").is_dir()
    assert f"from the bucket's cache ({digest})" in second.journal("bootstrap")
    # Nothing written twice: a machine that installed nothing uploads nothing.
    assert set(_cache(s3_run)) == {f"{prefix}{layout.COMMITTED}", f"{prefix}{digest}.tar.gz"}
    uploads = [a for a in second.argvs("aws") if a[:2] == ["s3api", "put-object"]
               or (a[:2] == ["s3", "cp"] and layout.CACHE_PREFIX in a[-1])]
    assert uploads == []


def _paths(box) -> dict[str, str]:
    text = (box.root / "var/lib/trainstack/paths").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def test_with_a_local_disk_the_packages_are_installed_and_cached_on_it(sandbox_factory, s3_run):
    # The instance store takes the packages' writes off the root volume (docs/boot.md's budget).
    first = sandbox_factory(nvme=True)
    assert first.bootstrap() == 0, first.journal("bootstrap")
    mnt = first.root / "mnt/trainstack-data"
    paths = _paths(first)
    assert paths["DATA_DIR"] == str(mnt) and Path(paths["PIP_DIR"]).parent == mnt / "pip", paths
    assert (Path(paths["PIP_DIR"]) / "INSTALLED_BY_FAKE_PIP").is_file() and _installed(first) == []
    assert len(_pip_runs(first)) == 1
    _committed(s3_run)
    # A replacement with its own local disk takes the bucket's archive onto it.
    second = sandbox_factory(nvme=True)
    assert second.bootstrap() == 0, second.journal("bootstrap")
    pip_dir = Path(_paths(second)["PIP_DIR"])
    assert pip_dir.parent == second.root / "mnt/trainstack-data/pip" and pip_dir.name == Path(paths["PIP_DIR"]).name
    assert (pip_dir / "INSTALLED_BY_FAKE_PIP").is_file() and _pip_runs(second) == []
    assert not list(pip_dir.parent.glob(".install.*"))
    # Its next boot finds them there and installs nothing.
    assert second.bootstrap() == 0 and _pip_runs(second) == []


def test_a_damaged_archive_is_refused_by_its_digest_and_the_index_serves(sandbox_factory, s3_run):
    first = sandbox_factory()
    assert first.bootstrap() == 0, first.journal("bootstrap")
    prefix, digest = _committed(s3_run)
    # The archive's bytes change under its name (a bit flipped at rest, a hand-made object).
    _s3(s3_run).put_object(Bucket=s3_run.bucket, Key=f"{prefix}{digest}.tar.gz", Body=os.urandom(4096))
    second = sandbox_factory()
    assert second.bootstrap() == 0, second.journal("bootstrap")
    assert len(_pip_runs(second)) == 1
    assert re.search(rf"the cached packages \S+{digest}\.tar\.gz have sha256 [0-9a-f]{{64}} \(tar: \d+\): not used",
                     second.journal("bootstrap")), second.journal("bootstrap")
    # Refused once, not fetched three times: a damaged archive is no blip.
    fetches = [a for a in second.argvs("aws") if a[:2] == ["s3", "cp"] and a[-2].endswith(".tar.gz")
               and layout.CACHE_PREFIX in a[-2]]
    assert len(fetches) == 1, fetches


def test_an_archive_without_its_commit_is_never_read(sandbox_factory, s3_run):
    # An upload cut short (the machine went): the archive is there, COMMITTED is not.
    probe = sandbox_factory()
    assert probe.bootstrap() == 0
    prefix, _digest = _committed(s3_run)
    s3 = _s3(s3_run)
    for key in list(_cache(s3_run)):
        s3.delete_object(Bucket=s3_run.bucket, Key=key)
    partial = os.urandom(1024)
    s3.put_object(Bucket=s3_run.bucket, Key=f"{prefix}{hashlib.sha256(partial).hexdigest()}.tar.gz", Body=partial)
    box = sandbox_factory()
    assert box.bootstrap() == 0, box.journal("bootstrap")
    assert len(_pip_runs(box)) == 1
    reads = [a for a in box.argvs("aws") if a[:2] == ["s3", "cp"] and layout.CACHE_PREFIX in a[-2]]
    assert reads == []
    # ... and this machine commits its own archive beside the orphan.
    _prefix, digest = _committed(s3_run)
    assert f"{prefix}{digest}.tar.gz" in _cache(s3_run)


def test_machines_booting_together_commit_the_cache_once(sandbox_factory, s3_run):
    boxes = [sandbox_factory() for _ in range(3)]
    for box in boxes:
        box.install_boot_scripts()
    for box in boxes:
        box._start("bootstrap", "bootstrap.sh")
    for box in boxes:
        assert box.wait("bootstrap", 120) == 0, box.journal("bootstrap")
    prefix, digest = _committed(s3_run)

    def settled():
        return all("cached in the bucket" in b.journal("bootstrap") or "cached them first" in b.journal("bootstrap")
                   or "cached already" in b.journal("bootstrap") for b in boxes)
    wait_for(settled, 60, "every machine's cache upload to end")
    commits = [b for b in boxes if "cached in the bucket (" in b.journal("bootstrap")]
    assert len(commits) == 1
    assert f"cached in the bucket ({digest})" in commits[0].journal("bootstrap")
    assert hashlib.sha256(_cache(s3_run)[f"{prefix}{digest}.tar.gz"]).hexdigest() == digest


def test_a_store_blip_while_fetching_the_cache_is_retried(sandbox_factory, s3_run):
    first = sandbox_factory()
    assert first.bootstrap() == 0
    _prefix, digest = _committed(s3_run)
    second = sandbox_factory()
    # The archive's download fails twice (the listing and COMMITTED pass), then the link is back.
    (second.state / "s3-outage-only").write_text(f"{digest}.tar.gz")
    (second.state / "s3-failures-left").write_text("2")
    assert second.bootstrap() == 0, second.journal("bootstrap")
    log = second.journal("bootstrap")
    assert (second.state / "s3-failures-left").read_text() == "0"
    assert log.count("fetching the cached packages") == 2, log
    assert _pip_runs(second) == []
    assert f"from the bucket's cache ({digest})" in log


def test_a_fetch_that_trickles_is_cut_at_its_bound_and_the_index_serves(sandbox_factory, s3_run, moto_server):
    # A 4 MiB committed archive behind a link of 256 KiB/s (16 s a fetch): each try is cut at
    # TRAINSTACK_PIP_CACHE_WAIT_S (2 s), and after three the machine installs from the index.
    first = sandbox_factory()
    assert first.bootstrap() == 0
    prefix, _digest = _committed(s3_run)
    big = os.urandom(4 << 20)
    digest = hashlib.sha256(big).hexdigest()
    s3 = _s3(s3_run)
    s3.put_object(Bucket=s3_run.bucket, Key=f"{prefix}{digest}.tar.gz", Body=big)
    s3.put_object(Bucket=s3_run.bucket, Key=f"{prefix}{layout.COMMITTED}", Body=f"{digest}\n".encode())
    with FaultProxy(moto_server) as proxy:
        second = sandbox_factory()
        second.env.update({"AWS_ENDPOINT_URL": proxy.url, "TRAINSTACK_PIP_CACHE_WAIT_S": "2"})
        proxy.throttle_answers(256 * 1024)
        started = time.monotonic()
        assert second.bootstrap(timeout=120) == 0, second.journal("bootstrap")
        took = time.monotonic() - started
    log = second.journal("bootstrap")
    assert log.count("fetching the cached packages") == 2, log  # tries 1 and 2 retried, the third the last
    assert len(_pip_runs(second)) == 1
    assert took < 60, took  # three 2 s tries and their pauses, not three 16 s fetches


def test_a_store_that_refuses_the_cache_costs_only_its_tries_and_the_boot_goes_on(sandbox_factory, s3_run):
    # Nothing under cache/ answers (a store outage there, or a policy without the grant): the
    # machine installs from the index, tries its upload a bounded number of times, logs, and is
    # ready all the same.
    box = sandbox_factory()
    (box.state / "s3-outage-only").write_text(layout.CACHE_PREFIX)
    (box.state / "s3-failures-left").write_text("1000")
    assert box.bootstrap() == 0, box.journal("bootstrap")
    assert len(_pip_runs(box)) == 1
    wait_for(lambda: "could not upload the packages" in box.journal("bootstrap"), 60, "the upload to give up")
    cache_calls = [a for a in box.argvs("aws") if any(layout.CACHE_PREFIX in x for x in a)]
    # Listings before the install and before the upload (3 tries each), then 3 uploads: 9 calls.
    assert len(cache_calls) == 9, cache_calls
    assert _cache(s3_run) == {}
    # The store is back by bootstrap's next run on this disk (a reboot): nothing installed again, and the
    # upload it could not make is made now.
    (box.state / "s3-failures-left").write_text("0")
    box.procs.pop("bootstrap")
    assert box.bootstrap() == 0, box.journal("bootstrap")
    assert len(_pip_runs(box)) == 1
    _prefix, digest = _committed(s3_run)
    wait_for(lambda: f"cached in the bucket ({digest})" in box.journal("bootstrap"), 120, "the upload on the next boot")


def test_on_gcp_the_cache_is_created_once_uploaded_whole_and_read(machines, gs_run_enforced):
    # GCS: the commit is `--if-generation-match=0` (enforced here as GCS does), and the archive goes
    # up as one object: gcloud's parallel composite upload (parts elsewhere, then deleted) is off.
    from google.cloud import storage

    from components.code import archive_key, pack
    from devtools.sandbox import settings_for

    run = gs_run_enforced
    data = pack()
    bucket = storage.Client().bucket(run.bucket)
    bucket.blob(archive_key(data)).upload_from_string(data)
    code_uri = f"gs://{run.bucket}/{archive_key(data)}"
    first = machines(run, "trainstack-gcp", code_uri, settings=settings_for("gcp"))
    first.env["FAKE_GCS_COMPOSITE_THRESHOLD"] = "1"  # every upload would be split, but for the property
    assert first.bootstrap() == 0, first.journal("bootstrap")
    wait_for(lambda: "cached in the bucket" in first.journal("bootstrap"), 120, "the first machine's commit")
    names = [b.name for b in bucket.list_blobs(prefix=layout.CACHE_PREFIX)]
    # The marker and the archive, whichever sorts first (the digest may start with a digit or a letter).
    (marker,) = [n for n in names if n.endswith("/" + layout.COMMITTED)]
    (archive,) = [n for n in names if n != marker]
    digest = bucket.blob(marker).download_as_bytes().decode().strip()
    assert len(names) == 2 and archive.endswith(f"/{digest}.tar.gz"), names
    assert hashlib.sha256(bucket.blob(archive).download_as_bytes()).hexdigest() == digest
    second = machines(run, "trainstack-gcp", code_uri, settings=settings_for("gcp"))
    assert second.bootstrap() == 0, second.journal("bootstrap")
    assert _pip_runs(second) == []
    assert f"from the bucket's cache ({digest})" in second.journal("bootstrap")
