"""A machine pulls and runs its image only by the digest in its env file, and checks the pull.

`bootstrap.sh`'s `image` step, one function at a time (a shell `docker` that records its calls),
then once in the boot sandbox (devtools/machine_commands.py's docker, which keeps what a pull
brought): a reference by tag is refused before any pull, and an image whose digests do not hold
the env file's is never marked ready, each a verdict with its reason in `failure-reason`.
"""

from __future__ import annotations

import pytest

from devtools.sandbox import SANDBOX_DIGEST
from tests.userdata.script_functions import run_script

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REF = f"tensorflow/tensorflow@{DIGEST}"

# A docker that records each call; a pull leaves the image with the RepoDigests in $PULLED.
DOCKER = """
docker() {
  record "docker $*"
  case "$1 $2" in
    "image inspect")
      [[ -e "$OUT.pulled" ]] || return 1
      [[ "$3" != --format ]] || cat "$OUT.pulled" ;;
    "pull -q") echo "$PULLED" >"$OUT.pulled" ;;
  esac
}
registry_login() { record login; }
RUNTIME_DIR="$TRAINSTACK_ROOT/run/trainstack"; mkdir -p "$RUNTIME_DIR"
"""


def _image(tmp_path, image: str, pulled: str):
    ran = run_script(tmp_path, "bootstrap.sh", DOCKER + "image; record ready", env=f"TRAINSTACK_IMAGE={image}\n",
                     extra_env={"PULLED": pulled})
    reason = tmp_path / "root/run/trainstack/failure-reason"
    return ran, reason.read_text().strip() if reason.exists() else ""


def test_an_image_pinned_by_digest_is_pulled_by_that_digest_and_checked_after_the_pull(tmp_path):
    ran, reason = _image(tmp_path, REF, f"tensorflow/tensorflow@{OTHER} {REF}")
    assert ran.rc == 0, ran.log
    assert reason == ""
    calls = ran.starting("docker")
    assert calls == [f"docker image inspect {REF}", f"docker pull -q {REF}",
                     f'docker image inspect --format {{{{join .RepoDigests " "}}}} {REF}'], calls
    assert ran.lines[-1] == "ready"
    assert f"image {REF} verified by digest" in ran.log


@pytest.mark.parametrize("image", ["tensorflow/tensorflow:2.21.0-gpu", "tensorflow/tensorflow@sha256:abc",
                                   f"tensorflow/tensorflow:2.21.0-gpu@{DIGEST}x"])
def test_an_image_not_pinned_by_digest_is_refused_before_any_pull(tmp_path, image):
    ran, reason = _image(tmp_path, image, "")
    assert ran.rc != 0
    assert reason == f"the image {image} is not pinned by digest (REPOSITORY@sha256:...): a machine never runs an image by tag"
    assert ran.starting("docker") == [] and "ready" not in ran.lines


@pytest.mark.parametrize("pulled", [f"tensorflow/tensorflow@{OTHER}", "", f"other/image@{DIGEST}"])
def test_a_pulled_image_without_the_env_files_digest_is_a_verdict_and_never_ready(tmp_path, pulled):
    ran, reason = _image(tmp_path, REF, pulled)
    assert ran.rc != 0
    assert reason == f"the pulled image is not {REF} (its digests: {pulled or 'none'}): refusing to run it"
    assert "ready" not in ran.lines
    assert not (tmp_path / "root/run/trainstack/image.ready").exists()


def test_the_sandbox_machine_pulls_by_digest_and_a_tampered_pull_fails_the_run(machines, s3_run, code_uri):
    from tests.userdata.test_boot_failure_paths import _script

    box = machines(s3_run, "trainstack-x", code_uri)
    (box.state / "registry-digest").write_text(OTHER)
    proc = _script(box, "bootstrap.sh")
    assert proc.returncode != 0
    pulls = [a for a in box.argvs("docker") if a[:1] == ["pull"]]
    assert pulls and all(a[-1].endswith(f"@{SANDBOX_DIGEST}") for a in pulls), pulls
    reason = (box.root / "run/trainstack/failure-reason").read_text()
    assert reason.startswith(f"the pulled image is not {pulls[0][-1]} (its digests: ") and OTHER in reason, reason
    assert not [a for a in box.argvs("docker") if a[:1] == ["run"]]
