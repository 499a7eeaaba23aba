"""The ways a machine's scripts end or wait when a call fails: each ends, or waits for a bound.

A fake tool fails first (a knob in `$FAKE_STATE`, or a wrapper that then hands over to
devtools/machine_commands.py), and the test waits for the script to end and looks at what it
left: the run's marker, the group's size, the calls made, the machine's events.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from devtools import cli_server
from devtools.metadata import INSTANCE_ID, MetadataServer
from devtools.sandbox import FAKES, Sandbox, settings_for
from runfolder import layout
from tests.userdata.helpers import group_size, machine_events, s3_keys


def _script(box, name: str, *args: str, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    (box.root / "run").mkdir(exist_ok=True)
    if not (box.root / "opt/trainstack/bin" / name).exists():
        box.install_boot_scripts()  # bootstrap.sh comes from the bucket, as the supervisor fetches it
    return subprocess.run([str(box.root / "opt/trainstack/bin" / name), *args], env={**box.env, **env},
                          capture_output=True, text=True, timeout=timeout)


def _wrap(box, tool: str, shell: str) -> None:
    """Puts a wrapper for `tool` first on the sandbox's PATH: `shell`, then machine_commands.py."""
    path = box.bin / tool
    path.write_text(cli_server.wrapper(tool, FAKES, shell))
    path.chmod(0o755)


def _scale_calls(box) -> list[list[str]]:
    return [a for a in box.argvs("aws") if "update-auto-scaling-group" in a]


# -- finish: the group to zero -----------------------------------------------------------


def test_a_failing_scale_call_is_retried_with_its_error_logged_until_it_passes(machines, s3_run, group):
    # Throttling for a while: the old finish gave up after 5 quick tries and shut down with
    # the group still at one machine, and logged no error text.
    box = machines(s3_run, group, "")
    (box.state / "scale-failures").write_text("7")
    (box.state / "scale-error").write_text("\nAn error occurred (Throttling) when calling the "
                                           "UpdateAutoScalingGroup operation (reached max retries: 2): Rate exceeded")
    proc = _script(box, "finish.sh", layout.FAILED, "a test")
    assert proc.returncode == 0, proc.stderr
    assert len(_scale_calls(box)) == 8
    assert group_size(s3_run, group) == (0, 0, 0)
    assert "Rate exceeded; retrying in 0s" in proc.stderr
    assert box.argvs("shutdown") == [["-h", "now"]]
    assert layout.MACHINE_SCALE_FAILED not in [e["event"] for e in machine_events(s3_run)]


@pytest.mark.slow
def test_a_scale_call_that_never_passes_ends_each_machine_in_a_bound_and_relaunches_go_fast(
        machines, s3_run, group, tmp_path):
    # AccessDenied for good: no machine can keep the group from replacing it, so the bound on
    # the loop is the cloud's runtime cap; what each machine costs is bounded here. The one
    # that ends the run tries for TRAINSTACK_SCALE_WAIT_S and records why it could not; a
    # relaunch that finds that record tries for 30 s only, never the full wait.
    box = machines(s3_run, group, "")
    (box.state / "scale-failures").write_text("always")
    proc = _script(box, "finish.sh", layout.FAILED, "a test", TRAINSTACK_SCALE_WAIT_S="3")
    assert proc.returncode == 0, proc.stderr
    assert "not authorized to perform: autoscaling:UpdateAutoScalingGroup; retrying" in proc.stderr
    assert "could not scale" in proc.stderr and "in 3s" in proc.stderr
    assert box.argvs("shutdown") == [["-h", "now"]] and group_size(s3_run, group) == (1, 1, 1)
    failed = [e for e in machine_events(s3_run) if e["event"] == layout.MACHINE_SCALE_FAILED]
    assert len(failed) == 1 and "AccessDenied" in failed[0][layout.MARKER_REASON] and failed[0]["earlier"] == 0

    # The group's replacement: another instance, the run already FAILED. Its scale wait would
    # be 10 minutes of calls if it took the full bound; it takes 30 s and shuts down.
    md = MetadataServer(instance_id="i-0relaunched00000")
    relaunch = Sandbox(tmp_path / "relaunch", s3_run, md, group, "", warm_trainer=True)
    try:
        (relaunch.state / "scale-failures").write_text("always")
        relaunch.env["TRAINSTACK_RETRY_BASE_S"] = "1"
        assert relaunch.boot(watcher=False).wait(timeout=150) == 0, relaunch.journal()
        assert "1 earlier machine(s) of this run could not scale the group: trying for 30s" in relaunch.journal()
        assert relaunch.argvs("shutdown") == [["-h", "now"]]
        assert 2 <= len(_scale_calls(relaunch)) <= 6  # pauses 1, 2, 4, 8, 16 s within 30 s
        assert [a for a in relaunch.argvs("docker") if a[0] in ("pull", "run")] == []
        again = [e for e in machine_events(s3_run, "i-0relaunched00000") if e["event"] == layout.MACHINE_SCALE_FAILED]
        assert len(again) == 1 and again[0]["earlier"] == 1
    finally:
        relaunch.power_off()
        md.close()
    assert json.loads(s3_keys(s3_run)[layout.FAILED])[layout.MARKER_REASON] == "a test"
    assert machine_events(s3_run, INSTANCE_ID)[-1]["event"] == layout.MACHINE_SCALE_FAILED


def test_a_marker_write_that_fails_once_is_written_whole_on_the_retry(machines, s3_run, group):
    # The marker went through `json ... | retry 5 store_put`: the first try used up the pipe,
    # so a retry after one failed write stored an empty FAILED, and `ops status` showed no reason.
    # The failing CLI reads its input first, as the real one does before it sends it.
    import boto3

    box = machines(s3_run, group, "")
    _wrap(box, "aws", 'case "$*" in *"cp --only-show-errors - "*FAILED*) [ -e "$FAKE_STATE/put-failed" ] || '
                      '{ cat >/dev/null; touch "$FAKE_STATE/put-failed"; echo "Could not connect to the endpoint URL" >&2; exit 255; };; esac')
    proc = _script(box, "finish.sh", layout.FAILED, "a reason that must survive")
    assert proc.returncode == 0, proc.stderr
    assert (box.state / "put-failed").exists()  # the first write did fail
    key = f"{s3_run.uri.removeprefix(f's3://{s3_run.bucket}/')}/{layout.FAILED}"
    body = boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"]).get_object(
        Bucket=s3_run.bucket, Key=key)["Body"].read()
    marker = json.loads(body)
    assert marker["outcome"] == layout.FAILED and marker[layout.MARKER_REASON] == "a reason that must survive"


# -- the cloud's CLI ----------------------------------------------------------------------


def _end_the_run(run, marker: str = layout.FAILED) -> None:
    import boto3

    boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"]).put_object(
        Bucket=run.bucket, Key=f"{run.uri.removeprefix(f's3://{run.bucket}/')}/{marker}",
        Body=json.dumps({"outcome": marker, "reason": "an earlier machine"}).encode())


@pytest.mark.slow
def test_an_image_without_the_cli_installs_it_before_the_first_read_of_the_run(machines, s3_run, group):
    # The image has no `aws` (snap brings it). The old order read the run folder first: with
    # no CLI it could neither see the run's end, nor scale the group: a relaunch loop.
    box = machines(s3_run, group, "")
    (box.bin / "aws").rename(box.bin / "aws.from-snap")
    _wrap(box, "snap", '[ "$1 $2" = "install aws-cli" ] && mv "$FAKE_BIN/aws.from-snap" "$FAKE_BIN/aws"')
    _end_the_run(s3_run)
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    assert box.argvs("snap") == [["install", "aws-cli", "--classic"]]
    assert box.first("snap") < box.first("aws", "s3", "ls")
    assert group_size(s3_run, group) == (0, 0, 0) and box.argvs("shutdown") == [["-h", "now"]]
    assert [a for a in box.argvs("docker") if a[0] in ("pull", "run")] == []


def test_no_cli_to_be_had_ends_the_machine_within_its_bound(machines, s3_run, group):
    box = machines(s3_run, group, "", env_overrides={"TRAINSTACK_CLI_WAIT_S": "1"})
    (box.bin / "aws").unlink()
    _wrap(box, "snap", 'echo "error: cannot install \\"aws-cli\\": Post https://api.snapcraft.io: dial tcp: i/o timeout" >&2; exit 1')
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    assert "no aws CLI on this image and none could be installed" in box.journal()
    assert "gave up after 3 attempts: snap install" in box.journal() and box.argvs("shutdown") == [["-h", "now"]]
    assert box.argvs("aws") == [] and box.argvs("docker") == []


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_cli_without_create_if_absent_fails_a_cluster_run_with_the_reason(machines, request, cloud):
    # An older CLI takes `--if-none-match` (S3) / `--if-generation-match` (GCS) for an unknown
    # option: the rendezvous could never be sealed. Bootstrap says so and the run is FAILED.
    run = request.getfixturevalue({"aws": "s3_run", "gcp": "gs_run"}[cloud])
    box = machines(run, "trainstack-x", "", settings=settings_for(cloud),
                   env_overrides={"TRAINSTACK_NODES": "2"})
    proc = _script(box, "bootstrap.sh")
    assert proc.returncode == 0, proc.stderr  # today's fake CLIs have it
    if cloud == "aws":
        _wrap(box, "aws", 'case "$*" in *--generate-cli-skeleton*) echo \'{"Bucket": "", "Key": "", "IfMatch": ""}\'; exit 0;; esac')
    else:
        _wrap(box, "gcloud", 'case "$*" in "storage cp --help") echo "FLAGS --recursive"; exit 0;; esac')
    proc = _script(box, "bootstrap.sh")
    assert proc.returncode != 0
    reason = (box.root / "run/trainstack/failure-reason").read_text()
    flag = {"aws": "put-object --if-none-match", "gcp": "storage cp --if-generation-match"}[cloud]
    assert f"has no {flag}, which several machines need" in reason, reason


# -- pip at boot ------------------------------------------------------------------------

PIP_OFFLINE = """\
WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f3a>: Failed to establish a new \
connection: [Errno -3] Temporary failure in name resolution')': /simple/nvidia-cudnn-cu12/
ERROR: Could not find a version that satisfies the requirement nvidia-cudnn-cu12==9.3.0.75 (from versions: none)
ERROR: No matching distribution found for nvidia-cudnn-cu12==9.3.0.75
"""
PIP_CUT = """\
ERROR: Exception:
Traceback (most recent call last):
pip._vendor.urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='files.pythonhosted.org', port=443): \
Read timed out.
"""
PIP_CONFLICT = """\
ERROR: Cannot install -r /opt/trainstack/code/trainer/requirements.txt (line 1) and numpy==2.1.3 because these \
package versions have conflicting dependencies.
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""


def _flaky_pip(box, output: str, failures: int) -> None:
    """`docker run … pip install` fails `failures` times with `output`, then installs (machine_commands.py)."""
    (box.state / "pip-output").write_text(output)
    (box.state / "pip-failures").write_text(str(failures))
    _wrap(box, "docker", 'case "$*" in *"pip install"*) n=$(cat "$FAKE_STATE/pip-failures")\n'
                         '  if [ "$n" -gt 0 ]; then echo $((n - 1)) >"$FAKE_STATE/pip-failures"; '
                         'cat "$FAKE_STATE/pip-output"; exit 1; fi;; esac')


@pytest.fixture
def code_with_requirements(s3_run) -> str:
    from tests.userdata.cluster import upload_code
    from tests.userdata.test_boot_faults import FAKE_TRAINER

    return upload_code(s3_run, {"trainer/__init__.py": "", "trainer/__main__.py": FAKE_TRAINER,
                                "trainer/requirements.txt": "tensorboard\n"})


@pytest.mark.parametrize("output", [PIP_OFFLINE, PIP_CUT], ids=["index-unreachable", "download-cut"])
def test_pip_failing_for_the_network_is_not_a_verdict(machines, s3_run, code_with_requirements, output):
    box = machines(s3_run, "trainstack-x", code_with_requirements)
    _flaky_pip(box, output, 3)
    proc = _script(box, "bootstrap.sh")
    assert proc.returncode != 0
    assert not (box.root / "run/trainstack/failure-reason").exists(), proc.stderr
    assert "pip could not install the requirements (retried later)" in proc.stderr
    assert list((box.root / "opt/trainstack/pip").glob(".install.*")) == []  # no partial download kept
    proc = _script(box, "bootstrap.sh")  # the supervisor's next try
    assert proc.returncode == 0, proc.stderr
    assert len(list((box.root / "opt/trainstack/pip").glob("*/INSTALLED_BY_FAKE_PIP"))) == 1


def test_pip_refusing_the_requirements_fails_the_run_with_pips_words(machines, s3_run, code_with_requirements):
    box = machines(s3_run, "trainstack-x", code_with_requirements)
    _flaky_pip(box, PIP_CONFLICT, 100)
    proc = _script(box, "bootstrap.sh")
    assert proc.returncode != 0
    reason = (box.root / "run/trainstack/failure-reason").read_text()
    assert reason.startswith("pip refused the requirements") and "ResolutionImpossible" in reason, reason


@pytest.mark.slow
def test_a_network_blip_during_pip_at_boot_is_retried_and_the_run_goes_on(sandbox_factory, s3_run, group,
                                                                          code_with_requirements):
    box = sandbox_factory(code_uri=code_with_requirements)
    box.env["FAKE_TRAINER"] = "cancel"
    _flaky_pip(box, PIP_OFFLINE, 3)
    assert box.boot(watcher=False).wait(timeout=180) == 0, box.journal()
    assert "bootstrap failed for a passing reason (1 so far)" in box.journal()
    objects = s3_keys(s3_run)
    assert layout.CANCELLED in objects and layout.FAILED not in objects
    assert group_size(s3_run, group) == (0, 0, 0)


# -- the NVIDIA driver --------------------------------------------------------------------

MISMATCH_DOCKER = ("docker: Error response from daemon: failed to create task for container: failed to create shim "
                   "task: OCI runtime create failed: runc create failed: unable to start container process: error "
                   "during container init: error running hook #0: error running hook: exit status 1, stdout: , "
                   "stderr: Auto-detected mode as 'legacy'\\nnvidia-container-cli: initialization error: nvml error: "
                   "driver/library version mismatch: unknown.")


@pytest.mark.slow
@pytest.mark.parametrize("after", ["cleared", "persists", "again"])
def test_a_driver_updated_under_the_machine_reboots_it_once_instead_of_failing_the_run(
        sandbox_factory, s3_run, group, code_with_requirements, after):
    # The update lands after bootstrap: from then on every `docker run --gpus` fails and
    # nvidia-smi says "Driver/library version mismatch" until the machine reboots. Old
    # scripts counted three trainer failures and wrote FAILED.
    box = sandbox_factory(code_uri=code_with_requirements, env_overrides={"TRAINSTACK_MAX_FAILURES": "3"})
    box.env["FAKE_TRAINER"] = "cancel"
    (box.state / "upgrade-pending").touch()
    _wrap(box, "docker", 'case "$*" in "run "*"python -m trainer")\n'
                         '  [ -e "$FAKE_STATE/upgrade-pending" ] && mv "$FAKE_STATE/upgrade-pending" "$FAKE_STATE/mismatch"\n'
                         f'  [ -e "$FAKE_STATE/mismatch" ] && {{ printf "{MISMATCH_DOCKER}\\n" >&2; exit 125; }};; esac')
    _wrap(box, "nvidia-smi", '[ -e "$FAKE_STATE/mismatch" ] && { echo "Failed to initialize NVML: Driver/library '
                             'version mismatch"; echo "NVML library version: 570.195"; exit 18; }')
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    assert box.argvs("shutdown") == [["-r", "now"]], box.journal()
    assert "rebooting once to load the updated driver" in box.journal()
    assert not {layout.FAILED, layout.TIMED_OUT} & set(s3_keys(s3_run)) and group_size(s3_run, group) == (1, 1, 1)
    assert "restarting in" not in box.journal()  # not counted as the trainer's failure

    # The reboot loads the new module ("cleared"), or something else is wrong ("persists"),
    # or another update lands after it ("again": no second reboot, the run is FAILED).
    box.power_off()
    if after != "persists":
        (box.state / "mismatch").unlink()
    if after == "again":
        (box.state / "upgrade-pending").touch()
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    objects = s3_keys(s3_run)
    if after == "cleared":
        assert layout.CANCELLED in objects and layout.FAILED not in objects
    else:
        reason = json.loads(objects[layout.FAILED])[layout.MARKER_REASON]
        assert "Driver/library version mismatch" in reason
        if after == "again":
            assert reason.startswith("the NVIDIA driver still fails after a reboot")
    assert box.argvs("shutdown") == [["-r", "now"], ["-h", "now"]] and group_size(s3_run, group) == (0, 0, 0)
    # (the failed starts end in the wrapper; machine_commands.py records the one that ran)
    runs = [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]
    assert len(runs) == (1 if after == "cleared" else 0)
