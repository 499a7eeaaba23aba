"""`run.code`: the user's folder of Python modules, checked before anything is created.

The folder ships to the machines with the trainer (components/code.py) and is the trainer's
`--code-dir`. Everything that would make a machine fail after paying for its boot is found
here instead, without importing TensorFlow or the user's code: the folder exists inside the
project, `run.model`'s `module:function` is defined in it (read from the source with `ast`),
it is small enough to be code (not a data set left in it), and its `requirements.txt` pins
every line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from components.project import ROOT
from components.settings.errors import ConfigError

# Code, not data: a few MiB is a large project; data belongs in run.dataUri.
MAX_CODE_BYTES = 20 * 1024 * 1024
REQUIREMENTS = "requirements.txt"
# name[extras]==version, optionally followed by an environment marker.
_PINNED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*==\s*[A-Za-z0-9][A-Za-z0-9.+!_-]*(\s*;.*)?")


def code_files(folder: Path) -> list[Path]:
    """The files of `folder` that ship: everything but hidden files, caches and compiled Python."""
    keep = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        if p.is_file() and p.suffix not in (".pyc", ".pyo"):
            keep.append(p)
    return keep


def resolve(code: str, root: Path = ROOT) -> Path:
    """The folder `run.code` names, relative to the project; ConfigError when it cannot ship."""
    if Path(code).is_absolute():
        raise ConfigError("run.code", f"{code!r}: expected a folder relative to the project ({root})")
    folder = (root / code).resolve()
    if not folder.is_relative_to(root):
        raise ConfigError("run.code", f"{code!r}: is outside the project ({root}); move the folder into it")
    if not folder.is_dir():
        raise ConfigError("run.code", f"{code!r}: no such folder in the project ({root})")
    if folder == root or folder == root / "trainer":
        raise ConfigError("run.code", f"{code!r}: name the folder of your own modules, not the project or trainer/")
    return folder


def check_size(code: str, folder: Path, limit: int = MAX_CODE_BYTES) -> None:
    """The folder holds code: refuse one over `limit` bytes, naming its largest file."""
    files = code_files(folder)
    sizes = {p: p.stat().st_size for p in files}
    total = sum(sizes.values())
    if total > limit:
        biggest = max(sizes, key=sizes.get)
        raise ConfigError("run.code", f"{code!r} holds {total / 2**20:.1f} MiB (largest: "
                                      f"{biggest.relative_to(folder)}, {sizes[biggest] / 2**20:.1f} MiB); the folder "
                                      f"ships to every machine: keep it under {limit // 2**20} MiB and put data in "
                                      "run.dataUri")
    if not any(p.suffix == ".py" for p in files):
        raise ConfigError("run.code", f"{code!r} holds no .py files")


def check_requirements(code: str, folder: Path) -> None:
    """Every line of the folder's requirements.txt is `name==version` (comments and blanks aside)."""
    req = folder / REQUIREMENTS
    if not req.is_file():
        return
    for n, raw in enumerate(req.read_text(errors="replace").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if not _PINNED.fullmatch(line):
            raise ConfigError("run.code", f"{code}/{REQUIREMENTS} line {n}: {line!r} is not pinned; write "
                                          "name==version (the machines install exactly what you tested)")


def defines(source: str, name: str) -> bool:
    """Whether module source binds `name` at top level (def, class, assignment or import)."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return True
    return False


def check_model(model: str, code: str | None, folder: Path | None) -> None:
    """`package.module:function` is defined in the folder (the built-in models need no folder)."""
    module, _, fn = model.partition(":")
    if folder is None:
        raise ConfigError("run.model", f"{model!r} is your own model: set run.code to the project folder that "
                                       f"holds {module.replace('.', '/')}.py (see docs/your-model.md)")
    base = folder.joinpath(*module.split("."))
    path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
    if path is None:
        raise ConfigError("run.model", f"{model!r}: no module {module} in run.code {code!r} "
                                       f"(expected {code}/{module.replace('.', '/')}.py)")
    try:
        found = defines(path.read_text(errors="replace"), fn)
    except SyntaxError as e:
        raise ConfigError("run.model", f"{model!r}: {path.relative_to(folder)} line {e.lineno}: "
                                       f"syntax error ({e.msg})") from None
    if not found:
        raise ConfigError("run.model", f"{model!r}: {code}/{path.relative_to(folder)} defines no {fn!r}")


def mentions(source: str, name: str) -> bool:
    """Whether module source uses `name` anywhere: a def, a variable, an attribute or a keyword argument."""
    for node in ast.walk(ast.parse(source)):
        found = (
            (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name)
            or (isinstance(node, ast.Name) and node.id == name)
            or (isinstance(node, ast.Attribute) and node.attr == name)
            or (isinstance(node, ast.keyword) and node.arg == name)
            or (isinstance(node, ast.alias) and (node.asname or node.name) == name)
        )
        if found:
            return True
    return False


def check_own_data(model: str, code: str | None, folder: Path) -> None:
    """A user model without run.dataUri or synthetic must bring its own data: its module names
    `make_dataset` (a ModelSpec field). One naming only `parse_tfrecord` reads TFRecords from dataUri.
    What the source cannot show (a ModelSpec built elsewhere) is the trainer's to refuse (exit 78)."""
    module = model.partition(":")[0]
    base = folder.joinpath(*module.split("."))
    path = next(p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file())
    source = path.read_text(errors="replace")
    if mentions(source, "make_dataset"):
        return
    reads = "reads TFRecords (parse_tfrecord)" if mentions(source, "parse_tfrecord") else "names no make_dataset"
    raise ConfigError("run.dataUri", f"is required: {code}/{path.relative_to(folder)} {reads}; set dataUri "
                                     "(s3://… or gs://…), synthetic: true, or give its ModelSpec a make_dataset")


def check_command(command: list[str], code: str | None, folder: Path | None) -> None:
    """run.command starts in the run.code folder: a program given with a path is an executable file
    there, and a `python script.py` command's script is there. A bare program (python, bash) is the
    image's, checked by the trainer on the machine."""
    if folder is None:
        raise ConfigError("run.command", "needs run.code: the folder of your script, where the command runs")
    from trainer.config import command_problem

    problem = command_problem(command, str(folder), look_up=False)
    if problem:
        raise ConfigError("run.command", f"{command!r}: {problem.replace(str(folder), repr(code))}")


def validate(code: str | None, model: str, builtin: tuple[str, ...], root: Path = ROOT, *,
             command: list[str] | None = None, own_data: bool = False) -> Path | None:
    """All of the above; returns the folder (None when the stack ships no user code).

    `own_data`: the stack gives no dataUri and no synthetic data, so a user model must bring its own.
    """
    folder = None
    if code is not None:
        folder = resolve(code, root)
        check_size(code, folder)
        check_requirements(code, folder)
    if command is not None:
        check_command(command, code, folder)
    elif model not in builtin:
        check_model(model, code, folder)
        if own_data:
            check_own_data(model, code, folder)
    return folder
