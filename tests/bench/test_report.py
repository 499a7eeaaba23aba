"""The bench's arithmetic and the Markdown it writes (bench/report.py): no TensorFlow."""

from __future__ import annotations

import copy

import pytest

from bench import report as R


@pytest.mark.parametrize(("num", "den", "want"), [(9.0, 10.0, 0.9), (1.0, 0.0, None), (None, 2.0, None), (2.0, None, None),
                                                  (3.0, -1.0, None)])
def test_ratio(num, den, want):
    assert R.ratio(num, den) == want


def test_steady_rate_leaves_out_the_first_call():
    # 10,000 examples in 2 s, of which the first call took 1 s for 1,000 examples: 9,000 / 1 s.
    assert R.steady_rate(10_000, 2.0, 1_000, 1.0) == 9_000
    assert R.steady_rate(10_000, 1.0, 1_000, 1.0) is None


@pytest.mark.parametrize(("blocked", "every", "want"), [(0.0, 30.0, 0.0), (1.5, 28.5, 5.0), (30.0, 30.0, 50.0), (-1, 30, 0.0)])
def test_stall_percent_is_the_share_of_wall_time(blocked, every, want):
    assert R.stall_percent(blocked, every) == pytest.approx(want)


def test_stall_percent_needs_an_interval():
    with pytest.raises(ValueError, match="positive"):
        R.stall_percent(1.0, 0)


def test_contention_is_upload_time_times_the_speed_lost():
    assert R.contention_seconds(10.0, 100.0, 75.0) == pytest.approx(2.5)
    assert R.contention_seconds(10.0, 100.0, 120.0) == 0.0  # faster while uploading: noise, not a gain
    assert R.contention_seconds(10.0, None, 50.0) == 0.0
    assert R.contention_seconds(0.0, 100.0, 50.0) == 0.0


def test_throughput_in_megabytes_per_second():
    assert R.throughput_mb_s(100e6, 4.0) == 25.0
    assert R.throughput_mb_s(1, 0.0) is None


def test_split_phases_adds_up_to_the_first_step():
    marks = {"zero": 0.0, "a0": 0.5, "a1": 2.5, "b0": 3.0, "b1": 3.5, "first_step": 5.0}
    rows = R.split_phases(marks, [("A", "a0", "a1"), ("B", "b0", "b1"), ("missing", "x0", "x1")])
    assert [name for name, _ in rows] == ["A", "B", "other (store, events, Python between phases)"]
    assert dict(rows)["A"] == 2.0 and dict(rows)["B"] == 0.5
    assert sum(s for _, s in rows) == pytest.approx(5.0)


@pytest.mark.parametrize(("value", "target", "at_least", "want"), [
    (0.95, 0.9, True, "met"), (0.5, 0.9, True, "**not met**"), (1.2, 1.3, False, "met"), (1.4, 1.3, False, "**not met**"),
    (None, 1.0, True, "n/a"), (float("nan"), 1.0, True, "n/a")])
def test_goal(value, target, at_least, want):
    assert R.goal(value, target, at_least=at_least) == want


def test_formatting():
    assert R.fmt(12345.6) == "12,346" and R.fmt(None) == "–" and R.fmt(1.234, ".2f") == "1.23"
    assert R.pct(0.934) == "93 %" and R.pct(None) == "–"
    assert R.times(2.5) == "2.50×" and R.times(None) == "–"


def test_table_checks_its_shape():
    text = R.table(["a", "b"], [[1, 2]])
    assert text.splitlines() == ["| a | b |", "|---|---:|", "| 1 | 2 |"]
    with pytest.raises(ValueError, match="2 cells"):
        R.table(["a", "b", "c"], [[1, 2]])
    with pytest.raises(ValueError, match="alignments"):
        R.table(["a"], [], align=["l", "r"])


def test_replace_block_keeps_what_is_outside_the_markers():
    doc = f"# Title\n\nby hand\n\n{R.BEGIN}\nold figures\n{R.END}\n\n## History\nkept\n"
    new = R.replace_block(doc, "new figures")
    assert "old figures" not in new and "new figures" in new
    assert new.startswith("# Title\n\nby hand\n") and new.endswith("## History\nkept\n")
    assert R.replace_block(new, "newer") .count(R.BEGIN) == 1
    appended = R.replace_block("# Only a title\n", "figures")
    assert appended.startswith("# Only a title") and appended.rstrip().endswith(R.END) and "figures" in appended


MARKS = {"python": 0.05, "imports_start": 0.1, "imports_end": 3.1, "strategy_start": 3.2, "strategy_end": 3.3,
         "model_start": 3.4, "model_end": 3.6, "dataset_start": 3.7, "dataset_end": 3.9, "call1_start": 4.0,
         "call1_end": 5.0, "first_step": 5.0}
RESUMED = {**MARKS, "restore_start": 3.6, "restore_end": 4.6, "dataset_start": 4.7, "dataset_end": 4.9,
           "call1_start": 5.0, "call1_end": 6.0, "first_step": 6.0}
RUN = {"model": "mlp", "batch": 64, "steps": 1000, "examples_per_sec": 40_000.0, "steady_examples_per_sec": 45_000.0,
       "best_examples_per_sec": 44_000.0, "windows": 20,
       "loop_seconds": 1.6, "checkpoints_in_loop": 1, "process_wall_s": 8.0, "peak_rss_mib": 600, "marks": MARKS,
       "loss": 0.1}
FIGURES = {
    "date": "2026-12-01 00:00 UTC", "quick": False, "command": "python -m bench", "duration_s": 600.0,
    "plan": {"checkpoint_every_s": 30.0, "startup_model": ["--model", "transformer-lm"], "scaling_steps": 1000},
    "machine": {"cpus": 2, "gpus": 0, "platform": "Linux x86_64", "python": "3.11", "tf": "2.21.0",
                "load_before": 1.0, "load_after": 2.0},
    "limit": [{"limit": {"examples_per_sec": 50_000.0, "best_examples_per_sec": 55_000.0}, "trainer": RUN}],
    "seed": {"seed": {"examples_per_sec": 8_000.0, "process_wall_s": 40.0, "peak_rss_mib": 700, "examples": 300_000},
             "trainer": RUN},
    "startup": {"fresh": {"marks": MARKS, "process_wall_s": 9.0, "sigterm_to_exit_s": 4.0, "preempted_seconds": 3.5,
                          "step": 10, "committed": {"bytes": 100e6}, "checkpoint_bytes": 100e6, "resumed_from": None},
                "resumed": {"marks": RESUMED, "process_wall_s": 10.0, "sigterm_to_exit_s": 25.0, "preempted_seconds": 3.5,
                            "step": 20, "committed": {"bytes": 100e6}, "checkpoint_bytes": 100e6, "resumed_from": 10}},
    "stall": {"every_s": 30.0, "sizes": [{"size_mb": 100, "bytes": 100e6, "save_s": 0.5, "copy_on_write_s": 0.1,
                                          "blocked_s": 0.6, "before_blocked_s": 2.0, "tf_async_first_s": 1.5,
                                          "tf_async_next_s": 0.7, "sigterm_s": 21.0,
                                          "update_s": 0.2, "tf_async_update_s": 0.5,
                                          "memory_mib": {"before": 10.0, "ours": 101.0, "tf_async": 99.0},
                                          "upload_s": 8.0, "upload_alone_s": 4.0, "upload_wall_s": 4.0,
                                          "plain_s": 2.0,
                                          "rate_base": 100.0, "rate_during": 50.0}]},
    "scaling": [{"workers": 1, "examples_per_sec": 40_000.0, "steady_examples_per_sec": 41_000.0, "loop_seconds": 1.6,
                 "steps": 1000, "process_wall_s": 8.0},
                {"workers": 2, "examples_per_sec": 60_000.0, "steady_examples_per_sec": 61_000.0, "loop_seconds": 2.2,
                 "steps": 1000, "process_wall_s": 12.0}],
}


def _goal_rows(text: str) -> dict[str, str]:
    section = text.split("### Goals", 1)[1].split("###", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ") and "goal" not in line]
    return {cells[0].strip(): cells[2].strip() for cells in rows}


def test_render_states_every_goal_against_its_figure():
    text = R.render(copy.deepcopy(FIGURES))
    goals = _goal_rows(text)
    assert goals == {
        # best ÷ best 44,000 / 55,000 = 80 %: not met, though steady ÷ limit is 90 %
        "loop ≥ 90 % of limit (mlp, batch 64; best ÷ best, steady ÷ limit)": "**not met**",
        "trainer ≥ 5× the seed's `fit` (mlp, batch 64)": "met",  # 40,000 / 8,000
        "resumed start ≤ 1.3× fresh": "met",  # 6.0 / 5.0
        "SIGTERM → committed < 20 s": "**not met**",  # the resumed run took 25 s
        "stall ≤ 5 % (100 MB, every 30 s)": "met",  # 0.6 / 30.6
        "SIGTERM during a background save → committed < 20 s (100 MB)": "**not met**",  # 21 s
        "upload ≥ 50 % of plain boto3 (100 MB)": "met",  # 25 MB/s vs 50 MB/s
    }
    assert "python -m bench" in text and "load average (1 min) 1.00 before, 2.00 after" in text.lower()
    assert "| 2 | 60,000 | 30,000 | 1.50× | 2.20 | +0.60 | 12.0 |" in text  # scaling: per step 2.2 ms vs 1.6 ms
    assert "| restore (download, verify, read) | – | 1.00 |" in text
    # stall: before 2.0 s of 32 s; now 0.6 s of 30.6 s; contention 4 s × half the speed = 2 s
    assert "| 100 | 2.00 | 6.2 % | 0.50 | 0.10 | 0.60 | 2.0 % | 2.00 | 8.0 % | 1.50 | 0.70 | 0.30 | 21.0 |" in text
    assert "| 100 | 10 | 101 | 99 |" in text  # peak memory: before, background save, TF async


def test_render_reports_a_missing_commit_marker_as_a_failed_preemption():
    figures = copy.deepcopy(FIGURES)
    figures["startup"]["resumed"]["sigterm_to_exit_s"] = 5.0
    assert _goal_rows(R.render(figures))["SIGTERM → committed < 20 s"] == "met"
    figures["startup"]["fresh"]["committed"] = None
    assert _goal_rows(R.render(figures))["SIGTERM → committed < 20 s"] == "**not met**"
    assert "| fresh | 100 | 4.00 | 3.50 | **no** |" in R.render(figures)


def test_phases_include_the_interpreter_and_add_up():
    rows = dict(R.phases(RESUMED))
    assert rows["interpreter up"] == 0.05 and rows["imports (TensorFlow, Keras, trainer)"] == pytest.approx(3.0)
    assert sum(rows.values()) == pytest.approx(RESUMED["first_step"])


def test_tensorboard_scalars_reads_what_the_trainer_writes(tmp_path):
    import tensorflow as tf

    from bench.run_all import tensorboard_scalars

    writer = tf.summary.create_file_writer(str(tmp_path / "tb"))
    with writer.as_default():
        for step, rate in ((50, 1000.5), (100, 2000.25)):
            tf.summary.scalar("examples_per_sec", rate, step=step)
            tf.summary.scalar("loss", 0.5, step=step)
    writer.flush()
    assert tensorboard_scalars(str(tmp_path / "tb"), "examples_per_sec") == [(50, 1000.5), (100, 2000.25)]
    assert tensorboard_scalars(str(tmp_path / "missing"), "loss") == []


def test_render_resume_judges_the_restored_start_and_shows_the_skip_beside_it():
    figures = copy.deepcopy(FIGURES)

    def resumed(first_step, batches, **event):
        return {"marks": {**RESUMED, "first_step": first_step}, "batches_seen": batches,
                "restored": event or None, "skipped": None if event else {"seconds": 40.0}}

    figures["resume"] = [
        {"steps_done": 1_000, "fresh": MARKS, "state": resumed(6.0, 1_100, seconds=0.4, bytes=10 * 2**20),
         "skip": resumed(7.0, 1_200)},
        {"steps_done": 100_000, "fresh": MARKS, "state": resumed(7.0, 100_100, seconds=0.5, bytes=10 * 2**20),
         "skip": resumed(50.0, 100_200)},
    ]
    text = R.render(figures)
    goals = _goal_rows(text)
    assert goals["own make_dataset resumed start ≤ 1.3× fresh (1,000 steps done)"] == "met"  # 6.0 / 5.0
    assert goals["own make_dataset resumed start ≤ 1.3× fresh (100,000 steps done)"] == "**not met**"  # 7.0 / 5.0
    assert "| 100,000 | 100,100 | 5.00 | 7.00 | 1.40× | 0.50 | 10.0 | 100,200 | 50.00 | 10.00× | 40.00 |" in text


def _machine(first_step, trainer_start, *, cache, on_disk=None):
    entry = {"boot_to_first_step_s": first_step, "boot_to_trainer_start_s": trainer_start,
             "trainer_start_to_first_step_s": round(first_step - trainer_start, 2),
             "bootstrap_steps_s": {"gpu": 0, "code": 24 if not cache else 3, "data": 0},
             "from_cache": cache, "pip_from_index": not cache}
    if on_disk:
        files, total = on_disk
        entry["data_at_first_step"] = {"files": files, "files_total": total, "bytes": files * 4 * 2**20,
                                       "bytes_total": total * 4 * 2**20}
    return entry


BOOT = {"store_mib_s": 16.0, "index_mib_s": 2.0, "wheels_mib": 48.0, "data_mib": 64.0, "data_files": 16,
        "data_records": 20_000,
        "first": {**_machine(60.0, 40.0, cache=False, on_disk=(8, 16)), "boot_to_cache_committed_s": 70.5,
                  "cache_archive_mib": 48.0},
        "later": _machine(27.0, 12.0, cache=True, on_disk=(16, 16))}
BOOT_GOAL = "replacement power-on → first step ≤ 0.5× the first machine's (boot sandbox)"


def test_render_boot_shows_both_machines_the_ratio_against_its_goal_and_the_links():
    figures = copy.deepcopy(FIGURES)
    figures["boot"] = copy.deepcopy(BOOT)
    text = R.render(figures)
    assert _goal_rows(text)[BOOT_GOAL] == "met"  # 27 / 60 = 0.45
    section = text.split("### 7.", 1)[1]
    assert "**16 MiB/s** each way" in section and "**2 MiB/s** serving **48 MiB**" in section
    assert "a 64 MiB TFRecord data set in 16 files" in section
    assert "| first | 40.00 | 20.00 | 60.00 | package index | 8 of 16 files (32.0 of 64.0 MiB): streamed |" in section
    assert ("| replacement | 12.00 | 15.00 | 27.00 | bucket's cache | all 16 files (64.0 of 64.0 MiB): every file had "
            "landed by the first step, nothing left to stream |") in section
    assert "| **replacement ÷ first** | 0.30× | 0.75× | **0.45×** (goal ≤ 0.50×: met) |" in section
    assert "first: code 24; replacement: code 3" in section and "(48.0 MiB) was committed 70.5 s" in section

    figures["boot"]["later"] = _machine(45.0, 30.0, cache=True)  # 0.75×, and its data event missing
    text = R.render(figures)
    assert _goal_rows(text)[BOOT_GOAL] == "**not met**"
    assert "(goal ≤ 0.50×: **not met**)" in text
    assert "| replacement | 30.00 | 15.00 | 45.00 | bucket's cache | **not reported** (no `data_first_step` event) |" in text


@pytest.mark.parametrize(("change", "cell", "lines"), [
    ({"boot": {"skipped": "skipped in the quick run: too dear"}}, "n/a",
     ["not measured: skipped in the quick run: too dear", "### 7. Boot",
      "Not measured: skipped in the quick run: too dear."]),
    ({"errors": {"boot": "SystemExit: bench: bench/boot_cache.py exited 1"}}, "**not met**",
     ["not measured: the section failed (below)", "### Section `boot` FAILED", "boot_cache.py exited 1"]),
], ids=["skipped", "failed"])
def test_render_boot_says_when_it_was_skipped_or_failed(change, cell, lines):
    text = R.render({**copy.deepcopy(FIGURES), **change})
    assert _goal_rows(text)[BOOT_GOAL] == cell
    missing = [line for line in lines if line not in text]
    assert not missing, missing


def test_render_has_no_boot_row_when_boot_was_not_asked_for():
    assert BOOT_GOAL not in R.render(copy.deepcopy(FIGURES))  # `--only` without it


def test_last_json_reads_an_indented_document_as_boot_cache_prints_it():
    import json

    from bench.run_all import Result

    doc = {"first": {"boot_to_first_step_s": 1.5, "bootstrap_steps_s": {"code": 2}}, "later": {"x": [1, 2]}}
    printed = "starting\n" + json.dumps({"old": 1}) + "\n" + json.dumps(doc, indent=2) + "\n"
    assert Result(0, printed, "", 0, 0, {}).last_json() == doc
    assert Result(0, '{"a": 1}\n{"b": 2}\n', "", 0, 0, {}).last_json() == {"b": 2}  # one line each: the last
    with pytest.raises(ValueError, match="no JSON object"):
        Result(0, "nothing\n", "", 0, 0, {}).last_json()
