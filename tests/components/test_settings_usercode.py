"""`run.code` and a user's `run.model`: checked before anything is created, one line naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.settings import ConfigError, usercode
from components.settings.schema import BUILTIN_MODELS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with a user folder `mine/` holding `pkg/model.py:build`."""
    (tmp_path / "trainer").mkdir()
    pkg = tmp_path / "mine" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("import keras\n\nSIZE = 3\n\ndef build(config):\n    return None\n")
    (tmp_path / "mine" / "requirements.txt").write_text("# pinned\nscikit-image==0.25.2\nrich[jupyter]==15.0.0  # ok\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "m.py").write_text("def build(): pass\n")
    return tmp_path


def _check(project: Path, code: str | None, model: str) -> Path | None:
    return usercode.validate(code, model, BUILTIN_MODELS, root=project)


def test_a_good_folder_and_model_pass(project):
    assert _check(project, "mine", "pkg.model:build") == project / "mine"
    assert _check(project, "mine", "pkg.model:SIZE") == project / "mine"  # any top-level binding
    assert _check(project, None, "mlp") is None
    assert _check(project, "mine", "transformer-lm") == project / "mine"


@pytest.mark.parametrize(("code", "model", "key", "words"), [
    (None, "pkg.model:build", "run.model", "set run.code"),
    ("nope", "pkg.model:build", "run.code", "no such folder"),
    ("/abs/path", "pkg.model:build", "run.code", "relative to the project"),
    ("../elsewhere", "pkg.model:build", "run.code", "outside the project"),
    ("trainer", "mlp", "run.code", "not the project or trainer/"),
    ("mine", "pkg.other:build", "run.model", "no module pkg.other"),
    ("mine", "pkg.model:make", "run.model", "defines no 'make'"),
    ("mine", "other.model:build", "run.model", "expected mine/other/model.py"),
])
def test_bad_code_or_model_is_one_line_naming_the_key(project, code, model, key, words):
    with pytest.raises(ConfigError) as e:
        _check(project, code, model)
    msg = str(e.value)
    assert e.value.key == key and words in msg and "\n" not in msg, msg


@pytest.mark.parametrize("line", ["numpy", "numpy>=1.26", "git+https://example.com/x.git", "-e .", "numpy==1.*x y"])
def test_unpinned_requirement_is_refused_with_its_line(project, line):
    (project / "mine" / "requirements.txt").write_text(f"rich==15.0.0\n{line}\n")
    with pytest.raises(ConfigError) as e:
        _check(project, "mine", "pkg.model:build")
    assert e.value.key == "run.code" and "line 2" in str(e.value) and "not pinned" in str(e.value)


def test_syntax_error_names_file_and_line(project):
    (project / "mine" / "pkg" / "model.py").write_text("def build(:\n")
    with pytest.raises(ConfigError) as e:
        _check(project, "mine", "pkg.model:build")
    assert "pkg/model.py line 1" in str(e.value) and "syntax error" in str(e.value)


def test_a_data_file_left_in_the_folder_is_named(project):
    (project / "mine" / "images.npy").write_bytes(b"\0" * (usercode.MAX_CODE_BYTES + 1))
    with pytest.raises(ConfigError) as e:
        _check(project, "mine", "pkg.model:build")
    msg = str(e.value)
    assert e.value.key == "run.code" and "images.npy" in msg and "run.dataUri" in msg, msg


def test_hidden_files_and_caches_do_not_ship_or_count(project):
    (project / "mine" / ".git").mkdir()
    (project / "mine" / ".git" / "pack").write_bytes(b"\0" * (usercode.MAX_CODE_BYTES + 1))
    (project / "mine" / "pkg" / "__pycache__").mkdir()
    (project / "mine" / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"x")
    names = [p.relative_to(project / "mine").as_posix() for p in usercode.code_files(project / "mine")]
    assert names == ["pkg/__init__.py", "pkg/model.py", "requirements.txt"]
    assert _check(project, "mine", "pkg.model:build") == project / "mine"


def test_the_worked_example_passes_as_it_is():
    assert usercode.validate("examples/image-cnn", "shapes.model:build", BUILTIN_MODELS) == ROOT / "examples/image-cnn"


@pytest.mark.parametrize(("run", "words"), [
    ({"model": "shapes.model:build", "synthetic": True}, "trainstack:run.model: 'shapes.model:build' is your own model"),
    ({"model": "shapes.model:nope", "code": "examples/image-cnn", "synthetic": True}, "defines no 'nope'"),
])
def test_synth_exits_2_with_one_line_and_writes_nothing(tmp_path, run, words):
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    doc["config"]["trainstack:run"] = run
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.mine.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "ops", "synth", "--stack", "mine", "--stacks-dir", str(stacks),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and words in lines[0], (p.returncode, p.stderr)
    assert not out.exists()
