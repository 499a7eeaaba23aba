"""trainstack's trainer: the program inside the container that trains, checkpoints and exports.

Run it with `python -m trainer --run-uri URI ...` (see `trainer/__main__.py` and `--help`).
"""
