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

from ops import runstate, status
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
TICK_KINDS = (layout.EVALUATED, layout.CHECKPOINT)
MAX_TICKS = 300
PALETTE = ("#0a7ea4", "#c77700", "#6a3d9a", "#2e7d32", "#b15928", "#1f78b4")

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:20px 28px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px}
a{color:#0a5fa4;text-decoration:none} a:hover{text-decoration:underline}
.sub{color:#666;margin-bottom:12px} .dim{color:#777}
table.runs{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002}
table.runs{font-size:13px} table.runs th,table.runs td{padding:5px 8px;border-bottom:1px solid #eee;text-align:left;white-space:nowrap}
table.runs th{background:#f0f0f0;font-weight:600} td.num,th.num{text-align:right}
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


def _metric(m: tuple[str, float] | None) -> str:
    return "-" if m is None else f"{_e(m[0])} {m[1]:.4g}"


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
        best = "-" if not r.best else f"{_e(r.best['metric'])} {r.best['value']:.4g} @{r.best['step']}"
        cells = [
            f'<td><a class="run-link" href="/run/{quote(r.id)}">{_e(r.id)}</a></td>',
            f'<td class="state-cell" title="{_e(r.detail)}">{_state(r.state)}</td>',
            f'<td class="num">{_step(r)}</td>', f'<td class="num">{_metric(r.train_metric)}</td>',
            f'<td class="num">{_metric(r.val_metric)}</td>', f'<td class="num">{best}</td>',
            f'<td class="num">{r.attempts}</td>', f'<td class="num">{r.preemptions}</td>',
            f'<td class="num">{r.moves}</td>', f'<td class="places">{"<br>".join(_e(p) for p in r.placements) or "-"}</td>',
            f'<td class="num">{"-" if r.machine_hours is None else f"{r.machine_hours:.2f}"}</td>',
            f'<td class="num cost" title="{_e(r.cost_note)}">{_money(r.cost_usd)}</td>',
            f'<td class="num">{_e(runstate.duration(r.age_seconds))}</td>',
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


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values between lo and hi."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


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

    @property
    def plot_w(self) -> int:
        return self.width - self.label_w - 30

    def x(self, t: float) -> float:
        return self.label_w + (t - self.t0) / (self.t1 - self.t0) * self.plot_w

    def lane_y(self, lane: str | None) -> float:
        return self.top + self.lane_h * (self.lanes.index(lane) if lane in self.lanes else 0)


def _frame(page: RunPage) -> _Frame:
    spans, marks = page.spans, page.marks
    times = [s.start for s in spans] + [s.end for s in spans] + [m.at for m in marks]
    if page.end:
        times.append(page.end.at)
    t0, t1 = min(times), max(times)
    pad = max(0.5, 0.02 * (t1 - t0))  # room for the marks at either end
    lanes = list(dict.fromkeys(s.lane for s in spans)) or ["machine"]
    top, lane_h = _Frame.top, _Frame.lane_h
    moves_y = top + lane_h * len(lanes) + 14
    axis_y = moves_y + 16 * max(1, sum(1 for m in marks if m.kind == layout.MOVED))
    return _Frame(t0=t0 - pad, t1=t1 + pad, lanes=lanes, moves_y=moves_y, axis_y=axis_y, height=axis_y + 36)


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
        parts.append(f'<text class="lane" x="8" y="{y + f.lane_h / 2 + 4:.1f}" fill="#333">{_e(lane[:34])}</text>')
        if i:
            parts.append(f'<line x1="{f.label_w}" x2="{f.width - 30}" y1="{y}" y2="{y}" stroke="#f2f2f2"/>')
    return parts


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
        if w > 40:
            parts.append(f'<text x="{f.x(s.start) + 4:.1f}" y="{y + 14:.1f}" fill="#fff">#{_e(s.attempt)}</text>')
    return parts


def _marks(f: _Frame, marks) -> list[str]:
    """Evaluation and checkpoint ticks, moves with their labels under the lanes, and the other marks."""
    parts = []
    moves_drawn = 0
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
        elif m.kind == layout.MOVED:
            parts.append(_move(f, m, cx, f.moves_y + 16 * moves_drawn))
            moves_drawn += 1
        else:
            parts.append(_mark(f, m, cx, y))
    return parts


def _tick(f: _Frame, m, cx: float, y: float) -> str:
    colour = "#2e7d32" if m.kind == layout.EVALUATED else "#555"
    y0, y1 = (y - 5, y) if m.kind == layout.EVALUATED else (y + f.lane_h - 14, y + f.lane_h - 9)
    cls = "evaluation" if m.kind == layout.EVALUATED else "checkpoint"
    return (f'<line class="tick {cls}" x1="{cx:.1f}" x2="{cx:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" '
            f'stroke="{colour}" stroke-width="1.5"><title>{_e(m.text)}</title></line>')


def _move(f: _Frame, m, cx: float, row_y: float) -> str:
    """Its label under the lanes, one row per move, running left of the line when it is past the middle."""
    anchor, dx = ("end", -4) if cx > f.label_w + f.plot_w / 2 else ("start", 4)
    room = int((cx - 10 if anchor == "end" else f.width - cx - 10) / 6.2)
    return (f'<g class="move"><line x1="{cx:.1f}" x2="{cx:.1f}" y1="{f.top - 6}" y2="{row_y - 10}" '
            f'stroke="#1565c0" stroke-width="2" stroke-dasharray="5 3"/>'
            f'<text x="{cx + dx:.1f}" y="{row_y}" text-anchor="{anchor}" fill="#1565c0">'
            f"{_e(_short(m.text, max(30, room)))}</text><title>{_e(m.text)}</title></g>")


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
    anchor, dx = ("end", -4) if cx - 6.8 * len(text) > 0 else ("start", 4)
    return (f'<g class="end" data-end="{_e(end.kind)}"><line x1="{cx:.1f}" x2="{cx:.1f}" y1="{f.top - 24}" '
            f'y2="{f.top + f.lane_h * len(f.lanes)}" stroke="{colour}" stroke-width="3"/>'
            f'<text x="{cx + dx:.1f}" y="{f.top - 28}" text-anchor="{anchor}" fill="{colour}" font-weight="600">'
            f"{_e(text)}</text><title>{_e(end.text)} at {_clock(end.at)}</title></g>")


def _legend(x0: float, y: float) -> str:
    items = [("#0a7ea4", "rect", "attempt"), ("#e69500", "tri", "spot notice"), ("#c62828", "x", "preempted"),
             ("#1565c0", "line", "move"), ("#2e7d32", "tick", "evaluation"), ("#555", "tick", "checkpoint"),
             ("#ddd", "rect", "idle")]
    out, x = [], x0
    for colour, shape, label in items:
        if shape == "rect":
            out.append(f'<rect x="{x}" y="{y - 9}" width="14" height="9" fill="{colour}"/>')
        elif shape == "tri":
            out.append(f'<path d="M{x + 7},{y} l-6,-10 h12 z" fill="{colour}"/>')
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


def curve(name: str, points: list[tuple[int, float]], source: str, *, width: int = 420, height: int = 220) -> str:
    """One metric against the step: a line with a dot per point (thinned to 400 dots for long runs)."""
    left, right, top, bottom = 56, 14, 24, 30
    steps = [p[0] for p in points]
    vals = [p[1] for p in points if math.isfinite(p[1])]
    if not vals:
        return ""
    s0, s1 = min(steps), max(steps)
    v0, v1 = min(vals), max(vals)
    if s1 == s0:  # one point: in the middle
        s0, s1 = s0 - 1, s1 + 1
    if v1 == v0:
        v0, v1 = v0 - 0.5 * (abs(v0) or 1), v1 + 0.5 * (abs(v1) or 1)

    def x(s: float) -> float:
        return left + (s - s0) / (s1 - s0) * (width - left - right)

    def y(v: float) -> float:
        return top + (1 - (v - v0) / (v1 - v0)) * (height - top - bottom)

    good = [(s, v) for s, v in points if math.isfinite(v)]
    parts = [f'<svg class="curve" data-metric="{_e(name)}" data-points="{len(good)}" width="{width}" '
             f'height="{height}"><text x="{left}" y="15" font-weight="600" font-size="12">{_e(name)}</text>'
             f'<text x="{width - right}" y="15" text-anchor="end" fill="#888">{_e(source)}</text>']
    for v in _ticks(v0, v1, 4):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#666">{v:.4g}</text>')
    for s in _ticks(s0, s1, 4):
        if s != int(s):  # steps are whole numbers
            continue
        parts.append(f'<text x="{x(s):.1f}" y="{height - 12}" text-anchor="middle" fill="#666">{s:g}</text>')
    parts.append(f'<text x="{width - right}" y="{height - 1}" text-anchor="end" fill="#888">step</text>')
    colour = "#c77700" if name.startswith(("val_", "validation/")) else "#0a7ea4"
    line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in good)
    parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
    every = max(1, len(good) // 400)
    for s, v in good[::every]:
        parts.append(f'<circle class="point" cx="{x(s):.1f}" cy="{y(v):.1f}" r="2.6" fill="{colour}">'
                     f"<title>step {s}: {v:.5g}</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


def cost_chart(page: RunPage, *, width: int = 860, height: int = 240) -> str:
    """The cost as it grew, per placement and in all: each attempt adds its price × nodes per hour while it runs."""
    spans = [s for s in page.spans if s.cost_usd is not None]
    if not spans:
        return '<p class="dim">no price recorded with the run: machine time only</p>'
    left, right, top, bottom = 64, 180, 20, 30
    t0 = min(s.start for s in spans)
    t1 = max(s.end for s in spans)
    if t1 - t0 < 60:
        t1 = t0 + 60
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
    for v in _ticks(0, top_v, 4):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#666">${v:,.2f}</text>')
    for t, label in _time_ticks(t0, t1):
        parts.append(f'<text x="{x(t):.1f}" y="{height - 12}" text-anchor="middle" fill="#666">{label}</text>')
    lines = [("all placements", total, "#222", "2.5")] if len(places) > 1 else []
    lines += [(p, series[p], PALETTE[i % len(PALETTE)], "1.8") for i, p in enumerate(places)]
    for i, (label, pts, colour, w) in enumerate(lines):
        d = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        parts.append(f'<polyline class="cost-line" data-placement="{_e(label)}" points="{d}" fill="none" '
                     f'stroke="{colour}" stroke-width="{w}"><title>{_e(label)}: {_money(pts[-1][1])}</title></polyline>')
        parts.append(f'<text x="{width - right + 8}" y="{top + 14 + 16 * i}" fill="{colour}">{_e(label)} '
                     f"{_money(pts[-1][1])}</text>")
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
