"""`ops tensorboard`: the bucket mirror (by hand and by its thread), the flags it refuses, and a
real TensorBoard serving a bucket run's scalars on 127.0.0.1 only (slow: TensorFlow writes the
event files with the trainer's own writer, and TensorBoard starts in a subprocess)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from devtools.servers import free_port
from ops import tensorboard as tb
from ops.__main__ import main
from runfolder import layout
from runfolder.storage import open_store
from tests.ops.helpers import ctrl_c_reaches_it

ROOT = Path(__file__).resolve().parents[2]
TB = layout.TENSORBOARD_PREFIX
FIRST = f"{TB}events.out.tfevents.1700000000.host.1.v2"
EVAL = f"{TB}eval/events.out.tfevents.1700000001.host.2.v2"


def wait_for(check, timeout: float = 30.0, what: str = "condition"):
    """Poll ``check`` until it returns something true; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)


@pytest.mark.parametrize("run_root", ["file", "s3", "gs"], indirect=True)
def test_sync_mirrors_the_event_files_and_then_only_what_changed(run_root, tmp_path):
    store = open_store(run_root.uri)
    store.put_bytes(FIRST, b"A" * 100)
    store.put_bytes(EVAL, b"E" * 10)
    store.put_bytes(layout.PROGRESS_KEY, b"{}")  # outside tensorboard/: not mirrored
    mirror = tb.Mirror(store, tmp_path / "mirror")

    assert mirror.sync() == 2
    first = tmp_path / "mirror" / Path(FIRST).name
    assert first.read_bytes() == b"A" * 100
    assert (tmp_path / "mirror" / "eval" / Path(EVAL).name).read_bytes() == b"E" * 10
    assert sorted(p.name for p in (tmp_path / "mirror").rglob("*") if p.is_file()) == sorted(
        [Path(FIRST).name, Path(EVAL).name])
    assert mirror.sync() == 0

    # The trainer uploads a grown event file and, after a restart, a new one.
    inode = first.stat().st_ino
    store.put_bytes(FIRST, b"A" * 100 + b"B" * 50)
    later = f"{TB}events.out.tfevents.1700000500.host.3.v2"
    store.put_bytes(later, b"C" * 7)
    assert mirror.sync() == 2
    assert first.read_bytes() == b"A" * 100 + b"B" * 50
    # Appended in place: TensorBoard, which keeps the file open, reads the new records.
    assert first.stat().st_ino == inode
    assert (tmp_path / "mirror" / Path(later).name).read_bytes() == b"C" * 7

    # An object that is not an extension of the local file replaces it.
    store.put_bytes(FIRST, b"Z" * 160)
    assert mirror.sync() == 1
    assert first.read_bytes() == b"Z" * 160

    # A mirror kept from an earlier session (--mirror DIR) downloads nothing again.
    assert tb.Mirror(store, tmp_path / "mirror").sync() == 0


def test_a_key_that_would_leave_the_mirror_is_skipped(tmp_path):
    class Listing:
        def stat(self, prefix):
            from datetime import UTC, datetime

            from runfolder.storage import ObjectInfo
            return {f"{prefix}../escape": ObjectInfo(1, datetime.now(UTC)),
                    f"{prefix}ok.tfevents": ObjectInfo(1, datetime.now(UTC))}

        def get_file(self, key, path):
            Path(path).write_bytes(b"x")

    mirror = tb.Mirror(Listing(), tmp_path / "m")
    assert mirror.sync() == 1
    assert (tmp_path / "m" / "ok.tfevents").is_file() and not (tmp_path / "escape").exists()


@pytest.mark.parametrize("run_root", ["file", "s3"], indirect=True)
def test_the_thread_picks_up_a_file_added_later_and_outlives_a_failed_round(run_root, tmp_path):
    store = open_store(run_root.uri)
    store.put_bytes(FIRST, b"A" * 10)
    mirror = tb.Mirror(store, tmp_path / "mirror")
    assert mirror.sync() == 1

    class Flaky:
        """The run's store, failing its first listing as a dropped connection would."""

        def __init__(self):
            self.failed = False

        def stat(self, prefix):
            if not self.failed:
                self.failed = True
                raise ConnectionError("connection reset")
            return store.stat(prefix)

        def get_file(self, key, path):
            store.get_file(key, path)

    mirror.store = Flaky()
    errors = []

    class Err:
        def write(self, text):
            errors.append(text)

    syncer = tb.Syncer(mirror, 0.1, err=Err()).start()
    try:
        store.put_bytes(EVAL, b"E" * 5)
        wait_for(lambda: (tmp_path / "mirror" / "eval" / Path(EVAL).name).is_file(), what="the later file")
    finally:
        syncer.stop(timeout=10)
    assert (tmp_path / "mirror" / "eval" / Path(EVAL).name).read_bytes() == b"E" * 5
    assert not syncer._thread.is_alive()
    assert any("could not refresh the mirror (ConnectionError: connection reset)" in e for e in errors)


@pytest.mark.parametrize("extra", [["--bind_all"], ["--host", "0.0.0.0"], ["--host=0.0.0.0"],
                                   ["--logdir", "/"], ["--port", "1"]])
def test_flags_that_would_serve_elsewhere_or_something_else_are_refused(tmp_path, extra):
    with pytest.raises(tb.OpsError, match="cannot be passed to TensorBoard here"):
        tb.configure(tmp_path, 6006, extra)


def test_passed_through_flags_reach_tensorboard_and_it_stays_on_loopback(tmp_path):
    flags = tb.configure(tmp_path, 7007, ["--reload_interval", "2", "--window_title", "demo"]).flags
    assert (flags.host, flags.port, flags.logdir, flags.bind_all) == ("127.0.0.1", 7007, str(tmp_path), False)
    assert (flags.reload_interval, flags.window_title) == (2.0, "demo")


def test_no_run_at_the_uri_is_exit_2_and_one_line(file_run, capsys):
    assert main(["tensorboard", "--run-uri", file_run.uri, "--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ops tensorboard: no run at {file_run.uri}: nothing is stored there (check the URI)"


@pytest.mark.parametrize("uri", ["runs/demo", "ftp://x/runs/demo"])
def test_a_bad_run_uri_is_exit_2(uri, capsys):
    assert main(["tensorboard", "--run-uri", uri]) == 2
    assert capsys.readouterr().err.startswith("ops tensorboard: run URI")


class FakeTensorBoard:
    """Stands in for TensorBoard's blocking server: records what it would have served."""

    def __init__(self, mirror_dir, port, extra):
        self.mirror_dir, self.port, self.extra = Path(mirror_dir), port, extra
        self.files: list[str] = []

    def main(self):
        self.files = sorted(str(p.relative_to(self.mirror_dir)) for p in self.mirror_dir.rglob("*") if p.is_file())
        return 0


def test_a_stacks_run_is_mirrored_before_tensorboard_starts_and_the_temporary_mirror_goes(
        file_run, monkeypatch, capsys):
    from ops import hosts

    open_store(file_run.uri).put_bytes(EVAL, b"E")
    asked = []
    monkeypatch.setattr(hosts, "run_uri_for_stack", lambda stack: asked.append(stack) or file_run.uri)
    served = []
    monkeypatch.setattr(tb, "configure", lambda *a: served.append(FakeTensorBoard(*a)) or served[-1])

    assert main(["tensorboard", "--stack", "dev", "--port", "7007", "--", "--reload_interval", "5"]) == 0
    assert asked == ["dev"]
    [fake] = served
    assert (fake.port, fake.extra, fake.files) == (7007, ["--reload_interval", "5"], [f"eval/{Path(EVAL).name}"])
    assert not fake.mirror_dir.exists()
    assert f"ops tensorboard: {file_run.uri} at http://127.0.0.1:7007/" in capsys.readouterr().err


def test_a_stack_whose_run_has_no_event_files_yet_is_served_with_a_note(file_run, monkeypatch, tmp_path, capsys):
    from ops import hosts

    monkeypatch.setattr(hosts, "run_uri_for_stack", lambda stack: file_run.uri)
    monkeypatch.setattr(tb, "configure", lambda *a: FakeTensorBoard(*a))
    assert main(["tensorboard", "--stack", "dev", "--mirror", str(tmp_path / "kept")]) == 0
    assert "no event files under" in capsys.readouterr().err
    assert (tmp_path / "kept").is_dir()  # --mirror DIR is kept for next time


def test_a_stack_without_outputs_is_exit_2(monkeypatch, capsys):
    from ops import hosts

    def fail(stack):
        raise hosts.HostsError(f"stack {stack!r} has no output runUri")

    monkeypatch.setattr(hosts, "run_uri_for_stack", fail)
    assert main(["tensorboard", "--stack", "nope"]) == 2
    assert capsys.readouterr().err.strip() == "ops tensorboard: stack 'nope' has no output runUri"


def _get(port: int, path: str):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _listening(port: int) -> dict[str, list[str]]:
    """Local addresses listening on ``port`` (Linux /proc/net), by family."""
    out: dict[str, list[str]] = {"tcp": [], "tcp6": []}
    for family in out:
        for line in Path(f"/proc/net/{family}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                out[family].append(addr)
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux /proc/net")
def test_tensorboard_serves_a_bucket_runs_loss_on_loopback_and_follows_the_run(s3_run, tmp_path):
    from trainer.summaries import Summaries

    store = open_store(s3_run.uri)
    writer = Summaries(str(tmp_path / "work" / "tensorboard"), store)
    for step, loss in [(1, 2.0), (2, 1.5), (3, 1.0)]:
        writer.scalars(step, {"loss": loss})
    writer.sync()

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops", "tensorboard", "--run-uri", s3_run.uri, "--port", str(port),
         "--interval", "0.5", "--", "--reload_interval", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ctrl_c_reaches_it)
    try:
        def loss_steps():
            if proc.poll() is not None:
                raise AssertionError(f"ops tensorboard ended early: {proc.stdout.read()[-3000:]}")
            tags = _get(port, "/data/plugin/scalars/tags") or {}
            runs = [run for run, t in tags.items() if "loss" in t]
            if not runs:
                return None
            query = urllib.parse.urlencode({"run": runs[0], "tag": "loss"})
            return [(step, value) for _wall, step, value in _get(port, f"/data/plugin/scalars/scalars?{query}") or []]

        assert wait_for(loss_steps, timeout=120, what="TensorBoard to list the loss") == [(1, 2.0), (2, 1.5), (3, 1.0)]

        # Only on 127.0.0.1: no IPv4 wildcard, no IPv6 socket, and another loopback address is refused.
        listening = _listening(port)
        assert listening == {"tcp": ["0100007F"], "tcp6": []}, listening
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", port), timeout=5):
            pass

        # The run trains on: the grown event file reaches the running TensorBoard through the mirror.
        for step, loss in [(4, 0.5), (5, 0.25)]:
            writer.scalars(step, {"loss": loss})
        writer.sync()
        assert wait_for(lambda: (s := loss_steps()) and s[-1] == (5, 0.25) and s, timeout=60,
                        what="the new steps") == [(1, 2.0), (2, 1.5), (3, 1.0), (4, 0.5), (5, 0.25)]
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    # The temporary mirror goes with the command.
    mirror = re.search(r"\(mirror (\S+), refreshed", out)
    assert mirror, out[-3000:]
    assert not os.path.exists(mirror.group(1))


@pytest.mark.slow
def test_ops_tensorboard_runs_with_only_requirements_txt_installed(file_run):
    """TensorBoard and everything it loads come from requirements.txt (no TensorFlow): the whole
    app is built, plugins included, and the command ends only because the port is taken."""
    from tests.test_requirements import OWN, _ops, install_set, top_level_modules

    store = open_store(file_run.uri)
    store.put_bytes(FIRST, b"")
    allowed = top_level_modules(install_set(ROOT / "requirements.txt")) | OWN
    assert "tensorflow" not in allowed
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _ops(allowed, "tensorboard", "--run-uri", file_run.uri, "--port", str(port))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "is imported but not installed" not in done.stderr
    assert f"TensorBoard could not listen on 127.0.0.1:{port} (its error is above); choose another port" in done.stderr


def test_a_mirror_folder_that_cannot_be_made_is_exit_2(file_run, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    assert main(["tensorboard", "--run-uri", file_run.uri, "--mirror", str(tmp_path / "afile")]) == 2
    assert f"cannot use {tmp_path / 'afile'} as the mirror" in capsys.readouterr().err
