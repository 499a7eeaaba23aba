"""`python -m bench --quick` on tiny sizes: the command keeps working as the trainer changes under it.

The probe wraps functions of `trainer.loop_attempt` and `trainer.loop`, and the stall bench drives
`trainer.tf_checkpoint` and `trainer.checkpoint_store` directly; a rename there fails this test
rather than the lead's next full bench run. The sections it skips (the seed script, several
workers) use only the trainer's CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import report as R
from tests.trainer.helpers import REPO, trainer_env

pytestmark = pytest.mark.slow


def test_quick_bench_measures_and_writes_its_block(tmp_path):
    results, raw = tmp_path / "RESULTS.md", tmp_path / "figures.json"
    # A bound, not a speed check: 200 s by the clock in CI (four workers on two cores), and more
    # than 300 s twice at load 10-13, where five TensorFlow processes share the cores with others.
    results.write_text("# Benchmark results\n\nwritten by hand, kept\n")
    p = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "limit,startup,stall",
                        "--results", str(results), "--json", str(raw)],
                       cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    fig = json.loads(raw.read_text())

    (row,) = fig["limit"]
    assert row["limit"]["examples_per_sec"] > 0 and row["trainer"]["examples_per_sec"] > 0
    assert row["trainer"]["checkpoints_in_loop"] >= 1  # the quick plan checkpoints every second
    assert row["limit"]["best_examples_per_sec"] > 0 and row["trainer"]["best_examples_per_sec"] > 0
    for kind in ("fresh", "resumed"):
        run = fig["startup"][kind]
        assert run["marks"]["first_step"] > run["marks"]["imports_end"] > 0
        assert run["committed"] and run["committed"]["step"] == run["step"]
    assert fig["startup"]["resumed"]["resumed_from"] == fig["startup"]["fresh"]["step"]
    assert "restore_end" in fig["startup"]["resumed"]["marks"]
    (size,) = fig["stall"]["sizes"]
    assert size["bytes"] > 1e6 and size["blocked_s"] > 0 and size["upload_s"] > 0 and size["plain_s"] > 0
    assert size["upload_alone_s"] > 0

    text = results.read_text()
    assert text.startswith("# Benchmark results\n\nwritten by hand, kept\n")
    assert R.BEGIN in text and "python -m bench --quick --only limit,startup,stall" in text
    for heading in ("### Goals", "### 1.", "### 3.", "### 4.", "### 5."):
        assert heading in text


def test_quick_bench_says_it_skipped_the_boot_section(tmp_path):
    # The boot sandbox's two machines cost ~33 s of CPU at any size: the quick run leaves them out, and says so.
    results, raw, tmp = tmp_path / "RESULTS.md", tmp_path / "figures.json", tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "boot", "--results", str(results),
                        "--json", str(raw)], cwd=REPO, env=trainer_env(TMPDIR=str(tmp)), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not list(tmp.glob("trainstack-bench-*")), "the bench left its runs' folder behind"
    fig = json.loads(raw.read_text())
    assert fig["boot"]["skipped"].startswith("skipped in the quick run") and not fig["errors"]
    text = results.read_text()
    assert "### 7. Boot" in text and "Not measured: skipped in the quick run" in text
    assert "| replacement power-on → first step ≤ 0.5× the first machine's (boot sandbox) | not measured: " in text
