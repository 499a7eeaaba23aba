"""Why the run is where it is, as text: a decision table (controller/table.py) and the run's goodput (runfolder/goodput.py).

``ops status`` shows the newest decision in a few lines and the goodput in one; ``ops synth`` shows the
table the first launch would use; the dashboard writes the same words beside each decision's mark. A table
is read as written (its JSON, documented in ``controller/table.py``): a field that is missing or of another
type shows as ``-``, never as an error, since a table of an older or newer controller may be read.
"""

from __future__ import annotations

import math

from ops.runstate import duration


def _num(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _usd(value) -> str:
    v = _num(value)
    return "-" if v is None else f"${v:,.2f}"


def price_text(row: dict) -> str:
    """``$0.4100/h aws, 2m 00s old`` (or ``estimate``: the stack's price table; or why it is unknown)."""
    price, source = _num(row.get("price")), str(row.get("price_source") or "")
    if price is None:
        return f"price unknown ({source})" if source else "price unknown"
    age = _num(row.get("price_age_s"))
    if source == "estimate":
        return f"${price:.4f}/h estimate"
    return f"${price:.4f}/h {source}" + ("" if age is None else f", {duration(age)} old")


def row_text(row: dict, *, chosen: int | None, active: int | None) -> str:
    """One placement's line: its price and the price's age, E to finish there, and whether it is feasible (why not)."""
    index = row.get("index")
    marks = ("chosen" if index == chosen else "") + (", " if index == chosen and index == active else "") + (
        "active" if index == active else "")
    head = f"{'*' if index == chosen else ' '} {index} {row.get('label') or ''}".rstrip()
    parts = [price_text(row)]
    rate = _num(row.get("rate"))
    if rate is not None:
        parts.append(f"{rate:,.0f} steps/h ({row.get('rate_source') or '?'})")
    lam = _num(row.get("lam"))
    if lam is not None:
        parts.append(f"λ {lam:.3f}/machine-h")
    boot = _num(row.get("boot_s"))
    if boot is not None:
        parts.append(f"boot {duration(boot)} ({row.get('boot_source') or '?'})")
    if _num(row.get("transfer_usd")):
        parts.append(f"transfer {_usd(row.get('transfer_usd'))}")
    cost = _num(row.get("cost"))
    parts.append(f"E {_usd(cost)}" if cost is not None else "E unknown")
    work = _num(row.get("work_usd"))
    if cost is None and work is not None:
        parts.append(f"${work:.4f} per T4-hour of work")
    if row.get("feasible") is False:
        parts.append(f"not feasible: {row.get('why') or '?'}")
    elif row.get("why"):
        parts.append(str(row["why"]))
    return f"{head}{f' ({marks})' if marks else ''}: " + "; ".join(parts)


def decision_lines(doc: dict | None, *, estimate: bool = False) -> list[tuple[str, str]]:
    """(label, text) rows for a decision table: where it chose and why, then one row per placement; none
    without a table. ``estimate``: the table was priced from the stack's price table, not from a decision."""
    if not isinstance(doc, dict):
        return []
    chosen, active = doc.get("chosen"), doc.get("active")
    when = str(doc.get("time") or "")[:19].replace("T", " ")
    where = f"placement {chosen}" if chosen is not None else "nowhere"
    head = (f"{'estimate' if estimate else when} {doc.get('policy') or '?'}: {where}"
            f" ({doc.get('reason') or 'no reason recorded'})")
    rows = [("decision", head)]
    for row in doc.get("rows") or []:
        if isinstance(row, dict):
            rows.append(("", row_text(row, chosen=chosen, active=None if estimate else active)))
    return rows


def goodput_text(g: dict | None) -> str:
    """``81% of 2h 10m paid machine time kept; against it: boots 14m 00s, idle 5m 00s, lost 6m 00s (80 steps)``."""
    if not isinstance(g, dict) or _num(g.get("paid_h")) is None:
        return ""
    share = _num(g.get("goodput"))
    head = ("-" if share is None else f"{share:.0%}") + f" of {duration(_num(g['paid_h']) * 3600)} paid machine time kept"

    def part(key: str) -> str:
        return duration((_num(g.get(key)) or 0.0) * 3600)

    against = [f"boots {part('boot_h')}", f"idle {part('idle_h')}", f"lost {part('lost_h')}"
               + (f" ({g['lost_steps']} steps)" if g.get("lost_steps") else "")]
    if _num(g.get("uncommitted_h")):
        against.append(f"not committed yet {part('uncommitted_h')}")
    return f"{head}; against it: {', '.join(against)}"
