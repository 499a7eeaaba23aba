"""`ops status` of a finished run says how to call its SavedModel (the signature COMPLETE records)."""

from __future__ import annotations

import json

from ops import status


def test_complete_run_shows_endpoint_inputs_and_outputs(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    sig = {"endpoint": "serve", "signature": "serving_default",
           "inputs": {"image": {"dtype": "float32", "shape": [None, 32, 32, 1]}},
           "outputs": {"output_0": {"dtype": "float32", "shape": [None, 4]}}}
    (run / "COMPLETE").write_text(json.dumps({"step": 30, "attempts": 1, "signature": sig}))
    assert status.signature_lines(json.loads((run / "COMPLETE").read_text())) == [
        ("model", "SavedModel endpoint serve(image float32[?, 32, 32, 1])"),
        ("returns", "output_0 float32[?, 4]"),
    ]
    from rich.console import Console

    st = status.read_status(f"file://{run}")
    console = Console(record=True, width=120)
    console.print(status.render(st))
    text = console.export_text()
    assert "serve(image float32[?, 32, 32, 1])" in text and "output_0 float32[?, 4]" in text


def test_runs_without_a_signature_show_none():
    assert status.signature_lines(None) == []
    assert status.signature_lines({"step": 3}) == []
