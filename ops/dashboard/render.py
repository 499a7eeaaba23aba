"""The dashboard's pages: HTML with the charts drawn here, on the server, as inline SVG.

Why server-side SVG and no chart library: the page must work offline (no CDN reaches the
machines or many users' networks), and a chart library served locally would be a JavaScript
bundle to vendor, pin and keep patched for a few lines and dots. SVG from Python is plain
text the tests can count in the DOM (an attempt is a ``rect.attempt``, a preemption a
``.mark.preempted``), hovering shows each element's ``<title>``, and the page has no script
at all: sorting is a link (``?sort=cost``) and refreshing is ``<meta http-equiv=refresh>``.
"""

from __future__ import annotations

import html
import math
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from ops import runstate, status, why
from ops.dashboard import data
from ops.dashboard.data import Row, RunPage, writes_per_hour
from runfolder import layout

STATE_COLOURS = {
    runstate.NOT_STARTED: "#888", runstate.RUNNING: "#0a7ea4", runstate.STALLED: "#a0279a",
    runstate.PREEMPTED: "#c77700", runstate.STOPPED: "#c77700", layout.COMPLETE: "#2e7d32",
    layout.CANCELLED: "#c77700", layout.FAILED: "#c62828", layout.TIMED_OUT: "#c62828",
}
MARK_STYLE = {  # kind: (colour, shape, label)
    layout.SPOT_NOTICE: ("#e69500", "triangle", "spot notice"),
    layout.REBALANCE: ("#e6c200", "triangle", "rebalance"),
    layout.PREEMPTED: ("#c62828", "cross", "preempted"),
    layout.FAILED_EVENT: ("#8b0000", "cross", "attempt failed"),
    layout.CANCELLED_EVENT: ("#c77700", "cross", "cancelled"),
}
DECISION_COLOUR = "#6a3d9a"
BOOT_COLOUR, LOST_COLOUR, UNCOMMITTED_COLOUR = "#9e9e9e", "#c62828", "#e69500"
TICK_KINDS = (layout.EVALUATED, layout.CHECKPOINT)
MAX_TICKS = 300
PALETTE = ("#0a7ea4", "#c77700", "#6a3d9a", "#2e7d32", "#b15928", "#1f78b4")

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:20px 28px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px}
a{color:#0a5fa4;text-decoration:none} a:hover{text-decoration:underline}
.sub{color:#666;margin-bottom:12px} .dim{color:#777}
table.runs{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002}
table.runs{font-size:13px} table.runs th,table.runs td{padding:5px 6px;border-bottom:1px solid #eee;text-align:left;white-space:nowrap}
table.runs th{background:#f0f0f0;font-weight:600;white-space:normal;vertical-align:bottom} td.num,th.num{text-align:right}
table.runs td.metric{white-space:normal;min-width:4em} .nowrap{white-space:nowrap}
table.runs td.run-cell{white-space:normal;max-width:16em;overflow-wrap:anywhere}
.state{font-weight:600}
.notes{background:#fff8e1;border:1px solid #f0d48a;padding:6px 12px;margin:8px 0;max-width:1000px}
.notes li{margin:2px 0}
.facts{display:grid;grid-template-columns:max-content auto;gap:3px 16px;background:#fff;padding:10px 14px;
 box-shadow:0 1px 2px #0002;max-width:1100px}
.facts dt{font-weight:600} .facts dd{margin:0}
svg{background:#fff;box-shadow:0 1px 2px #0002;font:11px system-ui,sans-serif}
code{background:#eee;padding:1px 4px;border-radius:3px}
.charts{display:flex;flex-wrap:wrap;gap:14px}
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}"


def _money_fine(v: float) -> str:
    """Dollars in cents, or in tenths of a cent under one (a short run's cost is not "$0.00")."""
    return f"${v:,.2f}" if v >= 0.01 or v == 0 else f"${v:.3f}" if v >= 0.001 else "<$0.001"


def _page(title: str, body: str, *, refresh: float | None) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh:g}">' if refresh else ""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>{meta}<title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>")


def _notes(notes: list[str]) -> str:
    if not notes:
        return ""
    return '<ul class="notes">' + "".join(f'<li class="note">{_e(n)}</li>' for n in notes) + "</ul>"


def _state(state: str) -> str:
    return f'<span class="state" style="color:{STATE_COLOURS.get(state, "#222")}">{_e(state)}</span>'


def _step(r: Row) -> str:
    if r.step is None:
        return "-"
    return f"{r.step}/{r.total}" if r.total else str(r.step)


def _metric(m: tuple[str, float] | None, at: str = "") -> str:
    """A metric's name and value (and where), the value kept on one line: a narrow window wraps the name."""
    return "-" if m is None else f'{_e(m[0])} <span class="nowrap">{m[1]:.4g}{at}</span>'


def _best(best: dict | None) -> str:
    if not best:
        return "-"
    return _metric((best["metric"], best["value"]), f" @{_e(best['step'])}")


# The runs table's columns: (key, heading, numeric, sort key).
COLUMNS = (
    ("run", "run", False, lambda r: r.id),
    ("state", "state", False, lambda r: r.state),
    ("step", "step", True, lambda r: (r.step or 0) / r.total if r.total else (r.step or 0)),
    ("train", "train", True, lambda r: r.train_metric[1] if r.train_metric else -math.inf),
    ("val", "validation", True, lambda r: r.val_metric[1] if r.val_metric else -math.inf),
    ("best", "best (keepBest)", True, lambda r: r.best["value"] if r.best else -math.inf),
    ("attempts", "attempts", True, lambda r: r.attempts),
    ("preemptions", "preemptions", True, lambda r: r.preemptions),
    ("moves", "moves", True, lambda r: r.moves),
    ("placements", "placements", False, lambda r: ", ".join(r.placements)),
    ("hours", "machine-hours", True, lambda r: r.machine_hours or 0.0),
    ("cost", "cost", True, lambda r: r.cost_usd if r.cost_usd is not None else -1.0),
    ("goodput", "goodput", True, lambda r: r.goodput if r.goodput is not None else -1.0),
    ("age", "age", True, lambda r: r.age_seconds),
)
SORTS = {c[0]: c[3] for c in COLUMNS}


def runs_page(bucket: str, rows: list[Row], notes: list[str], *, sort: str = "age", desc: bool = False,
              refresh: float) -> str:
    """The table of every run; ``sort`` a column key (default: newest first)."""
    key = SORTS.get(sort, SORTS["age"])
    rows = sorted(rows, key=key, reverse=desc)
    head = []
    for k, heading, numeric, _f in COLUMNS:
        arrow = (" ▼" if desc else " ▲") if k == sort else ""
        order = "asc" if (k == sort and desc) else "desc" if k == sort else ("desc" if numeric and k != "age" else "asc")
        head.append(f'<th class="{"num" if numeric else ""}" data-col="{k}"><a href="?sort={k}&amp;order={order}">'
                    f"{_e(heading)}{arrow}</a></th>")
    body = []
    price_notes = sorted({r.cost_note for r in rows if r.cost_note})
    for r in rows:
        cells = [
            f'<td class="run-cell"><a class="run-link" href="/run/{quote(r.id)}">{_e(r.id)}</a></td>',
            f'<td class="state-cell" title="{_e(r.detail)}">{_state(r.state)}</td>',
            f'<td class="num">{_step(r)}</td>', f'<td class="num metric">{_metric(r.train_metric)}</td>',
            f'<td class="num metric">{_metric(r.val_metric)}</td>', f'<td class="num metric">{_best(r.best)}</td>',
            f'<td class="num">{r.attempts}</td>', f'<td class="num">{r.preemptions}</td>',
            f'<td class="num">{r.moves}</td>', f'<td class="places">{"<br>".join(_e(p) for p in r.placements) or "-"}</td>',
            f'<td class="num">{"-" if r.machine_hours is None else f"{r.machine_hours:.2f}"}</td>',
            f'<td class="num cost" title="{_e(r.cost_note)}">{_money(r.cost_usd)}</td>',
            f'<td class="num goodput" title="{_e(r.goodput_text)}">'
            f'{"-" if r.goodput is None else f"{r.goodput:.0%}"}</td>',
            f'<td class="num age">{_e(runstate.duration(r.age_seconds))}</td>',
        ]
        body.append(f'<tr class="run" data-run="{_e(r.id)}" data-state="{_e(r.state)}">{"".join(cells)}</tr>')
    if not rows:
        body.append(f'<tr><td colspan="{len(COLUMNS)}" class="dim">no runs in {_e(bucket)} yet'
                    "</td></tr>")
    live = any(data.live(r) for r in rows)
    quiet = sum(1 for r in rows if not r.final and not data.live(r))
    sub = (f'{len(rows)} run{"" if len(rows) == 1 else "s"} · read from the bucket at {_clock_now()}'
           + (f" · refreshes every {refresh:g}s while a run is not over" if live else "")
           + (f' · <span class="quiet">{quiet} run{" is" if quiet == 1 else "s are"} not over but nothing in '
              f"{'its' if quiet == 1 else 'their'} folder changed for over {runstate.duration(data.QUIET_S)} "
              "(the stack may be destroyed): not refreshed for "
              f"{'it' if quiet == 1 else 'them'}; reload to read again</span>" if quiet else ""))
    price = "".join(f'<p class="dim">cost: machine time × nodes × {_e(n)} (an estimate, not the bill)</p>'
                    for n in price_notes)
    out = (f"<h1>runs in {_e(bucket)}</h1><div class=sub>{sub}</div>{_notes(notes)}"
           f'<table class="runs"><thead><tr>{"".join(head)}</tr></thead><tbody>{"".join(body)}</tbody></table>{price}')
    return _page(f"runs · {bucket}", out, refresh=refresh if live else None)


def _clock_now() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S UTC")


# -- charts ----------------------------------------------------------------------------


def _tick_step(lo: float, hi: float, n: int) -> float:
    """A round step (1, 2, 2.5 or 5 × 10^k) that cuts lo..hi into about ``n`` parts."""
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values between lo and hi."""
    if hi <= lo:
        return [lo]
    step = _tick_step(lo, hi, n)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _decimals(ticks: list[float]) -> int:
    """The decimals that show each of ``ticks`` whole ("100000", "0.25", "0.0015"): those of their step
    (the ticks are its multiples), or of the one tick."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(ticks[0]) if ticks else 0.0
    if step == 0 or not math.isfinite(step):
        step = 1.0  # no spacing to show: whole numbers
    return next((d for d in range(10) if abs(round(step, d) - step) <= 1e-9 * step), 10)


def _labels(ticks: list[float], fmt: str = "{:.{d}f}", least: int = 0) -> list[str]:
    d = max(least, _decimals(ticks))
    return [fmt.format(t, d=d) for t in ticks]


def _text_w(text: str) -> float:
    """About how wide ``text`` is at most in the charts' 11 px font (a digit in DejaVu Sans: 7 px)."""
    return 6.8 * len(text)


def _anchored(x: float, text: str, lo: float, hi: float) -> str:
    """A text's anchor at ``x``, so that it stays between ``lo`` and ``hi`` (the middle when it fits)."""
    half = _text_w(text) / 2
    if x + half > hi:
        return "end"
    if x - half < lo:
        return "start"
    return "middle"


def _time_ticks(t0: float, t1: float) -> list[tuple[float, str]]:
    span = max(1.0, t1 - t0)
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400)
                 if span / s <= 8), 14 * 86400)
    first = math.ceil(t0 / step) * step
    fmt = "%H:%M:%S" if step < 60 else "%H:%M" if step < 86400 else "%b %d"
    return [(t, datetime.fromtimestamp(t, UTC).strftime(fmt)) for t in _frange(first, t1, step)]


def _frange(a: float, b: float, step: float):
    while a <= b:
        yield a
        a += step


@dataclass(frozen=True)
class _Frame:
    """The timeline's geometry: the time span it shows, its lanes and where each row sits."""

    t0: float
    t1: float
    lanes: list[str]
    moves_y: float
    axis_y: float
    height: float
    # Rows from the top: the end's label, the idle gaps' labels, the lanes, the moves' labels, the time axis, the legend.
    label_w: int = 230
    width: int = 1100
    lane_h: int = 34
    top: int = 44
    # Each move's label: its anchor and its lines, wrapped to the room beside its line (a reason is never cut).
    moves: tuple[tuple[str, tuple[str, ...]], ...] = ()
    line_h: int = 14

    @property
    def plot_w(self) -> int:
        return self.width - self.label_w - 30

    def x(self, t: float) -> float:
        return self.label_w + (t - self.t0) / (self.t1 - self.t0) * self.plot_w

    def lane_y(self, lane: str | None) -> float:
        return self.top + self.lane_h * (self.lanes.index(lane) if lane in self.lanes else 0)


def _frame(page: RunPage) -> _Frame:
    spans, marks = page.spans, page.marks
    times = [s.start for s in spans] + [s.end for s in spans] + [m.at for m in marks] + [
        s.launch for s in spans if s.launch is not None]
    if page.end:
        times.append(page.end.at)
    t0, t1 = min(times), max(times)
    pad = max(0.5, 0.02 * (t1 - t0))  # room for the marks at either end
    lanes = list(dict.fromkeys(s.lane for s in spans)) or ["machine"]
    top, lane_h, line_h = _Frame.top, _Frame.lane_h, _Frame.line_h
    probe = _Frame(t0=t0 - pad, t1=t1 + pad, lanes=lanes, moves_y=0, axis_y=0, height=0)
    moves = tuple(_move_label(probe, probe.x(m.at), m.text) for m in marks if m.kind == layout.MOVED)
    moves_y = top + lane_h * len(lanes) + 14
    axis_y = moves_y + line_h * max(1, sum(len(lines) for _a, lines in moves)) + 2
    return _Frame(t0=t0 - pad, t1=t1 + pad, lanes=lanes, moves_y=moves_y, axis_y=axis_y, height=axis_y + 36,
                  moves=moves)


def _move_label(f: _Frame, cx: float, text: str) -> tuple[str, tuple[str, ...]]:
    """A move's label: left of its line when the line is past the middle, else right of it; wrapped into
    as many lines as the room on that side needs."""
    import textwrap

    anchor = "end" if cx > f.label_w + f.plot_w / 2 else "start"
    room = (cx - 12) if anchor == "end" else (f.width - cx - 12)
    lines = textwrap.wrap(text, width=max(20, int(room / 6.8)), break_on_hyphens=False) or [""]
    return anchor, tuple(lines)


def timeline(page: RunPage) -> str:
    """Each attempt as a bar in its machine's lane; notices, preemptions, moves, ticks and the end on it."""
    spans, marks = page.spans, page.marks
    if not spans and not marks:
        return '<p class="dim">no attempt has started yet</p>'
    f = _frame(page)
    parts = [f'<svg class="timeline" width="{f.width}" height="{f.height}" role="img" aria-label="attempts over time">']
    parts += _grid(f)
    parts += _idle_gaps(f, spans)
    parts += _attempt_bars(f, spans)
    parts += _marks(f, marks)
    if page.end:
        parts.append(_end_line(f, page.end))
    parts.append('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
                 'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#ddd" stroke-width="3"/>'
                 "</pattern></defs>")
    parts.append(_legend(10, f.height - 10))
    parts.append("</svg>")
    return "".join(parts)


def _grid(f: _Frame) -> list[str]:
    """The time axis's lines and labels, and each lane's name and divider."""
    parts = []
    for t, label in _time_ticks(f.t0, f.t1):
        parts.append(f'<line x1="{f.x(t):.1f}" x2="{f.x(t):.1f}" y1="{f.top - 6}" y2="{f.axis_y - 10}" stroke="#eee"/>'
                     f'<text x="{f.x(t):.1f}" y="{f.axis_y + 2}" text-anchor="middle" fill="#666">{label}</text>')
    for i, lane in enumerate(f.lanes):
        y = f.lane_y(lane)
        parts.append(_lane_label(f, lane, y))
        if i:
            parts.append(f'<line x1="{f.label_w}" x2="{f.width - 30}" y1="{y}" y2="{y}" stroke="#f2f2f2"/>')
    return parts


def _lane_label(f: _Frame, lane: str, y: float) -> str:
    """A lane's name left of it: on one line where it fits, else the machine over its placement (an
    instance id and its region do not fit one line); a line still too long ends in "…", and hovering
    shows the whole name."""
    room = f.label_w - 14
    mid = y + f.lane_h / 2
    machine, sep, place = lane.partition(" (")
    one = _text_w(lane) <= room or not sep
    lines = [(mid + 4, lane)] if one else [(mid - 2, machine), (mid + 11, "(" + place)]
    spans = "".join(f'<tspan x="8" y="{ly:.1f}">{_e(_short(text, int(room / 6.8)))}</tspan>' for ly, text in lines)
    return f'<text class="lane" fill="#333"><title>{_e(lane)}</title>{spans}</text>'


def _idle_gaps(f: _Frame, spans) -> list[str]:
    """Idle gaps: between one attempt's end and the next one's start, nothing trained."""
    parts = []
    ordered = sorted(spans, key=lambda s: s.start)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.start - a.end > 1:
            parts.append(f'<rect class="gap" x="{f.x(a.end):.1f}" y="{f.top - 4}" '
                         f'width="{max(1.0, f.x(b.start) - f.x(a.end)):.1f}"'
                         f' height="{f.lane_h * len(f.lanes) + 4}" fill="url(#hatch)" opacity="0.9">'
                         f"<title>idle {runstate.duration(b.start - a.end)}: no machine trained</title></rect>")
            mid = (f.x(a.end) + f.x(b.start)) / 2
            if f.x(b.start) - f.x(a.end) > 60:
                parts.append(f'<text x="{mid:.1f}" y="{f.top - 9}" text-anchor="middle" fill="#999">idle '
                             f"{runstate.duration(b.start - a.end)}</text>")
    return parts


def _attempt_bars(f: _Frame, spans) -> list[str]:
    """One bar per attempt in its lane, coloured by placement."""
    parts = []
    colours = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(dict.fromkeys(s.placement for s in spans))}
    for s in spans:
        y = f.lane_y(s.lane) + 7
        w = max(2.0, f.x(s.end) - f.x(s.start))
        tip = (f"attempt {s.attempt}: {_clock(s.start)} – {'now (running)' if s.open else _clock(s.end)}, "
               f"{runstate.duration(s.end - s.start)}" + (f", {s.placement}" if s.placement else "")
               + (f", {_money(s.cost_usd)} (estimate)" if s.cost_usd is not None else ""))
        parts.append(f'<rect class="attempt" data-attempt="{_e(s.attempt)}" x="{f.x(s.start):.1f}" y="{y:.1f}" '
                     f'width="{w:.1f}" height="{f.lane_h - 14}" rx="3" fill="{colours[s.placement]}" '
                     f'opacity="{0.65 if s.open else 0.85}"><title>{_e(tip)}</title></rect>')
        parts += _goodput_parts(f, s, y)
        if w > 40:
            parts.append(f'<text x="{f.x(s.start) + 4:.1f}" y="{y + 14:.1f}" fill="#fff">#{_e(s.attempt)}</text>')
    return parts


def _goodput_parts(f: _Frame, s, y: float) -> list[str]:
    """What goodput counts against an attempt, on its bar: its boot (a grey band from its launch, as far as the
    run folder bounds it, to its first step) and its lost training (red, from the last commit the run went on
    from to where it stopped; amber while the running attempt has not committed it yet)."""
    parts = []
    h = f.lane_h - 14
    if s.launch is not None and s.first_step is not None and s.first_step - s.launch > 1:
        parts.append(f'<rect class="boot" x="{f.x(s.launch):.1f}" y="{y + h / 2 - 3:.1f}" '
                     f'width="{max(1.0, f.x(s.first_step) - f.x(s.launch)):.1f}" height="6" fill="{BOOT_COLOUR}">'
                     f"<title>boot of attempt {_e(s.attempt)}: {runstate.duration(s.first_step - s.launch)} from "
                     f"{_clock(s.launch)} (the launch, as far as the run folder bounds it) to its first step"
                     "</title></rect>")
    if s.kept_until is not None and s.train_end is not None and s.train_end - s.kept_until > 1:
        what = ("not committed yet" if s.uncommitted else "lost: trained after the last commit the run went on "
                "from" + (f" ({s.lost_steps} steps at least)" if s.lost_steps else ""))
        parts.append(f'<rect class="{"uncommitted" if s.uncommitted else "lost"}" x="{f.x(s.kept_until):.1f}" '
                     f'y="{y:.1f}" width="{max(1.0, f.x(s.train_end) - f.x(s.kept_until)):.1f}" height="{h}" '
                     f'fill="{UNCOMMITTED_COLOUR if s.uncommitted else LOST_COLOUR}" opacity="0.55">'
                     f"<title>{_e(what)}: {runstate.duration(s.train_end - s.kept_until)}</title></rect>")
    return parts


def _marks(f: _Frame, marks) -> list[str]:
    """Evaluation and checkpoint ticks, moves with their labels under the lanes, and the other marks."""
    parts = []
    moves_drawn = rows = decisions = 0
    # Thousands of ticks draw as one smear and weigh on the browser: past MAX_TICKS of a kind, every k-th.
    every = {k: max(1, math.ceil(sum(1 for m in marks if m.kind == k) / MAX_TICKS)) for k in TICK_KINDS}
    seen = dict.fromkeys(TICK_KINDS, 0)
    for m in marks:
        if m.kind in every:
            seen[m.kind] += 1
            if (seen[m.kind] - 1) % every[m.kind]:
                continue
        cx = f.x(m.at)
        y = f.lane_y(m.lane) + 7
        if m.kind in (layout.EVALUATED, layout.CHECKPOINT):
            parts.append(_tick(f, m, cx, y))
        elif m.kind == data.DECISION:
            parts.append(_decision_mark(f, m, cx, decisions))
            decisions += 1
        elif m.kind == layout.MOVED:
            anchor, lines = f.moves[moves_drawn]
            parts.append(_move(f, m, cx, f.moves_y + f.line_h * rows, anchor, lines))
            moves_drawn += 1
            rows += len(lines)
        else:
            parts.append(_mark(f, m, cx, y))
    return parts


def _decision_mark(f: _Frame, m, cx: float, n: int) -> str:
    """A decision of the placement controller: a diamond above the lanes, linked to its table below."""
    y = f.top - 16
    d = f"M{cx:.1f},{y - 6:.1f} l5,6 l-5,6 l-5,-6 z"
    return (f'<a href="#decision-{n}"><path class="mark decision" d="{d}" fill="{DECISION_COLOUR}" stroke="#fff">'
            f"<title>decision at {_clock(m.at)}: {_e(m.text)}</title></path></a>")


def decisions_section(page: RunPage) -> str:
    """Each decision's table, newest first: where it chose and why, and every placement's row (price and its
    age, rate, preemptions, transfer, E, feasible or why not)."""
    if not page.decisions:
        return ""
    out = []
    for n, d in reversed(list(enumerate(page.decisions))):
        if d.doc is None:
            continue
        lines = why.decision_lines(d.doc)
        rows = "".join(f"<li>{_e(text)}</li>" for _label, text in lines[1:])
        out.append(f'<details class="decision" id="decision-{n}"{" open" if n == len(page.decisions) - 1 else ""}>'
                   f"<summary>{_e(lines[0][1])}</summary><ul>{rows}</ul></details>")
    return (f'<h2>decisions</h2><p class="dim">each restart, the placement controller prices every placement and '
            f"writes why it chose one ({_e(layout.DECISIONS_PREFIX)}): * marks the chosen one, E is the expected "
            f"cost to finish there</p>{''.join(out)}")


def _tick(f: _Frame, m, cx: float, y: float) -> str:
    colour = "#2e7d32" if m.kind == layout.EVALUATED else "#555"
    y0, y1 = (y - 5, y) if m.kind == layout.EVALUATED else (y + f.lane_h - 14, y + f.lane_h - 9)
    cls = "evaluation" if m.kind == layout.EVALUATED else "checkpoint"
    return (f'<line class="tick {cls}" x1="{cx:.1f}" x2="{cx:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" '
            f'stroke="{colour}" stroke-width="1.5"><title>{_e(m.text)}</title></line>')


def _move(f: _Frame, m, cx: float, row_y: float, anchor: str, lines: tuple[str, ...]) -> str:
    """Its line across the lanes, and its label under them (see :func:`_move_label`)."""
    dx = -4 if anchor == "end" else 4
    text = "".join(f'<tspan x="{cx + dx:.1f}" y="{row_y + f.line_h * i}">{_e(line)}</tspan>'
                   for i, line in enumerate(lines))
    return (f'<g class="move"><line x1="{cx:.1f}" x2="{cx:.1f}" y1="{f.top - 6}" y2="{row_y - 10}" '
            f'stroke="#1565c0" stroke-width="2" stroke-dasharray="5 3"/>'
            f'<text text-anchor="{anchor}" fill="#1565c0">{text}</text><title>{_e(m.text)}</title></g>')


def _mark(f: _Frame, m, cx: float, y: float) -> str:
    colour, shape, label = MARK_STYLE.get(m.kind, ("#333", "cross", m.kind))
    cls = f"mark {m.kind.replace('_', '-')}"
    if shape == "triangle":
        d = f"M{cx:.1f},{y + 10:.1f} l-6,-11 h12 z"
        return (f'<path class="{cls}" d="{d}" fill="{colour}" stroke="#fff"><title>{_e(label)} at '
                f"{_clock(m.at)}: {_e(m.text)}</title></path>")
    c = y + (f.lane_h - 14) / 2
    d = f"M{cx - 6:.1f},{c - 6:.1f} l12,12 m0,-12 l-12,12"
    return (f'<path class="{cls}" d="{d}" stroke="{colour}" stroke-width="3"><title>{_e(label)} at '
            f"{_clock(m.at)}: {_e(m.text)}</title></path>")


def _end_line(f: _Frame, end) -> str:
    """The run's end as a line across the lanes with its label above them."""
    cx = f.x(end.at)
    colour = STATE_COLOURS.get(end.kind, "#333")
    text = _short(end.text, 120)
    # Its label runs left of the line, or right of it when the line is too near the left edge.
    anchor, dx = ("end", -4) if cx - _text_w(text) > 0 else ("start", 4)
    return (f'<g class="end" data-end="{_e(end.kind)}"><line x1="{cx:.1f}" x2="{cx:.1f}" y1="{f.top - 24}" '
            f'y2="{f.top + f.lane_h * len(f.lanes)}" stroke="{colour}" stroke-width="3"/>'
            f'<text x="{cx + dx:.1f}" y="{f.top - 28}" text-anchor="{anchor}" fill="{colour}" font-weight="600">'
            f"{_e(text)}</text><title>{_e(end.text)} at {_clock(end.at)}</title></g>")


def _legend(x0: float, y: float) -> str:
    items = [("#0a7ea4", "rect", "attempt"), ("#e69500", "tri", "spot notice"), ("#c62828", "x", "preempted"),
             ("#1565c0", "line", "move"), ("#2e7d32", "tick", "evaluation"), ("#555", "tick", "checkpoint"),
             ("#ddd", "rect", "idle"), (BOOT_COLOUR, "rect", "boot"), (LOST_COLOUR, "rect", "lost"),
             (DECISION_COLOUR, "diamond", "decision")]
    out, x = [], x0
    for colour, shape, label in items:
        if shape == "rect":
            out.append(f'<rect x="{x}" y="{y - 9}" width="14" height="9" fill="{colour}"/>')
        elif shape == "tri":
            out.append(f'<path d="M{x + 7},{y} l-6,-10 h12 z" fill="{colour}"/>')
        elif shape == "diamond":
            out.append(f'<path d="M{x + 7},{y - 11} l5,6 l-5,6 l-5,-6 z" fill="{colour}"/>')
        elif shape == "x":
            out.append(f'<path d="M{x + 2},{y - 9} l9,9 m0,-9 l-9,9" stroke="{colour}" stroke-width="2.5"/>')
        else:
            dash = ' stroke-dasharray="3 2"' if shape == "line" else ""
            out.append(f'<line x1="{x + 7}" x2="{x + 7}" y1="{y - 10}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{x + 18}" y="{y}" fill="#555">{label}</text>')
        x += 26 + 6.5 * len(label)
    return '<g class="legend">' + "".join(out) + "</g>"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _value_range(vals: list[float]) -> tuple[float, float]:
    """The value axis's span: the values with a margin, never below 0 for values that are not, nor above
    1 for values between 0 and 1 (an accuracy's axis ends at 1); a flat curve gets ±10 %."""
    v0, v1 = min(vals), max(vals)
    pad = (abs(v0) * 0.1 or 1.0) if v1 == v0 else (v1 - v0) * 0.05
    lo, hi = v0 - pad, v1 + pad
    if v0 >= 0:
        lo = max(lo, 0.0)
        if v1 <= 1:
            hi = min(hi, 1.0)
    return lo, hi


def x_unit(name: str) -> str:
    """What a curve's points are counted in: Keras's TensorBoard callback writes its ``epoch_*`` scalars
    once an epoch, at the epoch's number (from 0); everything else is at a training step."""
    return "epoch" if name.rsplit("/", 1)[-1].startswith("epoch_") else "step"


def curve(name: str, points: list[tuple[int, float]], source: str, *, width: int = 420, height: int = 220) -> str:
    """One metric against the step (or the epoch): a line with a dot per point (thinned to 400 dots)."""
    right, top, bottom = 16, 24, 30
    good = [(s, v) for s, v in points if math.isfinite(v)]
    if not good:
        return ""
    steps = [s for s, _v in good]
    s0, s1 = min(steps), max(steps)
    v0, v1 = _value_range([v for _s, v in good])
    vticks = _ticks(v0, v1, 4)
    vlabels = _labels(vticks)
    # Room for the longest value label left of the axis.
    left = max(40, 12 + math.ceil(max(_text_w(t) for t in vlabels)))
    if s1 == s0:  # one point: in the middle, its step the only tick
        sticks, s0, s1 = [s0], s0 - 1, s1 + 1
    else:
        sticks = [s for s in _ticks(s0, s1, 4) if s == int(s)]  # steps are whole numbers
    unit = x_unit(name)

    def x(s: float) -> float:
        return left + (s - s0) / (s1 - s0) * (width - left - right)

    def y(v: float) -> float:
        return top + (1 - (v - v0) / (v1 - v0)) * (height - top - bottom)

    parts = [f'<svg class="curve" data-metric="{_e(name)}" data-points="{len(good)}" data-unit="{unit}" '
             f'width="{width}" height="{height}"><text x="8" y="15" font-weight="600" font-size="12">{_e(name)}</text>'
             f'<text x="{width - right}" y="15" text-anchor="end" fill="#888">{_e(source)}</text>']
    for v, label in zip(vticks, vlabels, strict=True):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                     f'<text class="value-tick" x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end" '
                     f'fill="#666">{label}</text>')
    for s, label in zip(sticks, _labels(sticks), strict=True):
        parts.append(f'<text class="step-tick" x="{x(s):.1f}" y="{height - 12}" '
                     f'text-anchor="{_anchored(x(s), label, 2, width - 2)}" fill="#666">{label}</text>')
    # Under the value labels, where no step label goes.
    parts.append(f'<text class="unit" x="8" y="{height - 4}" fill="#888">{unit} →</text>')
    colour = "#c77700" if name.startswith(("val_", "validation/")) else "#0a7ea4"
    line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in good)
    parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
    every = max(1, len(good) // 400)
    for s, v in good[::every]:
        parts.append(f'<circle class="point" cx="{x(s):.1f}" cy="{y(v):.1f}" r="2.6" fill="{colour}">'
                     f"<title>{unit} {s}: {v:.5g}</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


def cost_chart(page: RunPage, *, width: int = 860, height: int = 240) -> str:
    """The cost as it grew, per placement and in all: each attempt adds its price × nodes per hour while it runs."""
    spans = [s for s in page.spans if s.cost_usd is not None]
    if not spans:
        return '<p class="dim">no price recorded with the run: machine time only</p>'
    left, right, top, bottom = 64, 180, 20, 30
    t0 = min(s.start for s in spans)
    t1 = max(t0 + 1, max(s.end for s in spans))  # the axis ends where the run's machine time does
    places = list(dict.fromkeys(s.placement or "machines" for s in spans))
    # Each series: cumulative cost at every span boundary.
    bounds = sorted({t0, t1, *(s.start for s in spans), *(s.end for s in spans)})

    def upto(t: float, group) -> float:
        return sum((min(t, s.end) - s.start) / 3600 * s.nodes * (s.price_per_hour or 0.0)
                   for s in group if t > s.start)

    series = {p: [(t, upto(t, [s for s in spans if (s.placement or "machines") == p])) for t in bounds] for p in places}
    total = [(t, upto(t, spans)) for t in bounds]
    top_v = max(v for _t, v in total) or 1.0

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * (width - left - right)

    def y(v: float) -> float:
        return top + (1 - v / top_v) * (height - top - bottom)

    parts = [f'<svg class="cost" width="{width}" height="{height}">']
    # Cents at least; a cheap run's ticks get the decimals that tell them apart ($0.005, $0.010, ...).
    ticks = _ticks(0, top_v, 4)
    for v, label in zip(ticks, _labels(ticks, "${:,.{d}f}", least=2), strict=True):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                     f'<text class="cost-tick" x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end" '
                     f'fill="#666">{label}</text>')
    for t, label in _time_ticks(t0, t1):
        parts.append(f'<text class="time-tick" data-t="{t:.0f}" x="{x(t):.1f}" y="{height - 12}" '
                     f'text-anchor="{_anchored(x(t), label, 2, width - right + 20)}" fill="#666">{label}</text>')
    lines = [("all placements", total, "#222", "2.5")] if len(places) > 1 else []
    lines += [(p, series[p], PALETTE[i % len(PALETTE)], "1.8") for i, p in enumerate(places)]
    for i, (label, pts, colour, w) in enumerate(lines):
        d = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        parts.append(f'<polyline class="cost-line" data-placement="{_e(label)}" points="{d}" fill="none" '
                     f'stroke="{colour}" stroke-width="{w}"><title>{_e(label)}: {_money_fine(pts[-1][1])}</title></polyline>')
        parts.append(f'<text x="{width - right + 8}" y="{top + 14 + 16 * i}" fill="{colour}">{_e(label)} '
                     f"{_money_fine(pts[-1][1])}</text>")
    parts.append("</svg>")
    return "".join(parts)


def placement_costs(page: RunPage) -> str:
    """Each placement's cost, ``ops status``'s figures, with what its price is: away from home's region the
    machines' recorded price carries the checkpoint writes to home's bucket (the transfer between regions
    or clouds), and this says so, so a moved run's dearer hours there are not taken for dearer machines."""
    items = []
    for p in page.st.placement_costs:
        where = str(p.get("placement"))
        note = page.price_notes.get(where, "")
        writes = writes_per_hour(note)
        n = p.get("attempts")
        text = (f"{where}: {_money(p.get('cost_usd'))} for {runstate.duration(float(p.get('machine_hours') or 0) * 3600)}"
                f" machine time, {n} attempt{'' if n == 1 else 's'}")
        if writes is not None:
            text += (f"; transfer included: its checkpoint writes to home's bucket, ${writes:.2f}/h of its price")
        if note:
            text += f" ({note})"
        usd = "" if p.get("cost_usd") is None else p["cost_usd"]
        items.append(f'<li class="placement-cost" data-placement="{_e(where)}" data-usd="{usd}" '
                     f'data-transfer-per-hour="{"" if writes is None else writes}">{_e(text)}</li>')
    return f'<ul class="placement-costs">{"".join(items)}</ul>' if items else ""


# -- a run's page ----------------------------------------------------------------------


def run_page(bucket: str, page: RunPage, *, refresh: float) -> str:
    """One run: what it is, its timeline, its curves, its cost and its model."""
    st, r = page.st, page.row
    facts: list[tuple[str, str]] = [
        ("state", _state(st.state) + (f" &nbsp;{_e(st.detail)}" if st.detail else "")),
        ("progress", _e(_step(r)) + (f" ({100 * (r.step or 0) / r.total:.1f}%)" if r.total else "")),
    ]
    if st.loss is not None or st.metrics:
        others = {k: v for k, v in st.metrics.items() if not (k == "loss" and st.loss is not None)}
        shown = ([f"loss {st.loss:.4g}"] if st.loss is not None else []) + [status.metrics_text(others)]
        facts.append(("metrics", _e("   ".join(x for x in shown if x)) + _e(status.evaluation_text(st))))
    if st.best:
        facts.append(("best", _e(status.best_text(st.best))))
    facts.append(("attempts", f'<span class="attempts">{st.attempts}</span> · preemptions '
                              f'<span class="preemptions">{st.preemptions}</span> · spot notices {st.spot_notices}'
                              f" · moves {r.moves}"))
    for label, line in status.placement_lines(st.placement):
        facts.append((label, _e(line)))
    cost = status.cost_text(st)
    if cost:
        facts.append(("cost", f'<span class="cost-total" data-usd="{"" if st.cost_usd is None else st.cost_usd}">'
                              f"{_e(cost)}</span>"))
        for line in status.placement_cost_lines(st):
            facts.append(("", _e(line)))
    if st.goodput:
        facts.append(("goodput", f'<span class="goodput" data-goodput="{_e(st.goodput.get("goodput") or "")}">'
                                 f"{_e(why.goodput_text(st.goodput))}</span>"
                                 + "".join(f'<br><span class="dim">{_e(n)}</span>' for n in st.goodput.get("notes") or [])))
    if page.decisions:
        facts.append(("decision", f'<a href="#decision-{len(page.decisions) - 1}">'
                                  f"{_e(data.decision_summary(st.decision))}</a>"))
    if st.checkpoint:
        when = f" ({_e(st.checkpoint.created)})" if st.checkpoint.created else ""
        facts.append(("checkpoint", f'<span class="checkpoint">step {st.checkpoint.step}</span>{when}'))
    else:
        facts.append(("checkpoint", "none committed yet"))
    for label, line in status.signature_lines(st.end):
        facts.append((label, _e(line)))
    # A line to paste into a shell: quoted for the shell (a run id may hold a space or a `;`), then for HTML.
    pull = shlex.join(["python", "-m", "ops", "pull", "--run-uri", r.uri, f"./{r.id}", "--checkpoint"])
    facts.append(("pull", f'<code class="pull">{_e(pull)}</code>'))
    grid = "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in facts)

    curves = "".join(curve(name, pts, page.curve_source.get(name, "")) for name, pts in _curve_order(page.curves))
    if not curves:
        curves = ('<p class="dim">no curves yet: they come from the run\'s evaluations (evaluated events) and '
                  "its TensorBoard scalars (tensorboard/)</p>")
    estimate = (f"an estimate: machine time × nodes × {_e(st.cost_note)}; the machines' boot time is not in it"
                if st.cost_note else "an estimate from the prices the stack gave the machines")
    live = data.live(r)
    quiet = (f' · <span class="quiet">not refreshing: nothing in the run\'s folder changed for '
             f"{_e(runstate.duration(r.age_seconds))} (its machines may be gone, or its stack destroyed); reload "
             "to read it again</span>") if not st.final and not live else ""
    body = (f'<p><a href="/">← all runs in {_e(bucket)}</a></p><h1>{_e(r.id)}</h1>'
            f'<div class="sub">{_e(r.uri)} · {page.events} events · read at {_clock(page.now)}'
            + (f" · refreshes every {refresh:g}s" if live else quiet) + "</div>"
            + _notes(page.notes)
            + f'<dl class="facts">{grid}</dl>'
            + f"<h2>timeline</h2>{timeline(page)}"
            + decisions_section(page)
            + f'<h2>curves</h2><div class="charts">{curves}</div>'
            + f'<h2>cost over time</h2><p class="dim estimate">{estimate}</p>{cost_chart(page)}'
            + placement_costs(page))
    return _page(f"{r.id} · {st.state}", body, refresh=refresh if live else None)


def _curve_order(curves: dict) -> list:
    """Losses first, then the training metrics, then the validation ones."""
    def key(item):
        name = item[0]
        return ("loss" not in name, name.startswith(("val_", "validation/")), name)
    return sorted(curves.items(), key=key)


def error_page(title: str, message: str, *, refresh: float | None = None) -> str:
    """A page that says what could not be read and what to do (never a bare 500)."""
    return _page(title, f'<p><a href="/">← all runs</a></p><h1>{_e(title)}</h1>{_notes([message])}', refresh=refresh)
