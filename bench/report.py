"""The bench's arithmetic and its Markdown: ratios, goals, tables, and the generated block of RESULTS.md.

Pure functions on plain data, so they can be unit-tested without TensorFlow
(tests/bench/test_report.py). `bench.run_all` measures; this module turns the figures
(`render`) into the section of `bench/RESULTS.md` between the two markers below, leaving the rest of
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


# -- the generated block of RESULTS.md -----------------------------------------------------

STARTUP_PHASES = (
    ("interpreter up", "python_zero", "python"),
    ("imports (TensorFlow, Keras, trainer)", "imports_start", "imports_end"),
    ("strategy", "strategy_start", "strategy_end"),
    ("model and optimizer build", "model_start", "model_end"),
    ("restore (download, verify, read)", "restore_start", "restore_end"),
    ("data set", "dataset_start", "dataset_end"),
    ("first call (tracing + its steps)", "call1_start", "call1_end"),
)


def phases(marks: dict) -> list[tuple[str, float]]:
    """The start-up split of one run's probe marks."""
    return split_phases({"python_zero": 0.0, **marks}, STARTUP_PHASES)


def _on_disk(entry: dict, data_mib: float) -> str:
    """What a machine had of the data set on disk at its first step, and whether it streamed the rest."""
    if not data_mib:
        return "synthetic (no data set)"
    d = entry.get("data_at_first_step")
    if not d:
        return "**not reported** (no `data_first_step` event)"
    mib = f"{d['bytes'] / 2**20:,.1f} of {d['bytes_total'] / 2**20:,.1f} MiB"
    if d["files"] < d["files_total"]:
        return f"{d['files']} of {d['files_total']} files ({mib}): streamed"
    return f"all {d['files_total']} files ({mib}): every file had landed by the first step, nothing left to stream"


def render_boot(b: dict, goals: list, goal_name: str) -> list[str]:
    """Section 7 of the block (`bench/boot_cache.py`'s figures), its goal appended to `goals`."""
    head = "### 7. Boot: power-on → first step, a stack's first machine and a replacement (`bench/boot_cache.py`)"
    if "skipped" in b:
        goals.append((goal_name, f"not measured: {b['skipped']}", "n/a"))
        return [head, "", f"Not measured: {b['skipped']}.", ""]
    first, later = b["first"], b["later"]
    rel = ratio(later["boot_to_first_step_s"], first["boot_to_first_step_s"])
    rel_start = ratio(later["boot_to_trainer_start_s"], first["boot_to_trainer_start_s"])
    goals.append((goal_name, times(rel), goal(rel, 0.5, at_least=False)))
    data = (f"a {b['data_mib']:g} MiB TFRecord data set in {b['data_files']} files in the bucket, which the "
            "trainer downloads in the background, 8 files at a time, in the order the epoch reads them "
            "(the first step waits for the files its first batches read)" if b["data_mib"] else "synthetic data")
    out = [head, "",
           "The real `userdata/` scripts in the boot sandbox (`devtools/sandbox.py`: fake machine commands, "
           "moto_server as S3, the fake metadata service), the trainer `bench.probe`. The store behind a link "
           f"throttled to **{b['store_mib_s']:g} MiB/s** each way (each request and answer), the package index "
           f"behind one of **{b['index_mib_s']:g} MiB/s** serving **{b['wheels_mib']:g} MiB** of incompressible "
           f"wheels (the real NVIDIA wheels are ~3 GB), {data}. *First*: an empty package cache, the packages "
           "from the index, archived to the bucket in the background once its trainer starts. *Replacement*: a "
           "fresh disk in the same bucket, the packages from the bucket's cache. The image pull is not modelled "
           "(the fake `docker pull` returns at once); `docs/boot.md` has the paper budget at real sizes.", ""]
    rows = []
    for name, e in (("first", first), ("replacement", later)):
        rows.append([name, fmt(e["boot_to_trainer_start_s"], ".2f"), fmt(e.get("trainer_start_to_first_step_s"), ".2f"),
                     fmt(e["boot_to_first_step_s"], ".2f"),
                     "bucket's cache" if e.get("from_cache") else "package index" if e.get("pip_from_index") else "–",
                     _on_disk(e, b["data_mib"])])
    rows.append(["**replacement ÷ first**", times(rel_start),
                 times(ratio(later.get("trainer_start_to_first_step_s"), first.get("trainer_start_to_first_step_s"))),
                 f"**{times(rel)}** (goal ≤ 0.50×: {goal(rel, 0.5, at_least=False)})", "", ""])
    out += [table(["machine", "→ trainer start s", "trainer start → first step s", "→ first step s", "packages from",
                   "data on disk at the first step"], rows, align=["l", "r", "r", "r", "l", "l"]), ""]
    steps = [f"{name}: {', '.join(f'{k} {v}' for k, v in e.get('bootstrap_steps_s', {}).items() if v) or 'none'}"
             for name, e in (("first", first), ("replacement", later))]
    out += [f"Bootstrap's steps that took a second or more (s, 1 s resolution): {'; '.join(steps)}. The first "
            f"machine's package archive ({fmt(first.get('cache_archive_mib'), '.1f')} MiB) was committed "
            f"{fmt(first.get('boot_to_cache_committed_s'), '.1f')} s after its power-on.", ""]
    return out


def _render_limit(fig: dict, goals: list) -> list[str]:
    """The trainer's loop against the machine's limit."""
    out: list[str] = []
    out += ["### 1. The trainer's loop against the machine's limit", "",
            "Limit: the model's step on one batch in memory, 100 steps per `tf.function` call, no pipeline, "
            f"no checkpoints (`bench/limit.py`). Trainer: `python -m trainer`, checkpoints to moto_server every "
            f"{fig['plan']['checkpoint_every_s']:g} s, TensorBoard on. *Loop* is the `finished` event's "
            "examples/s (first call's tracing and the checkpoints included); *steady* leaves out the first call. "
            "*Best*: the limit's fastest call and the loop's fastest TensorBoard window (a call of about a second): "
            "another user's load only slows a window down, so best ÷ best is this machine's ratio when quiet; "
            "the goal is judged on it, with steady ÷ limit (averaged over the load of the moment) beside it.", ""]
    rows = []
    for r in fig["limit"]:
        lim, run = r["limit"], r["trainer"]
        steady = ratio(run["steady_examples_per_sec"], lim["examples_per_sec"])
        best = ratio(run.get("best_examples_per_sec"), lim.get("best_examples_per_sec"))
        goals.append((f"loop ≥ 90 % of limit ({run['model']}, batch {run['batch']}; best ÷ best, steady ÷ limit)",
                      f"{pct(best)}, {pct(steady)}", goal(best, 0.9)))
        rows.append([f"`{run['model']}` batch {run['batch']}", fmt(lim["examples_per_sec"]),
                     fmt(run["examples_per_sec"]), fmt(run["steady_examples_per_sec"]),
                     pct(ratio(run["examples_per_sec"], lim["examples_per_sec"])), pct(steady),
                     fmt(lim.get("best_examples_per_sec")), fmt(run.get("best_examples_per_sec")), pct(best),
                     f"{run['steps']:,}", fmt(run["loop_seconds"], ".1f"), run["checkpoints_in_loop"]])
    out += [table(["model", "limit ex/s", "loop ex/s", "steady ex/s", "loop ÷ limit", "steady ÷ limit",
                     "best limit call", "best loop window", "best ÷ best", "steps", "loop s", "checkpoints in loop"],
                    rows), ""]
    return out


def _render_seed(fig: dict, goals: list) -> list[str]:
    """Against the seed article's script."""
    out: list[str] = []
    s, t = fig["seed"]["seed"], fig["seed"]["trainer"]
    vs = ratio(t["examples_per_sec"], s["examples_per_sec"])
    goals.append(("trainer ≥ 5× the seed's `fit` (mlp, batch 64)", times(vs), goal(vs, 5.0)))
    out += ["### 2. Against the seed article's script", "",
            f"Same model, {s['examples']:,} synthetic examples, batch 64, one process each. The seed's figure is "
            "its own (examples ÷ `fit` wall time, its TensorBoard histograms and per-epoch checkpoints included).", "",
            table(["run", "examples/s", "vs seed", "process wall s", "peak RSS MiB"], [
                ["seed (`fit`)", fmt(s["examples_per_sec"]), "1.00×", fmt(s["process_wall_s"], ".1f"),
                 s["peak_rss_mib"]],
                ["trainstack (loop)", fmt(t["examples_per_sec"]), times(vs), fmt(t["process_wall_s"], ".1f"),
                 t["peak_rss_mib"]],
            ]), "", "Where the trainer's start-up seconds go (process start → first step):", "",
            table(["phase", "s"], [[k, f"{v:.2f}"] for k, v in phases(t["marks"])]), ""]
    return out


def _render_startup(fig: dict, goals: list) -> list[str]:
    """Start-up, fresh and resumed, and the preemption that ends each."""
    out: list[str] = []
    f, r = fig["startup"]["fresh"], fig["startup"]["resumed"]
    fs, rs = f["marks"].get("first_step"), r["marks"].get("first_step")
    rel = ratio(rs, fs)
    goals.append(("resumed start ≤ 1.3× fresh", times(rel), goal(rel, 1.3, at_least=False)))
    mb = (r.get("checkpoint_bytes") or 0) / 1e6
    out += ["### 3. Start-up: process start → first step", "",
            f"`{' '.join(fig['plan']['startup_model'])}` on moto_server; the resumed run restores the "
            f"{mb:,.0f} MB checkpoint the fresh one committed when stopped.", ""]
    fp, rp = dict(phases(f["marks"])), dict(phases(r["marks"]))
    names = [k for k, _ in phases(r["marks"])] + [k for k in fp if k not in rp]
    rows = [[k, fmt(fp.get(k), ".2f"), fmt(rp.get(k), ".2f")] for k in names]
    rows.append(["**first step**", fmt(fs, ".2f"), fmt(rs, ".2f")])
    out += [table(["phase", "fresh s", "resumed s"], rows), "",
            f"Resumed ÷ fresh: {times(rel)}.", ""]
    out += ["### 5. Preemption: SIGTERM → exit 143, checkpoint committed", "",
            table(["run", "checkpoint MB", "SIGTERM → exit s", "`preempted` event's commit s", "marker found"], [
                [k, fmt((v.get("checkpoint_bytes") or 0) / 1e6, ",.0f"), fmt(v["sigterm_to_exit_s"], ".2f"),
                 fmt(v["preempted_seconds"], ".2f"), "yes" if v["committed"] else "**no**"]
                for k, v in (("fresh", f), ("resumed", r))]), ""]
    worst = max(f["sigterm_to_exit_s"], r["sigterm_to_exit_s"])
    ok = bool(f["committed"] and r["committed"])
    goals.append(("SIGTERM → committed < 20 s", f"{worst:.1f} s", goal(worst, 20.0, at_least=False) if ok else "**not met**"))
    return out


def _render_resume(fig: dict, goals: list) -> list[str]:
    """Resume of a model's own make_dataset."""
    out: list[str] = []
    rows = []
    for r in fig["resume"]:
        fresh = r["fresh"].get("first_step")
        st, sk = r["state"], r["skip"]
        by_state, by_skip = ratio(st["marks"].get("first_step"), fresh), ratio(sk["marks"].get("first_step"), fresh)
        goals.append((f"own make_dataset resumed start ≤ 1.3× fresh ({r['steps_done']:,} steps done)",
                      times(by_state), goal(by_state, 1.3, at_least=False)))
        restored, skipped = st.get("restored") or {}, sk.get("skipped") or {}
        rows.append([f"{r['steps_done']:,}", f"{st['batches_seen']:,}", fmt(fresh, ".2f"),
                     fmt(st["marks"].get("first_step"), ".2f"), times(by_state),
                     fmt(restored.get("seconds"), ".2f"), fmt((restored.get("bytes") or 0) / 2**20, ".1f"),
                     f"{sk['batches_seen']:,}", fmt(sk["marks"].get("first_step"), ".2f"), times(by_skip),
                     fmt(skipped.get("seconds"), ".2f")])
    out += ["### 3b. Resume of a model's own make_dataset: process start → first step", "",
            "`bench/resume_model.py` (synthetic MNIST in memory, `shuffle(10_000)` + per-image `map` + `batch(8)`, "
            "one Dense layer; 100 steps per call in every run) on moto_server: a fresh start, and the same run "
            "resumed after N steps from the input pipeline's state saved in its checkpoint (`data_restored`), "
            f"alternated, {fig['resume'][0].get('rounds', 1)} of each, the fastest of each kept (load only slows "
            "a start down); then, once, skipping the consumed batches as before this existed "
            "(`--data-state-max-mb 0`; `data_skipped`: the skip and the first call's 100 steps, tracing "
            "excluded).", "",
            table(["steps done", "batches (state)", "fresh s", "from state s", "÷ fresh", "state restore s",
                   "state MiB", "batches (skip)", "skipping s", "÷ fresh", "skip s"], rows), ""]
    return out


def _render_stall(fig: dict, goals: list) -> list[str]:
    """Checkpoint stall, memory and upload throughput."""
    out: list[str] = []
    every = fig["stall"]["every_s"]
    rows, tp_rows, mem_rows = [], [], []
    for s in fig["stall"]["sizes"]:
        blocked = s["blocked_s"]
        lost = contention_seconds(s["upload_wall_s"], s["rate_base"], s["rate_during"])
        ours, plain = throughput_mb_s(s["bytes"], s["upload_alone_s"]), throughput_mb_s(s["bytes"], s["plain_s"])
        beside = throughput_mb_s(s["bytes"], s["upload_s"])
        share = stall_percent(blocked, every)
        mb = f"{s['bytes'] / 1e6:,.0f}"
        goals.append((f"stall ≤ 5 % ({s['size_mb']:g} MB, every {every:g} s)", f"{share:.1f} %",
                      goal(share, 5.0, at_least=False)))
        if "sigterm_s" in s:
            goals.append((f"SIGTERM during a background save → committed < 20 s ({s['size_mb']:g} MB)",
                          f"{s['sigterm_s']:.1f} s", goal(s["sigterm_s"], 20.0, at_least=False)))
        tp = ratio(ours, plain)
        goals.append((f"upload ≥ 50 % of plain boto3 ({s['size_mb']:g} MB)", pct(tp), goal(tp, 0.5)))
        before = s.get("before_blocked_s")
        rows.append([mb, fmt(before, ".2f"), "–" if before is None else f"{stall_percent(before, every):.1f} %",
                     f"{s['save_s']:.2f}", fmt(s.get("copy_on_write_s"), ".2f"), f"{blocked:.2f}",
                     f"{share:.1f} %", f"{lost:.2f}", f"{stall_percent(blocked + lost, every):.1f} %",
                     fmt(s.get("tf_async_first_s"), ".2f"), fmt(s.get("tf_async_next_s"), ".2f"),
                     fmt(None if s.get("tf_async_update_s") is None or s.get("update_s") is None
                         else max(0.0, s["tf_async_update_s"] - s["update_s"]), ".2f"),
                     fmt(s.get("sigterm_s"), ".1f")])
        tp_rows.append([mb, fmt(beside, ",.0f"), fmt(ours, ",.0f"), fmt(plain, ",.0f"), pct(tp)])
        memory = s.get("memory_mib")
        if memory:
            mem_rows.append([mb, *(fmt(memory.get(k), ",.0f") for k in ("before", "ours", "tf_async"))])
    out += ["### 4. Checkpoint stall (moto_server)", "",
            "*Blocked* = what the loop waits per checkpoint: the background save (a snapshot of the variables, "
            "which costs no copy; TF's write, the resume fingerprint and the upload run on threads), plus the "
            "*copy on write*: the first update of the variables after the snapshot copies them (the same update's "
            "time with no snapshot held subtracted). *Before* = TF's write and the fingerprint in the loop, as "
            "before the background write, in the same run. Share of a run checkpointing every "
            f"{every:g} s = blocked ÷ (interval + blocked). *Contention* = training seconds lost while the "
            "background write and upload ran beside a training step (moto_server shares these cores, so this "
            "overstates a remote bucket). *TF async* = how long "
            "`write(options=CheckpointOptions(experimental_enable_async_checkpoint=True))` blocks, first call "
            "(it makes its host copies) and steady (the third: it refreshes them), without the resume fingerprint, and "
            "the same update's extra time after it (on a CPU its refresh shares the buffers: copy on write too). "
            "*SIGTERM* = a background save just handed over, then the stop's synchronous save of the next step: "
            "seconds until it is committed.", "",
            table(["MB", "before: blocked s", "before: share", "save s", "copy on write s", "blocked s",
                   "stall share", "contention s", "with contention", "TF async first s", "TF async steady s", "TF async copy on write s",
                   "SIGTERM → committed s"], rows), ""]
    if mem_rows:
        out += ["Peak resident memory above the process's before each save (MiB; the variables themselves "
                "excluded, the upload's buffers included):", "",
                table(["MB", "before (write in the loop)", "background save (snapshot held, updated once)",
                       "TF async (its host copies, kept)"], mem_rows), ""]
    out += ["Upload throughput: our commit (hashes, parallel multipart upload, listing check, marker) beside that "
            "training step, and again alone; plain = boto3 `upload_file` of the same files, alone.", "",
            table(["MB", "ours MB/s beside training", "ours MB/s alone", "plain boto3 MB/s", "ours alone ÷ plain"],
                  tp_rows), ""]
    return out


def _render_notice(fig: dict) -> list[str]:
    """The largest checkpoint committed within a spot notice."""
    out: list[str] = []
    n = fig["notice"]
    loc = n["local"]
    out += ["### 5b. The largest checkpoint committed within a spot notice (`bench/notice_budget.py`)", "",
            f"Synchronous commits (lease fence included) to each cloud's emulator on this machine, a fixed cost and "
            f"a rate fitted through them, and this machine's save ({loc['save_bytes_per_s']} MiB/s) and SHA-256 "
            f"({loc['sha256_bytes_per_s']} MiB/s) rates; the last step is taken as {n['step_s']} s. The emulators "
            "share these cores: their rate is this machine's floor, not a cloud's. See the script's docstring.", ""]
    rows = []
    for cloud, r in n["clouds"].items():
        for name, mib in r["largest_mib"].items():
            rows.append([cloud, f"{r['grace_s']} s", f"{r['fixed_s']} s", f"{r['emulator_mib_per_s']} MiB/s", name,
                         f"{mib:,}"])
    out += [table(["cloud", "grace", "fixed cost", "emulator rate", "bound", "largest checkpoint MiB"], rows), ""]
    rows = [[cloud, name, f"{v['link_only']:,}", f"{v['with_this_machines_save_and_hash']:,}"]
            for cloud, r in n["clouds"].items() for name, v in r["stated_links_mib"].items()]
    if rows:
        out += ["At each provider's stated bandwidth (upper bounds):", "",
                table(["cloud", "instance", "link only MiB", "with this machine's save + SHA-256 MiB"], rows), ""]
    return out


def _render_scaling(fig: dict, m: dict) -> list[str]:
    """Scaling shape (report only)."""
    out: list[str] = []
    rows = []
    base = fig["scaling"][0]
    for s in fig["scaling"]:
        per_step = ratio(s["loop_seconds"], s["steps"])
        base_step = ratio(base["loop_seconds"], base["steps"])
        extra_ms = None if per_step is None or base_step is None else 1000 * (per_step - base_step)
        rows.append([s["workers"], fmt(s["examples_per_sec"]), fmt(ratio(s["examples_per_sec"], s["workers"])),
                     times(ratio(s["examples_per_sec"], base["examples_per_sec"])),
                     fmt(per_step and 1000 * per_step, ".2f"), fmt(extra_ms, "+.2f"), fmt(s["process_wall_s"], ".1f")])
    out += ["### 6. Scaling shape (report only)", "",
            f"`mlp`, batch 64 per worker, {fig['plan']['scaling_steps']:,} steps, worker processes on 127.0.0.1 "
            f"(TF_CONFIG, MultiWorkerMirroredStrategy) sharing {m['cpus']} cores: the shape and the per-step cost of "
            "the all-reduce (and of sharing the cores), not a speed-up.", "",
            table(["workers", "examples/s (all)", "per worker", "vs 1 worker", "ms per step", "vs 1 worker ms",
                     "process wall s"], rows), ""]
    return out


def render(fig: dict) -> str:
    """The generated block of RESULTS.md from the figures of one run."""
    m = fig["machine"]
    out = [f"## Latest run: {fig['date']}{' (QUICK smoke run: sizes too small to mean anything)' if fig['quick'] else ''}",
           "",
           f"Command: `{fig['command']}` — {fig['duration_s'] / 60:.1f} min. Machine: {m['cpus']} CPU cores, "
           f"{m['gpus']} GPU, {m['platform']}, Python {m['python']}, TensorFlow {m['tf']}. Load average (1 min) "
           f"{m['load_before']:.2f} before, {m['load_after']:.2f} after: figures move with the machine's other work, "
           "so only the ratios within this run count.", ""]
    goals = []
    if "limit" in fig:
        out += _render_limit(fig, goals)
    if "seed" in fig:
        out += _render_seed(fig, goals)
    if "startup" in fig:
        out += _render_startup(fig, goals)
    if fig.get("resume"):
        out += _render_resume(fig, goals)
    if "stall" in fig:
        out += _render_stall(fig, goals)
    if "notice" in fig:
        out += _render_notice(fig)
    if "scaling" in fig:
        out += _render_scaling(fig, m)
    errors = fig.get("errors") or {}
    boot_goal = "replacement power-on → first step ≤ 0.5× the first machine's (boot sandbox)"
    if "boot" in fig:
        out += render_boot(fig["boot"], goals, boot_goal)
    elif "boot" in errors:
        goals.append((boot_goal, "not measured: the section failed (below)", "**not met**"))
    for name, error in errors.items():
        out += [f"### Section `{name}` FAILED", "", "```", error.strip()[-1500:], "```", ""]
    head, body = out[:4], out[4:]
    if goals:
        head += ["### Goals", "", table(["goal", "this run", ""], [list(g) for g in goals]), ""]
    return "\n".join(head + body)
