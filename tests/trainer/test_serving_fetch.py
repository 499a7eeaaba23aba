"""trainer/serving_fetch.py: a serving pod's init container copies the run's published versions into the folder
tensorflow/serving loads; a source with none is a bad configuration (exit 2), a failed read a retry (exit 1)."""

from __future__ import annotations

from runfolder.storage import open_store
from trainer import serving_fetch


def test_the_versions_are_copied_with_their_layout_and_nothing_else(tmp_path, capsys):
    store = open_store(f"file://{tmp_path}/run/serving")
    for key in ("1/saved_model.pb", "1/variables/variables.index", "2/saved_model.pb", "2/variables/variables.data"):
        store.put_bytes(key, key.encode())
    store.put_bytes("notes.txt", b"not a version")
    assert serving_fetch.main([f"file://{tmp_path}/run/serving", str(tmp_path / "out")]) == 0
    got = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert got == ["1/saved_model.pb", "1/variables/variables.index", "2/saved_model.pb",
                   "2/variables/variables.data"]
    assert (tmp_path / "out/2/variables/variables.data").read_bytes() == b"2/variables/variables.data"
    assert capsys.readouterr().err.strip().startswith("trainer.serving_fetch: 2 version(s) from ")


def test_no_version_is_exit_2_and_an_unreadable_source_exit_1(tmp_path, capsys):
    assert serving_fetch.main([f"file://{tmp_path}/empty", str(tmp_path / "out")]) == 2
    assert serving_fetch.main(["nowhere://x", str(tmp_path / "out")]) == 1
    assert serving_fetch.main(["only-one"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 3
