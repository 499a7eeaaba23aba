"""The operator's command line: `python -m ops synth|...` (see ops/__main__.py)."""
