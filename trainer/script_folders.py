"""Script mode's local folders: where the user's command runs and writes, and what of it the run keeps.

In the attempt's work folder (on a machine the data disk, `/data/work`, which survives a reboot):

- `code/`: the command's working folder, made afresh for each attempt as a copy of `--code-dir`
  (`run.code`), so a script that writes beside itself works alike on a laptop and on a machine.
  It is scratch: what the command wrote there is named at the end (`left_behind`), not kept;
- `checkpoints/`, `tensorboard/`, `model/`, `outputs/`: the folders the command is told of
  (`TRAINSTACK_*_DIR`). `outputs/` starts as the run last kept it in its `outputs/`, and is
  uploaded again with what changed; `tensorboard/` likewise to `tensorboard/`; `model/` becomes
  `model/` when the command exits 0 (`take_model`: a lone `*.keras` it saved in its working
  folder instead is taken, anything else is named);
- `messages.jsonl`: `trainer.fit`'s messages (`trainer.script_messages`), removed before each
  attempt so an attempt reads only its own command's.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from runfolder import layout

# Files a Keras script saves a model as (a SavedModel is found by its saved_model.pb).
MODEL_FILE_SUFFIXES = (".keras", ".h5", ".hdf5")


class ScriptFolders:
    """One attempt's local folders, in `work`, for the command of `code_dir`, kept in `store` (the run folder)."""

    def __init__(self, work: str, code_dir: str, store) -> None:
        self.work, self.code_dir, self.store = work, code_dir, store
        self.dirs = {name: os.path.join(work, name) for name in ("checkpoints", "tensorboard", "model", "outputs")}
        # The command's working folder: a copy of the code folder, made in prepare.
        self.workdir = os.path.join(work, "code")
        self.messages = os.path.join(work, "messages.jsonl")
        self.taken_model: str | None = None  # the working folder's model file taken as model/, once it is

    def prepare(self) -> None:
        """The run's local folders; no messages file; the working folder, a fresh copy of the code
        folder; the output folder, as the run last kept it (a resumed script finds what it wrote before)."""
        for d in self.dirs.values():
            os.makedirs(d, exist_ok=True)
        # The messages of an earlier attempt (a machine's work folder survives its reboot) were
        # said in that attempt: this one reads only its own command's.
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.messages)
        shutil.rmtree(self.workdir, ignore_errors=True)
        # The work folder may lie inside the code folder (a local --work-dir): never copied into itself.
        work = os.path.realpath(self.work)

        def ignore(folder: str, names: list[str]) -> list[str]:
            return [n for n in names if n == "__pycache__" or os.path.realpath(os.path.join(folder, n)) == work]

        shutil.copytree(self.code_dir, self.workdir, symlinks=True, ignore=ignore)
        outputs = self.dirs["outputs"]
        shutil.rmtree(outputs, ignore_errors=True)
        os.makedirs(outputs)
        kept = self.store.stat(layout.OUTPUTS_PREFIX)
        if kept:
            from runfolder.storage import download_many

            paths = {k: os.path.join(outputs, k[len(layout.OUTPUTS_PREFIX):]) for k in kept}
            download_many(self.store, paths, skip_existing=False)
            for key, path in paths.items():
                # The stored time: upload_dir then sees the kept copy as current and uploads it
                # again only when the command changes it.
                stamp = kept[key].modified.timestamp()
                os.utime(path, (stamp, stamp))

    def sync_outputs(self) -> None:
        """The output folder's new and changed files to the run's `outputs/`."""
        if os.path.isdir(self.dirs["outputs"]):
            self.store.upload_dir(self.dirs["outputs"], layout.OUTPUTS_PREFIX, changed_only=True)

    def sync_tensorboard(self) -> None:
        """The TensorBoard folder's new and changed files to the run's `tensorboard/`."""
        self.store.upload_dir(self.dirs["tensorboard"], layout.TENSORBOARD_PREFIX, changed_only=True)

    def models_elsewhere(self) -> list[str]:
        """Models the command saved outside its model folder (a `*.keras`/`*.h5` file, a SavedModel's
        folder): new or changed files in its working folder (as `./path`) and in its output folder
        (as `outputs/path`, kept there)."""
        found = []
        for root, label, compare in ((self.workdir, ".", self.code_dir), (self.dirs["outputs"], "outputs", None)):
            for folder, dirs, names in os.walk(root):
                dirs.sort()
                for name in sorted(names):
                    if not (name.endswith(MODEL_FILE_SUFFIXES) or name == "saved_model.pb"):
                        continue
                    path = os.path.join(folder, name)
                    rel = os.path.relpath(path, root)
                    if compare is not None and same_file(path, os.path.join(compare, rel)):
                        continue  # shipped with the code, not saved by this run
                    if name == "saved_model.pb":
                        rel = os.path.dirname(rel)  # the SavedModel's folder ("" for the folder itself)
                    found.append(f"{label}/{rel}")
        return found

    def take_model(self) -> tuple[int, str | None]:
        """What `model/` gets (its files), and the note that says what happened when the command left
        its model folder empty: a lone `*.keras` file it saved in its working folder is taken (the
        model of `model.save("x.keras")`); anything else is named, not guessed at."""
        model_dir = self.dirs["model"]
        files = sum(len(names) for _, _, names in os.walk(model_dir))
        if files:
            return files, None
        elsewhere = self.models_elsewhere()
        if len(elsewhere) == 1 and elsewhere[0].startswith("./") and elsewhere[0].endswith(".keras"):
            name = os.path.basename(elsewhere[0])
            shutil.copy2(os.path.join(self.workdir, elsewhere[0][2:]), os.path.join(model_dir, name))
            self.taken_model = elsewhere[0][2:]
            return 1, (f"the script saved no model in fit.model_dir(); its one model file, {elsewhere[0]} in its "
                       f"working folder, was taken as model/{name} (keras.models.load_model)")
        note = "the script saved no model in fit.model_dir()"
        if elsewhere:
            note += (f"; it saved {', '.join(elsewhere)} (./ is its working folder, a scratch copy that is not kept; "
                     "outputs/ is kept): save the model with model.export(fit.model_dir()) or "
                     "model.save(os.path.join(fit.model_dir(), 'model.keras'))")
        return 0, note

    def left_behind_line(self) -> str | None:
        """One line naming what the command wrote in its working folder and is not kept (None: nothing)."""
        return left_behind_line(left_behind(self.workdir, self.code_dir, skip=self.taken_model))


def left_behind(workdir: str, code_dir: str, *, skip: str | None = None) -> list[tuple[str, int]]:
    """What the command wrote in its working folder, which is not kept: (`./name` of each new or
    changed top-level file, or `./folder/`, its count of such files), by name. Python's caches and
    `skip` (the model file taken as `model/`) are not counted."""
    counts: dict[str, int] = {}
    if not os.path.isdir(workdir):
        return []
    for folder, dirs, names in os.walk(workdir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, workdir)
            if rel == skip or same_file(path, os.path.join(code_dir, rel)):
                continue
            top, sep, _ = rel.partition(os.sep)
            label = f"./{top}/" if sep else f"./{top}"
            counts[label] = counts.get(label, 0) + 1
    return sorted(counts.items())


def left_behind_line(found: list[tuple[str, int]], *, most: int = 5) -> str | None:
    """One line naming what `left_behind` found (the first `most` entries), and where to write instead."""
    if not found:
        return None
    names = [f"{label} ({n} file{'s' if n != 1 else ''})" if label.endswith("/") else label for label, n in found]
    shown = ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
    return (f"not kept, written in the working folder (a scratch copy of the code): {shown}; "
            "write what the run should keep to fit.output_dir() (kept as outputs/)")


def same_file(path: str, other: str) -> bool:
    """`path` is a copy of `other` as copied (same size and modification time)."""
    try:
        a, b = os.stat(path), os.stat(other)
    except OSError:
        return False
    return a.st_size == b.st_size and int(a.st_mtime) == int(b.st_mtime)
