"""TensorFlow's known start-up lines, and holding them back: what `python -m trainer` and a
script-mode parent both filter out of what a person reads (`--verbose` shows everything)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# Known start-up lines that say nothing about the run (matched at the start of a line).
TF_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] "  # absl/tsl INFO lines (oneDNN, CPU features, no CUDA driver)
    r"|To enable the following instructions: "  # the CPU-features note's second line
    r"|[EW]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] (Unable to register cu\w+ factory|computation placer already registered"
    r"|TF-TRT Warning: Could not find TensorRT)"
)


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Capture file descriptor 2 (where C++ logs go) while the block runs, then write back
    every line but TF_NOISE. Bounded to the import: a run's own errors are never held back."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not TF_NOISE.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
