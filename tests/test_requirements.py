"""`pip install -r requirements.txt` alone gives a working `ops` on both clouds.

Installing a fresh venv here would take minutes (the Pulumi providers are large wheels), so the
proof is the dependency closure instead: `ops synth`, `ops status` and `ops runs` run in a
process where importing any third-party module that is not in the install set of
requirements.txt (its distributions and what they require, as pip would resolve them) fails.
A module `ops` imports that only requirements-dev.txt brings (TensorFlow, moto, pytest) is
caught here, not on a user's laptop. Both clouds: synth of an AWS and a GCP stack, and
status / runs of runs on the S3 and GCS emulators (the stores' own client libraries load).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
OWN = {"ops", "components", "controller", "runfolder", "trainer", "policy", "schedulers", "tests"}


def _requirements(path: Path) -> list[Requirement]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(Requirement(line))
    return out


def install_set(path: Path) -> set[str]:
    """Distributions pip installs for `path`: its requirements and theirs, with markers evaluated."""
    env = default_environment()
    seen: set[str] = set()
    todo = [(r, frozenset()) for r in _requirements(path)]
    while todo:
        req, extras = todo.pop()
        name = md.distribution(req.name).metadata["Name"].lower().replace("_", "-")
        key = f"{name}[{','.join(sorted(extras | set(req.extras)))}]"
        if key in seen:
            continue
        seen.add(key)
        for dep in md.requires(req.name) or []:
            r = Requirement(dep)
            wanted = extras | set(req.extras)
            if r.marker and not any(r.marker.evaluate({**env, "extra": e}) for e in (wanted or {""})):
                continue
            todo.append((r, frozenset()))
    return {k.split("[", 1)[0] for k in seen}


def top_level_modules(dists: set[str]) -> set[str]:
    """The importable top-level names the distributions install."""
    names = set()
    for d in dists:
        dist = md.distribution(d)
        text = dist.read_text("top_level.txt")
        if text:
            names.update(t.strip() for t in text.splitlines() if t.strip())
        for f in dist.files or []:
            first = f.parts[0]
            if first.endswith((".dist-info", ".data")) or first in ("..", "bin"):
                continue
            names.add(first.removesuffix(".py").split(".")[0])
    return names


GUARD = r"""
import importlib.abc, json, sys
allowed = set(json.loads(sys.argv[1]))
class Guard(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in allowed or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        raise ModuleNotFoundError(f"{top} is imported but not installed by requirements.txt ({name})")
sys.meta_path.insert(0, Guard())
from ops.__main__ import main
sys.exit(main(sys.argv[2:]))
"""


def _ops(allowed: set[str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", GUARD, json.dumps(sorted(allowed)), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_closure_is_what_pip_would_install():
    dists = install_set(ROOT / "requirements.txt")
    assert {"pulumi", "boto3", "botocore", "paramiko", "tenacity", "google-cloud-storage"} <= dists
    assert "tensorflow" not in dists and "moto" not in dists and "keras" not in dists


def test_ops_runs_with_only_requirements_txt_installed(tmp_path):
    allowed = top_level_modules(install_set(ROOT / "requirements.txt")) | OWN
    # The guard itself works: a module only the dev requirements bring is refused.
    refused = subprocess.run([sys.executable, "-c", GUARD.replace("from ops.__main__ import main", "import moto"),
                              json.dumps(sorted(allowed))], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "moto is imported but not installed" in refused.stderr

    for stack in ("dev", "gcp-dev"):
        synth = _ops(allowed, "synth", "--stack", stack, "--out", str(tmp_path / stack), "--offline")
        assert synth.returncode == 0, synth.stderr[-3000:]
        types = {r["type"].split(":")[0] for r in json.loads((tmp_path / stack / "resources.json").read_text())}
        assert {"aws" if stack == "dev" else "gcp"} <= types

    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "progress.json").write_text(json.dumps({"step": 5, "total": 10, "loss": 1.0, "examples_per_sec": 1.0,
                                                   "attempt": 1, "updated": "2026-01-01T00:00:00+00:00"}))
    status = _ops(allowed, "status", "--run-uri", f"file://{run}", "--json")
    assert status.returncode in (0, 1), status.stderr[-3000:]
    assert json.loads(status.stdout)["step"] == 5

    runs = _ops(allowed, "runs", "--bucket-uri", f"file://{tmp_path}", "--json")
    assert runs.returncode == 0, runs.stderr[-3000:]
    assert [(r["id"], r["step"]) for r in json.loads(runs.stdout)] == [("demo", 5)]


@pytest.mark.parametrize("run_root", ["s3", "gs"], indirect=True)
def test_ops_reads_both_clouds_buckets_with_only_requirements_txt_installed(run_root):
    from runfolder.storage import open_store

    allowed = top_level_modules(install_set(ROOT / "requirements.txt")) | OWN
    open_store(run_root.uri).put_bytes("progress.json", json.dumps(
        {"step": 7, "total": 10, "loss": 1.0, "examples_per_sec": 1.0, "attempt": 1,
         "updated": "2026-01-01T00:00:00+00:00"}).encode())
    # The emulators' endpoints are in os.environ (AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST): the child reads them.
    status = _ops(allowed, "status", "--run-uri", run_root.uri, "--json")
    assert status.returncode in (0, 3), status.stderr[-3000:]
    assert json.loads(status.stdout)["step"] == 7
    bucket = run_root.uri.split("/runs/")[0]
    runs = _ops(allowed, "runs", "--bucket-uri", bucket, "--json")
    assert runs.returncode == 0, runs.stderr[-3000:]
    assert [(r["uri"], r["step"]) for r in json.loads(runs.stdout)] == [(run_root.uri, 7)]
