"""The bench's arithmetic and its Markdown: ratios, goals, tables, and the generated block of RESULTS.md.

Pure functions on plain data, so they can be unit-tested without TensorFlow
(tests/bench/test_report.py). `bench.run_all` measures; this module turns the figures
into the section of `bench/RESULTS.md` between the two markers below, leaving the rest of
the file (how to run it, the history of changes) as written by hand.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

BEGIN = "<!-- bench:begin (written by `python -m bench`; edits here are overwritten) -->"
END = "<!-- bench:end -->"


def ratio(num: float | None, den: float | None) -> float | None:
    """`num / den`, or None when either is missing or `den` is not positive."""
    if num is None or den is None or not den > 0:
        return None
    return num / den


def steady_rate(examples: float, seconds: float, first_examples: float, first_seconds: float) -> float | None:
    """Examples/s after the first call (which traces the step): (examples - first) / (seconds - first)."""
    rest = seconds - first_seconds
    if rest <= 0:
        return None
    return (examples - first_examples) / rest


def stall_percent(blocked_s: float, every_s: float) -> float:
    """Share of wall time lost when each `every_s` seconds of training is followed by `blocked_s` of stall."""
    if every_s <= 0:
        raise ValueError(f"checkpoint interval must be positive, got {every_s!r}")
    total = every_s + max(blocked_s, 0.0)
    return 100.0 * max(blocked_s, 0.0) / total


def contention_seconds(upload_s: float, rate_base: float | None, rate_during: float | None) -> float:
    """Training seconds lost while an upload ran beside it: upload time × the fraction of speed lost."""
    if not rate_base or rate_during is None or upload_s <= 0:
        return 0.0
    return upload_s * max(0.0, 1.0 - rate_during / rate_base)


def throughput_mb_s(nbytes: float, seconds: float) -> float | None:
    """MB/s (10^6 bytes) or None for a zero duration."""
    return nbytes / 1e6 / seconds if seconds > 0 else None


def split_phases(marks: dict[str, float], order: Sequence[tuple[str, str, str]]) -> list[tuple[str, float]]:
    """Durations of named phases from `marks` (seconds since process start).

    `order` holds `(label, start_mark, end_mark)`; a phase whose marks are missing is left
    out. The last row, "other", is the first step's time less every listed phase, so the
    rows add up to process start → first step (`marks["first_step"]`).
    """
    rows: list[tuple[str, float]] = []
    for label, a, b in order:
        if a in marks and b in marks:
            rows.append((label, max(0.0, marks[b] - marks[a])))
    if "first_step" in marks:
        rows.append(("other (store, events, Python between phases)", max(0.0, marks["first_step"] - sum(s for _, s in rows))))
    return rows


def goal(value: float | None, target: float, *, at_least: bool = True) -> str:
    """'met' / 'not met' / 'n/a' for a figure against its goal."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    ok = value >= target if at_least else value <= target
    return "met" if ok else "**not met**"


def fmt(value, spec: str = ",.0f", none: str = "–") -> str:
    """A number formatted with `spec`, or `none` for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return none
    return format(value, spec)


def pct(value: float | None, digits: int = 0) -> str:
    """A fraction (0.93) as a percentage ('93 %')."""
    return "–" if value is None else f"{100 * value:.{digits}f} %"


def times(value: float | None, digits: int = 2) -> str:
    """A ratio as '2.50×'."""
    return "–" if value is None else f"{value:.{digits}f}×"


def table(header: Sequence[str], rows: Iterable[Sequence], align: Sequence[str] | None = None) -> str:
    """A Markdown table; `align` holds 'l' or 'r' per column (default: first left, rest right)."""
    header = list(header)
    align = list(align or ["l"] + ["r"] * (len(header) - 1))
    if len(align) != len(header):
        raise ValueError(f"{len(align)} alignments for {len(header)} columns")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(header):
            raise ValueError(f"row {cells} has {len(cells)} cells, the header {len(header)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_block(document: str, block: str) -> str:
    """`document` with the text between BEGIN and END replaced by `block` (appended when absent)."""
    body = f"{BEGIN}\n{block.strip()}\n{END}"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if pattern.search(document):
        return pattern.sub(lambda _: body, document, count=1)
    return document.rstrip() + "\n\n" + body + "\n"
