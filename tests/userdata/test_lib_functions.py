"""`lib.sh`'s functions one at a time, in bash, with the CLIs as shell functions.

What the boot scripts rely on from the library, pinned without a machine or an emulator
(script_functions.py; each case takes milliseconds): the retry loop's pauses and bounds on a
virtual clock, which cloud CLIs a machine needs, the store's calls when the other cloud's
token cannot be had, a listing's errors from an empty folder, a conditional create's three
answers, the end markers, the metadata reads' codes and the IMDSv2 token's age, and the boot
archive installed once per archive (a changed archive on a later boot replaces the scripts).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from tests.userdata.script_functions import Ran, run_script


def _lib(tmp_path, body: str, **kw) -> Ran:
    return run_script(tmp_path, None, body, timeout=15, **kw)


def _sleeps(ran: Ran) -> list[int]:
    return [int(line.split()[1]) for line in ran.starting("sleep ")]


# -- retries -------------------------------------------------------------------------------------

FLAKY = 'flaky() { (($(count flaky) > ${FAILS:-1000})); }\n'


def test_retry_doubles_its_pause_up_to_a_minute(tmp_path):
    ran = _lib(tmp_path, FLAKY + 'retry 6 flaky || record "gave up"', extra_env={"TRAINSTACK_RETRY_BASE_S": "25"})
    assert _sleeps(ran) == [25, 50, 60, 60, 60] and ran.lines[-1] == "gave up"
    small = _lib(tmp_path / "small", FLAKY + "FAILS=3; retry 6 flaky", extra_env={"TRAINSTACK_RETRY_BASE_S": "2"})
    assert small.rc == 0 and _sleeps(small) == [2, 4, 8]


def test_retry_for_tries_while_the_next_pause_ends_within_its_seconds(tmp_path):
    # Pauses 2 and 4 end at 6 s exactly; the next (8) would not.
    ran = _lib(tmp_path, FLAKY + 'retry_for 6 flaky || record "gave up"')
    assert _sleeps(ran) == [2, 4] and ran.lines[-1] == "gave up"
    assert "gave up after 6s: flaky" in ran.log


# -- the machine's CLIs --------------------------------------------------------------------------

# Only `date` (for log) on PATH: a CLI is there when the test defines it as a function.
CLIS = """
mkdir -p "$TRAINSTACK_ROOT/path" && ln -sf "$(command -v date)" "$TRAINSTACK_ROOT/path/date"
PATH="$TRAINSTACK_ROOT/path"
snap() { record "snap $*"; return 1; }
rc=0; cloud_cli || rc=$?; record "rc $rc"
"""


@pytest.mark.parametrize(("machine", "store", "present", "snaps", "rc"), [
    ("aws", "aws", "aws", [], 0),
    ("gcp", "gcp", "gcloud", [], 0),
    ("aws", "aws", "gcloud", ["snap install aws-cli --classic"] * 3, 1),
    ("gcp", "gcp", "aws", ["snap install google-cloud-cli --classic"] * 3, 1),
    ("gcp", "aws", "gcloud", ["snap install aws-cli --classic"] * 3, 1),
])
def test_a_machine_needs_its_clouds_cli_and_its_stores(tmp_path, machine, store, present, snaps, rc):
    ran = _lib(tmp_path, f"TRAINSTACK_CLOUD={machine} STORE_CLOUD={store}\n{present}() {{ :; }}\n" + CLIS)
    assert ran.starting("snap ") == snaps
    assert ran.lines[-1] == f"rc {rc}"


def test_load_env_puts_snaps_folder_on_path_once(tmp_path):
    ran = _lib(tmp_path, 'record "$PATH"; load_env; record "$PATH"')
    assert ran.lines[0].endswith(":/snap/bin") and ran.lines[0].count("/snap/bin") == 1
    assert ran.lines[1] == ran.lines[0]


# -- the store -----------------------------------------------------------------------------------

AWS = 'aws() { record "aws $*"; printf "%b" "${AWS_OUT:-}"; [[ -z "${AWS_ERR:-}" ]] || echo "$AWS_ERR" >&2; return "${AWS_RC:-0}"; }\n'
GCLOUD = AWS.replace("aws()", "gcloud()").replace('"aws $*"', '"gcloud $*"')


def test_without_the_other_clouds_token_store_calls_fail_and_reads_of_many_find_nothing(tmp_path):
    body = AWS + """TRAINSTACK_CLOUD=gcp STORE_CLOUD=aws AWS_OUT='{"a": 1}\\n'
federation_token() { return 1; }
for call in "store_cp a b" "store_cp_dir a b" "store_ls s3://bucket/runs/r1/" "store_cat_all s3://bucket/x"; do
  rc=0; out="$($call)" || rc=$?; record "$call: rc $rc out ${out:-none}"
done
record "newest $(newest_committed)"
rc=0; store_create s3://bucket/x <<<body || rc=$?; record "create: rc $rc"
"""
    ran = _lib(tmp_path, body)
    assert ran.lines == ["store_cp a b: rc 1 out none", "store_cp_dir a b: rc 1 out none",
                         "store_ls s3://bucket/runs/r1/: rc 1 out none", "store_cat_all s3://bucket/x: rc 0 out none",
                         "aws s3 ls --recursive s3://bucket/runs/r1/checkpoints/", "newest -1", "create: rc 2"]


@pytest.mark.parametrize(("cli", "out", "err", "code", "rc", "names"), [
    ("aws", "                           PRE checkpoints/\\n2026-01-01 00:00:00         12 COMPLETE\\n", "", 0, 0,
     "checkpoints/ COMPLETE"),
    ("aws", "", "", 1, 0, ""),  # an empty folder: awscli v1 exits 1 and says nothing
    ("gcloud", "", "ERROR: (gcloud.storage.ls) One or more URLs matched no objects.", 1, 0, ""),
    ("gcloud", "", "ERROR: (gcloud.storage.ls) HTTPError 403: denied", 1, 1, ""),
    ("aws", "", "Could not connect to the endpoint URL", 255, 1, ""),
])
def test_a_listing_tells_an_empty_folder_from_an_error(tmp_path, cli, out, err, code, rc, names):
    store = {"aws": "aws", "gcloud": "gcp"}[cli]
    prefix = {"aws": "s3", "gcloud": "gs"}[cli] + "://bucket/runs/r1/"
    body = (AWS + GCLOUD + f"STORE_CLOUD={store} AWS_OUT='{out}' AWS_ERR='{err}' AWS_RC={code}\n"
            f'rc=0; names="$(store_ls {prefix})" || rc=$?; record "rc $rc"; record $names')
    ran = _lib(tmp_path, body)
    assert ran.lines[-2:] == [f"rc {rc}", names]
    assert ("listing " + prefix + " failed") in ran.log if rc else "failed" not in ran.log


@pytest.mark.parametrize(("err", "code", "rc"), [
    ("", 0, 0),
    ("An error occurred (PreconditionFailed) when calling the PutObject operation", 254, 1),
    ("An error occurred (ConditionalRequestConflict) when calling the PutObject operation", 254, 1),
    ("Could not connect to the endpoint URL", 255, 2),
])
def test_a_conditional_create_says_created_exists_or_failed(tmp_path, err, code, rc):
    body = (AWS + f"AWS_ERR='{err}' AWS_RC={code}\n"
            'rc=0; store_create s3://bucket/runs/r1/rendezvous/gen-0/sealed <<<record || rc=$?\n'
            'record "rc $rc ${STORE_ERROR:-}"')
    ran = _lib(tmp_path, body)
    (call,) = ran.starting("aws ")
    assert call.startswith("aws s3api put-object --bucket bucket --key runs/r1/rendezvous/gen-0/sealed --body ")
    assert call.endswith("--if-none-match *")
    assert ran.lines[-1].strip() == f"rc {rc} {err if rc == 2 else ''}".strip()


def test_end_markers_are_found_in_a_listing_and_an_unreadable_folder_is_no_answer(tmp_path):
    body = """
for entries in $'checkpoints/\\nFAILED\\ndeadline' $'checkpoints/\\nCOMPLETED'; do
  rc=0; m="$(end_marker_in "$entries")" || rc=$?; record "in: rc $rc ${m:-none}"
done
for name in COMPLETE CANCELLED COMPLETED; do rc=0; is_end_marker $name || rc=$?; record "$name $rc"; done
run_entries() { return 1; }
rc=0; m="$(end_marker)" || rc=$?; record "unreadable: rc $rc ${m:-none}"
run_entries() { printf 'TIMED_OUT\\n'; }
record "readable: $(end_marker)"
"""
    ran = _lib(tmp_path, body)
    assert [line for line in ran.lines if not line.startswith("sleep")] == [
        "in: rc 0 FAILED", "in: rc 0 none", "COMPLETE 0", "CANCELLED 0", "COMPLETED 1",
        "unreadable: rc 1 none", "readable: TIMED_OUT"]
    assert _sleeps(ran) == [2, 4, 8, 16]  # five listings


# -- instance metadata ---------------------------------------------------------------------------

CURL = """
curl() {
  if [[ " $* " == *" -X PUT "* ]]; then record "token"; echo "tok-$(count token)"; return; fi
  record "read ${*: -1}"; printf '%s\\n%s' "$VALUE" "$CODE"; return "${CURL_RC:-0}"
}
"""


def test_the_imds_token_is_kept_until_it_is_21000_s_old(tmp_path):
    body = CURL + """
printf '%s old\\n' $((EPOCHSECONDS - 21000)) >"$RUNTIME_DIR/imds-token"
imds_token; record "kept $IMDS_TOKEN"
printf '%s old\\n' $((EPOCHSECONDS - 21001)) >"$RUNTIME_DIR/imds-token"
imds_token; record "new $IMDS_TOKEN"
"""
    ran = _lib(tmp_path, body)
    assert ran.lines == ["kept old", "token", "new tok-1"]


@pytest.mark.parametrize(("cloud", "code", "curl_rc", "rc", "token_kept"), [
    ("aws", 200, 0, 0, True), ("aws", 404, 0, 1, True), ("aws", 500, 0, 2, True), ("aws", 401, 0, 2, False),
    ("gcp", 401, 0, 2, True), ("gcp", 200, 7, 2, True), ("gcp", 200, 0, 0, True),
])
def test_a_metadata_read_answers_value_absent_or_error(tmp_path, cloud, code, curl_rc, rc, token_kept):
    body = CURL + f"""TRAINSTACK_CLOUD={cloud} VALUE=i-0abc CODE={code} CURL_RC={curl_rc}
printf '%s tok\\n' "$EPOCHSECONDS" >"$RUNTIME_DIR/imds-token"
rc=0; md_read value instance-id || rc=$?; record "rc $rc ${{value:-none}}"
[[ -e "$RUNTIME_DIR/imds-token" ]] && record kept || record removed
"""
    ran = _lib(tmp_path, body)
    value = "i-0abc" if rc == 0 else ("none" if curl_rc else "i-0abc")
    assert ran.lines[-2:] == [f"rc {rc} {value}", "kept" if token_kept else "removed"]


def test_an_unanswered_instance_id_is_the_host_name_for_that_call_only(tmp_path):
    body = CURL + """. "$USERDATA/lib.sh"
hostname() { echo host-1; }
VALUE="" CODE=000 CURL_RC=7
rc=0; id="$(instance_id)" || rc=$?; record "rc $rc $id"
VALUE=i-0abc CODE=200 CURL_RC=0
record "then $(instance_id)"
"""
    ran = _lib(tmp_path, body)
    assert [line for line in ran.lines if line.startswith(("rc", "then"))] == ["rc 0 host-1", "then i-0abc"]


def test_a_public_image_needs_no_registry_login(tmp_path):
    ran = _lib(tmp_path, 'docker() { record "docker $*"; }\nrc=0; registry_login || rc=$?; record "rc $rc"')
    assert ran.lines == ["rc 0"]


# -- the boot archive ----------------------------------------------------------------------------


def _archive(folder: Path, bootstrap: str, *, files=("bootstrap.sh", "rendezvous.sh", "progress.sh")) -> str:
    """A boot archive named after its sha256, as components/code.py packs it; its URI."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in files:
            data = (bootstrap if name == "bootstrap.sh" else "# rendezvous\n").encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    name = f"boot-{hashlib.sha256(data).hexdigest()[:16]}.tar.gz"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(data)
    return f"s3://bucket/code/{name}"


FETCH = 'store_cp() { record "fetch ${1##*/}"; cp "$ARCHIVES/${1##*/}" "$2"; }\n'


def _boot(tmp_path, uris: list[str], before: str = "") -> Ran:
    body = FETCH + before + "".join(
        f'TRAINSTACK_BOOT_URI={uri}; rc=0; boot_scripts || rc=$?; record "rc $rc"; '
        f'record "$(cat "$BIN_DIR/bootstrap.sh" 2>/dev/null || echo none)"\n' for uri in uris)
    return _lib(tmp_path, body, extra_env={"ARCHIVES": str(tmp_path / "archives")})


def test_the_boot_archive_is_fetched_once_and_a_changed_one_on_a_later_boot_replaces_it(tmp_path):
    first = _archive(tmp_path / "archives", "# first\n")
    second = _archive(tmp_path / "archives", "# second\n")
    ran = _boot(tmp_path, [first, first, second, second])
    assert ran.lines == [f"fetch {first.rsplit('/', 1)[1]}", "rc 0", "# first", "rc 0", "# first",
                         f"fetch {second.rsplit('/', 1)[1]}", "rc 0", "# second", "rc 0", "# second"]


def test_an_archive_whose_name_or_bytes_are_wrong_is_a_verdict(tmp_path):
    good = _archive(tmp_path / "archives", "# good\n")
    (tmp_path / "archives" / "boot-0123456789abcdef.tar.gz").write_bytes(
        (tmp_path / "archives" / good.rsplit("/", 1)[1]).read_bytes())
    ran = _boot(tmp_path, ["s3://bucket/code/boot.tar.gz", "s3://bucket/code/boot-0123456789abcdef.tar.gz", good],
                before='reason() { cat "$RUNTIME_DIR/failure-reason" 2>/dev/null || echo none; }\n'
                       'record() { echo "$* | $(reason)" >>"$OUT"; }\n')
    assert ran.lines[0] == ("rc 1 | TRAINSTACK_BOOT_URI 's3://bucket/code/boot.tar.gz': expected boot-<sha256 hex>"
                            ".tar.gz")
    assert ran.lines[3].startswith("rc 1 | boot-0123456789abcdef.tar.gz: its sha256 is ")
    assert ran.lines[-2:] == ["rc 0 | none", "# good | none"]


def test_a_disk_that_takes_no_folder_is_no_verdict(tmp_path):
    good = _archive(tmp_path / "archives", "# good\n")
    ran = _boot(tmp_path, [good], before='BIN_DIR="$TRAINSTACK_ROOT/missing"\n')
    assert ran.lines[0] == "rc 1" and "cannot make a folder in" in ran.log
    assert not (tmp_path / "root/run/trainstack/failure-reason").exists()
