"""`run.code` and a user's `run.model`: checked before anything is created, one line naming the key."""

from __future__ import annotations

import shutil
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


# -- each refusal's whole line, and what passes (mutation testing) --


def _refusal(project: Path, code: str | None, model: str, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        usercode.validate(code, model, BUILTIN_MODELS, root=project, **kw)
    return e.value


def test_an_oversized_folder_is_said_in_mib_with_its_largest_file_and_the_limit(project):
    (project / "mine" / "images.npy").write_bytes(b"\0" * (3 * 2**20 + 2**19))
    (project / "mine" / "labels.npy").write_bytes(b"\0" * 2**20)
    with pytest.raises(ConfigError) as e:
        usercode.check_size("mine", project / "mine", limit=2 * 2**20)
    assert str(e.value) == (
        "trainstack:run.code: 'mine' holds 4.5 MiB (largest: images.npy, 3.5 MiB); the folder ships to every machine: "
        "keep it under 2 MiB and put data in run.dataUri")
    # Through validate, with the default limit: the folder named as the stack names it.
    (project / "mine" / "images.npy").write_bytes(b"\0" * usercode.MAX_CODE_BYTES)
    assert str(_refusal(project, "mine", "pkg.model:build")).startswith(
        "trainstack:run.code: 'mine' holds 21.0 MiB (largest: images.npy, 20.0 MiB); the folder ships to every "
        "machine: keep it under 20 MiB and put data in run.dataUri")


def test_a_folder_exactly_at_the_limit_ships(project):
    folder = project / "mine"
    total = sum(p.stat().st_size for p in usercode.code_files(folder))
    usercode.check_size("mine", folder, limit=total)  # at the limit: fine
    with pytest.raises(ConfigError):
        usercode.check_size("mine", folder, limit=total - 1)


def test_a_folder_without_python_is_refused(project):
    (project / "data").mkdir()
    (project / "data" / "notes.txt").write_text("no code here\n")
    e = _refusal(project, "data", "mlp")
    assert (e.key, str(e)) == ("run.code", "trainstack:run.code: 'data' holds no .py files")


def test_compiled_python_and_caches_do_not_ship(project):
    pkg = project / "mine" / "pkg"
    (pkg / "model.pyc").write_bytes(b"stale")  # Python 2's layout: next to the source
    (pkg / "old.pyo").write_bytes(b"stale")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "model.cpython-311.opt-1.pyc.12345").write_bytes(b"a half-written cache file")
    names = [p.relative_to(project / "mine").as_posix() for p in usercode.code_files(project / "mine")]
    assert names == ["pkg/__init__.py", "pkg/model.py", "requirements.txt"]


def test_an_unpinned_requirement_is_one_whole_line(project):
    (project / "mine" / "requirements.txt").write_text("rich==15.0.0\n\n# data\nnumpy>=1.26\n")
    e = _refusal(project, "mine", "pkg.model:build")
    # The line after a blank and a comment is still read; the message names the file as the stack does.
    assert str(e) == ("trainstack:run.code: mine/requirements.txt line 4: 'numpy>=1.26' is not pinned; write "
                      "name==version (the machines install exactly what you tested)")


@pytest.mark.parametrize("line", [
    "numpy == 1.26.4",  # pip takes spaces around ==
    "rich==15.0.0  # pinned # twice",  # a comment that holds " #" itself
    "scikit-image==0.25.2 ; python_version >= '3.10'",
])
def test_pinned_requirements_in_their_other_spellings_pass(project, line):
    (project / "mine" / "requirements.txt").write_text(f"{line}\n")
    assert _check(project, "mine", "pkg.model:build") == project / "mine"


def test_files_in_a_declared_encoding_are_read(project):
    # Python and pip both honour a coding line; a byte that is not UTF-8 must not stop the check.
    cookie = b"# -*- coding: latin-1 -*-\n"
    (project / "mine" / "requirements.txt").write_bytes(cookie + b"# caf\xe9\nrich==15.0.0\n")
    (project / "mine" / "pkg" / "own.py").write_bytes(
        cookie + b"# donn\xe9es\ndef make_dataset(b, seed):\n    pass\n\ndef build():\n    pass\n")
    assert usercode.validate("mine", "pkg.own:build", BUILTIN_MODELS, root=project, own_data=True) == project / "mine"


def test_a_model_in_a_package_init_is_found(project):
    (project / "mine" / "pkg" / "__init__.py").write_text(
        "def make_dataset(b, seed):\n    pass\n\ndef build():\n    pass\n")
    assert usercode.validate("mine", "pkg:build", BUILTIN_MODELS, root=project, own_data=True) == project / "mine"
    e = _refusal(project, "mine", "pkg:nope")
    assert str(e) == "trainstack:run.model: 'pkg:nope': mine/pkg/__init__.py defines no 'nope'"


def test_a_syntax_error_is_the_models_key(project):
    (project / "mine" / "pkg" / "model.py").write_text("x = 1\ndef build(:\n")
    e = _refusal(project, "mine", "pkg.model:build")
    assert e.key == "run.model" and str(e).startswith(
        "trainstack:run.model: 'pkg.model:build': pkg/model.py line 2: syntax error ("), str(e)


@pytest.mark.parametrize(("source", "name", "found"), [
    ("from .nets import build\n", "build", True),
    ("from .nets import make as build\n", "build", True),
    ("from .nets import build as make\n", "build", False),
    ("import os.path\n", "os", True),
    ("import os.path\n", "path", False),
    ("build: object = None\n", "build", True),
    ("SIZE: int\n", "build", False),
    ("a = build = 1\n", "build", True),
    ("def f():\n    build = 1\n", "build", False),  # not at top level
])
def test_what_binds_a_models_name_at_top_level(source, name, found):
    assert usercode.defines(source, name) is found


@pytest.mark.parametrize(("source", "found"), [
    ("def make_dataset(b, seed):\n    pass\n", True),
    ("class make_dataset:\n    pass\n", True),
    ("x = make_dataset\n", True),
    ("x = data.make_dataset\n", True),
    ("spec(make_dataset=d)\n", True),
    ("from .data import make_dataset\n", True),
    ("from .data import load as make_dataset\n", True),
    ("from .data import make_dataset as load\n", False),
    ("x = 'make_dataset'\n", False),  # a string is not a use
])
def test_what_mentions_a_name_anywhere(source, found):
    assert usercode.mentions(source, "make_dataset") is found


def test_no_own_data_is_said_with_the_module_and_the_ways_out(project):
    (project / "mine" / "pkg" / "records.py").write_text("def build():\n    return spec(parse_tfrecord=p)\n")
    e = _refusal(project, "mine", "pkg.records:build", own_data=True)
    assert str(e) == ("trainstack:run.dataUri: is required: mine/pkg/records.py reads TFRecords (parse_tfrecord); set "
                      "dataUri (s3://… or gs://…), synthetic: true, or give its ModelSpec a make_dataset")
    e = _refusal(project, "mine", "pkg.model:build", own_data=True)
    assert str(e) == ("trainstack:run.dataUri: is required: mine/pkg/model.py names no make_dataset; set "
                      "dataUri (s3://… or gs://…), synthetic: true, or give its ModelSpec a make_dataset")


def test_a_command_needs_its_folder(project):
    e = _refusal(project, None, "mlp", command=["python", "train.py"])
    assert str(e) == "trainstack:run.command: needs run.code: the folder of your script, where the command runs"


def test_a_commands_missing_script_is_said_in_the_stacks_words(project):
    e = _refusal(project, "mine", "mlp", command=["python", "trian.py"])
    assert e.key == "run.command" and "script 'trian.py' is not in 'mine'" in str(e), str(e)
    assert str(project) not in str(e)  # this machine's path means nothing in the stack file


def test_a_bare_program_is_the_images_to_find(project):
    # The stack cannot see the image's PATH: a program this machine lacks is still accepted.
    (project / "mine" / "train.py").write_text("print('hi')\n")
    program = "trainstack-no-such-program"
    assert shutil.which(program) is None
    assert usercode.validate("mine", "mlp", BUILTIN_MODELS, root=project, command=[program, "train.py"]) == (
        project / "mine")
