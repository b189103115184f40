"""scripts/bench stays runnable: a tiny benchmark end to end (so it never rots), and the pieces
its figures rest on: steady-state rates, the least-squares fit of batch cost, driver and
process-tree memory, start-up phases from log lines, the last line, CSV and chart."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from benchlib import cli, memory, report, rows, startup, sweep, visibility  # noqa: E402

NUMBER = r"(?:-?\d+(?:\.\d+)?|nan)"
LAST_LINE = re.compile(
    rf"^bench: pipeline_rps=(?P<pipeline>{NUMBER}) simple_ingest_rps=(?P<simple>{NUMBER}) "
    rf"ratio_to_simple=(?P<ratio>{NUMBER}) batch_fixed_s=(?P<fixed>{NUMBER}) "
    rf"us_per_record=(?P<us>{NUMBER}) startup_s=(?P<startup>{NUMBER}) "
    rf"overhead_pct=(?P<overhead>{NUMBER}) driver_rss_ratio=(?P<rss_ratio>{NUMBER}) "
    rf"delta_spark_rps=(?P<delta_spark>{NUMBER}) "
    rf"delta_spark_to_plain=(?P<delta_spark_to_plain>{NUMBER}) "
    rf"avro_ratio_to_simple=(?P<avro_ratio>{NUMBER}) "
    rf"pipeline_to_ceiling=(?P<to_ceiling>{NUMBER}) "
    rf"startup_over_floor_s=(?P<startup_over_floor>{NUMBER}) "
    rf"fixed_over_floor_s=(?P<fixed_over_floor>{NUMBER}) "
    rf"two_tables_to_two_pipelines=(?P<fan_out>{NUMBER}) "
    rf"fixed_over_python_floor_s=(?P<fixed_over_python_floor>{NUMBER}) "
    rf"delta_spark_to_stream=(?P<delta_spark_to_stream>{NUMBER}) "
    rf"delta_spark_to_foreach_batch=(?P<delta_spark_to_foreach_batch>{NUMBER}) "
    rf"cluster_to_stream=(?P<cluster_to_stream>{NUMBER}) "
    rf"delta_spark_log_read_s=(?P<delta_spark_log_read>{NUMBER})$"
)


# 3000 records in 2 batches per pipeline row; a sweep of two points at 4 partitions (the fit
# needs two, with steady batches of different sizes); driver peaks at two batch sizes; a
# 3-batch memory run; Spark's floor at its fewest batches (in row 10's process).
TINY = (
    "--records 3000 --partitions 2 --batch-size 1500 --floor-batches 10 "
    "--sweep-partitions 4 --sweep-records 2000 --sweep-batch-sizes 500,1000 "
    "--rss-batch-sizes 500,1500 --rss-batches 1 --memory-batches 3 --memory-batch-size 250"
).split()


def _bench(args: list[str], out: Path, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench.py"), *args, "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    last = result.stdout.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, f"last line has the wrong form: {last!r}"
    return result, {k: float(v) for k, v in match.groupdict().items()}


def _csv(out: Path) -> list[dict[str, str]]:
    with open(out / "bench.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_tiny_benchmark_prints_every_figure_and_verifies_every_row(tmp_path: Path) -> None:
    started = time.monotonic()
    jars = cli.default_delta_jars()
    result, figures = _bench(
        TINY,
        tmp_path,
        # Fourteen rows, eight of them Spark processes of their own (rows 6, 7 and 12-14 with
        # the connector jars), then the session.
        timeout=1200,
    )
    elapsed = time.monotonic() - started
    last = str(figures)
    for key in ("pipeline", "simple", "ratio", "startup", "rss_ratio"):
        assert figures[key] > 0, last
    # The fit and the exactly-once overhead rest on differences of measurements: noise
    # may make them negative on a busy machine, but they are measured (not nan).
    for key in (
        "fixed",
        "us",
        "overhead",
        "startup_over_floor",
        "fixed_over_floor",
        "fixed_over_python_floor",
    ):
        assert not math.isnan(figures[key]), last
    assert figures["ratio"] == pytest.approx(
        figures["pipeline"] / figures["simple"], rel=0.01, abs=1e-4
    )
    delta_spark_figures = (
        "delta_spark",
        "delta_spark_to_plain",
        "delta_spark_to_stream",
        "delta_spark_to_foreach_batch",
        "cluster_to_stream",
        "delta_spark_log_read",
    )
    for key in delta_spark_figures:
        assert (figures[key] > 0) if jars else math.isnan(figures[key]), (key, last)

    table = _csv(tmp_path)
    main = [r for r in table if r["section"] == "main"]
    assert sorted(int(r["row"]) for r in main) == list(range(1, 15))
    # Rows 8 and 9: the same events as Confluent-framed Avro behind the development registry.
    rps = {int(r["row"]): float(r["records_per_s"]) for r in main if r["verified"] == "True"}
    assert figures["avro_ratio"] == pytest.approx(rps[8] / rps[9], rel=0.01), last
    # Row 10: the read path to Spark's noop sink, and Spark's floor taken in its process.
    assert figures["to_ceiling"] == pytest.approx(rps[4] / rps[10], rel=0.01), last
    (ceiling,) = [r for r in main if r["row"] == "10"]
    floor = {k: float(ceiling[f"floor_{k}"]) for k in ("session_s", "first_batch_s", "batch_s")}
    assert 0 < floor["session_s"] < floor["first_batch_s"], ceiling
    assert floor["batch_s"] > 0 and float(ceiling["floor_batch_no_job_s"]) > 0, ceiling
    (row4,) = [r for r in main if r["row"] == "4"]
    assert figures["startup_over_floor"] == pytest.approx(
        float(row4["startup_s"]) - floor["first_batch_s"], abs=0.06
    ), last
    assert figures["fixed_over_floor"] == pytest.approx(
        figures["fixed"] - floor["batch_s"], abs=2e-3
    ), last
    # ... and over Spark's floor for a batch handed to Python tasks, as the delta-rs sink's is.
    python_floor = float(ceiling["floor_batch_python_write_s"])
    assert python_floor > 0, ceiling
    assert figures["fixed_over_python_floor"] == pytest.approx(
        figures["fixed"] - python_floor, abs=2e-3
    ), last
    # Row 11: two tables from one read, against two single-table pipelines reading twice, in
    # the session; both sides' paid tables hold each paid order once (750 of 3000).
    (fan_out,) = [r for r in main if r["row"] == "11"]
    every, paid = float(fan_out["all_pipeline_rps"]), float(fan_out["paid_pipeline_rps"])
    assert every > 0 and paid > 0, fan_out
    assert int(fan_out["paid_pipeline_ids"]) == int(fan_out["two_tables_paid_ids"]) == 750
    assert figures["fan_out"] == pytest.approx((1 / rps[11]) / (1 / every + 1 / paid), rel=0.01), (
        last
    )
    if jars:  # row 7: the plain foreachBatch write the delta-spark sink is measured against
        assert figures["delta_spark_to_plain"] == pytest.approx(rps[6] / rps[7], rel=0.01), last
        # ... and rows 12, 13: Structured Streaming as a user writes it by hand.
        assert figures["delta_spark_to_stream"] == pytest.approx(rps[6] / rps[12], rel=0.01)
        assert figures["delta_spark_to_foreach_batch"] == pytest.approx(rps[6] / rps[13], rel=0.01)
        assert figures["cluster_to_stream"] == pytest.approx(rps[14] / rps[12], rel=0.01)
        # The engine's own step timings of the delta-spark pipelines' steady batches: the log
        # reads (check + read-back) apart from the write, in the CSV and the last line. Inside
        # foreachBatch a commit that landed is read back from no log (CommitWatch): 0.
        for number in ("6", "14"):
            (timed,) = [r for r in main if r["row"] == number]
            check, back = float(timed["steady_check_s"]), float(timed["steady_read_back_s"])
            assert check > 0 and back == 0 and float(timed["steady_write_s"]) > 0, timed
            assert float(timed["steady_log_read_s"]) == pytest.approx(check + back, abs=2e-4)
        (six,) = [r for r in main if r["row"] == "6"]
        assert figures["delta_spark_log_read"] == pytest.approx(
            float(six["steady_log_read_s"]), abs=1e-4
        )
        assert "the sink's log reads" in result.stdout, result.stdout
    for row in main:
        if row["row"] in ("6", "7", "12", "13", "14") and not jars:
            assert row["verified"] == "skipped" and "no delta-spark jars" in row["note"], row
            continue
        assert row["verified"] == "True", row
        assert int(row["records"]) == int(row["rows_out"]) == 3000, row
        assert float(row["records_per_s"]) > 0, row
        if row["row"] != "11":  # row 11 runs in the session's process: no RSS of its own
            assert float(row["peak_rss_mb"]) > 0, row
        if 2 <= int(row["row"]) <= 9 or int(row["row"]) >= 11:  # each id exactly once
            assert int(row["distinct_ids"]) == 3000, row
    for row in (r for r in main if int(r["row"]) in (4, 5, 6, 7, 8) and r["verified"] == "True"):
        assert float(row["startup_s"]) > 0, row
        assert int(row["batches"]) == 2, row  # 3000 records at 1500 per trigger
        # The driver's own peak (Python, and its JVM apart), and the start-up's phases.
        assert 0 < float(row["driver_peak_mb"]) < float(row["peak_rss_mb"]), row
        assert float(row["jvm_peak_mb"]) > 0, row
        phases = [float(row[startup.column(p)]) for p, _ in startup.PHASES]
        assert sum(phases) == pytest.approx(float(row["startup_s"]), abs=1.0), row
    sweep_rows = [r for r in table if r["section"] == "sweep"]
    assert [(r["partitions"], r["batch_size"]) for r in sweep_rows] == [("4", "500"), ("4", "1000")]
    (fit,) = [r for r in table if r["section"] == "fit"]
    assert (
        float(fit["batch_fixed_s"]) == figures["fixed"]
        or abs(float(fit["batch_fixed_s"]) - figures["fixed"]) < 1e-3
    )
    peaks, flat = (
        [r for r in table if r["section"] == "memory"][:2],
        [r for r in table if r["section"] == "memory"][2],
    )
    assert [p["batch_size"] for p in peaks] == ["500", "1500"]
    assert all(p["verified"] == "True" and float(p["driver_peak_mb"]) > 0 for p in peaks)
    assert figures["rss_ratio"] == pytest.approx(
        float(peaks[1]["driver_peak_mb"]) / float(peaks[0]["driver_peak_mb"]), abs=2e-3
    )
    assert flat["verified"] == "True" and int(flat["batches"]) == 3, flat
    assert float(flat["driver_rss_first_mb"]) > 0 and float(flat["driver_rss_last_mb"]) > 0
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A first, untimed run recorded the JVM class archive the timed runs map; gone after.
    assert "JVM class archive: recorded by a first run" in result.stdout, result.stdout
    assert not (tmp_path / "jvm-archive").exists()
    # Tables are removed once verified; the generated project and the logs stay for reading.
    assert not any((tmp_path / "tables").glob("*"))
    print(f"tiny benchmark took {elapsed:.0f}s")


def test_without_delta_spark_jars_row_6_says_so_and_the_run_still_succeeds(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "no-jars"
    empty.mkdir()
    out = tmp_path / "out"
    result, figures = _bench(
        [
            "--records",
            "200",
            "--rows",
            "6",
            "--no-sweep",
            "--no-memory",
            "--delta-jars",
            str(empty),
        ],
        out,
        timeout=300,
    )
    assert "skipped: no delta-spark jars" in result.stdout
    assert "records the class archive" not in result.stdout  # no Spark run: no recording run
    (row,) = _csv(out)
    assert (row["row"], row["verified"]) == ("6", "skipped")
    assert str(empty) in row["note"] and "holds no .jar file" in row["note"]
    # Nothing of the last line was measured: every figure says so.
    assert all(math.isnan(v) for v in figures.values()), result.stdout.splitlines()[-1]


# -- the pieces ---------------------------------------------------------------------------


def test_steady_rate_leaves_out_the_first_batch() -> None:
    # (commit time, rows): batch 0 took the start-up; 20 rows then took 4 seconds.
    rate, first_end = rows.steady([(10.0, 5), (12.0, 10), (14.0, 10)])
    assert first_end == 10.0
    assert rate == pytest.approx(5.0)
    assert rows.steady([]) == (0.0, None)


def test_repeated_pipeline_runs_are_summarised_by_their_medians() -> None:
    runs = [
        rows.Row(4, "pipeline", 1000, 100, rps=rps, startup_s=s, repeat=i, extra={"x": s})
        for i, (rps, s) in enumerate(((50.0, 9.0), (70.0, 11.0), (60.0, 10.0)))
    ]
    (row,) = rows.summary_rows(runs)
    assert (row.rps, row.startup_s, row.extra["x"]) == (60.0, 10.0, 10.0)
    assert "median of 3 runs" in row.note


def test_sweep_covers_10k_to_500k_at_full_size_and_shrinks_for_small_runs() -> None:
    assert sweep.scaled_batch_sizes(1_000_000) == [10_000, 50_000, 100_000, 250_000, 500_000]
    small = sweep.scaled_batch_sizes(20_000)
    assert small == sorted(set(small))
    assert min(small) >= 1_000  # at most ~20 batches a point
    assert max(small) <= 10_000  # at least two batches, so one is steady


def test_batch_cost_fit_recovers_fixed_cost_and_marginal_cost() -> None:
    # The 4-partition points: 15k records at 22,906/s and 150k at 145,857/s.
    points = [(15_000, 15_000 / 22_906), (150_000, 150_000 / 145_857)]
    fit = sweep.fit_batch_cost(4, points)
    assert fit is not None
    # Through two points the line is exact: slope = dy/dx, intercept = y1 - slope x1.
    slope = (points[1][1] - points[0][1]) / (points[1][0] - points[0][0])
    assert fit.us_per_record == pytest.approx(slope * 1e6) == pytest.approx(2.767, abs=1e-3)
    assert fit.fixed_s == pytest.approx(points[0][1] - slope * 15_000)
    assert fit.fixed_s == pytest.approx(0.613, abs=1e-3)  # "about 0.61 s", as the issue says
    assert fit.marginal_rps == pytest.approx(1e6 / fit.us_per_record)
    # Least squares over noisy points: the textbook solution of this small system.
    a, b = sweep.fit_line([(1.0, 1.0), (2.0, 2.0), (3.0, 2.0), (4.0, 4.0)])  # type: ignore[misc]
    assert (a, b) == (pytest.approx(0.0), pytest.approx(0.9))
    assert sweep.fit_line([(5.0, 1.0), (5.0, 2.0)]) is None  # one batch size: no line
    assert sweep.fit_batch_cost(4, [(5.0, 1.0)]) is None


def test_steady_batch_cost_times_batches_from_commit_to_commit() -> None:
    # Batch 0 (start-up) is left out: two steady batches of 100 and 300 rows in 6 seconds.
    assert sweep.steady_batch_cost([(10.0, 999), (13.0, 100), (16.0, 300)]) == (200.0, 3.0)
    assert sweep.steady_batch_cost([(10.0, 999)]) is None


def test_a_long_run_compares_its_first_and_last_steady_batches() -> None:
    # (commit time, rows, batch function s, sink s): batch 0 is start-up; 4 steady batches
    # whose cost grew from 0.5 s to 0.75 s, the sink's share from 0.1 s to 0.3 s.
    batches = [[10.0, 9, 5.0, 1.0], [10.5, 1, 0.4, 0.1], [11.0, 1, 0.4, 0.1]]
    batches += [[11.75, 1, 0.6, 0.3], [12.5, 1, 0.6, 0.3]]
    costs = report.many_batch_costs(batches, window=2)
    assert costs == {
        "window_batches": 2,
        "first_s_per_batch": 0.5,
        "first_function_s": 0.4,
        "first_sink_s": 0.1,
        "last_s_per_batch": 0.75,
        "last_function_s": 0.6,
        "last_sink_s": 0.3,
        "growth_pct": 50.0,
    }
    assert report.many_batch_costs(batches[:2]) == {}  # one steady batch: nothing to compare
    # With the engine's step timings (rows 6 and 14): the sink's log reads at the start and
    # the end, apart from the write; here the check stays flat and the read-back doubles.
    timed = [
        [*b, None, None, {"check": 0.1, "read_back": back, "commit": 0.3, "materialize": 0.2}]
        for b, back in zip(batches, (0.1, 0.1, 0.1, 0.2, 0.2), strict=True)
    ]
    costs = report.many_batch_costs(timed, window=2)
    assert (costs["first_log_read_s"], costs["last_log_read_s"]) == (0.2, 0.3)
    assert (costs["first_check_s"], costs["last_check_s"]) == (0.1, 0.1)
    assert (costs["first_write_s"], costs["last_write_s"]) == (0.2, 0.1)
    assert costs["log_read_growth_pct"] == 50.0
    assert "the sink's log reads 0.200 -> 0.300 s (+50.0%" in report.many_batch_text(
        rows.Row(0, "many", 400, 100, extra=costs)
    )


def test_a_steady_batch_splits_into_the_engines_own_steps() -> None:
    # Batch records as spark_run.BATCH: the steps are the engine's progress record's; the
    # first batch (start-up) is left out, a batch the engine did not time gives nothing.
    steps = {"plan": 0.01, "check": 0.12, "materialize": 1.0, "commit": 1.5, "read_back": 0.1}
    batches = [[1.0, 5, 9.0, 8.0, None, None, {"check": 9.0}]]
    batches += [[2.0, 5, 2.7, 1.5, None, None, steps], [3.0, 5, 2.7, 1.5, None, None, steps]]
    assert rows.step_split(batches) == {
        "steady_check_s": 0.12,
        "steady_read_back_s": 0.1,
        "steady_log_read_s": 0.22,
        "steady_write_s": 1.4,
        "steady_materialize_s": 1.0,
        "steady_timed_batches": 2,
    }
    assert rows.step_split([b[:6] for b in batches]) == {}
    assert rows.step_split([[*b[:6], None] for b in batches]) == {}


def test_fits_come_from_the_sweep_rows_of_each_partition_count() -> None:
    results = report.Results(cli.parse_args(["--records", "1000"]))
    for partitions, fixed in ((4, 0.5), (16, 1.0)):
        for size in (10_000, 100_000):
            results.sweep.append(
                rows.Row(
                    0, "sweep", 1, size, partitions=partitions, verified=True,
                    extra={"steady_records_per_batch": size,
                           "steady_s_per_batch": fixed + size * 3e-6},
                )
            )  # fmt: skip
    fits = report.fits(results)
    assert sorted(fits) == [4, 16]
    assert fits[4].fixed_s == pytest.approx(0.5) and fits[16].fixed_s == pytest.approx(1.0)
    assert fits[4].us_per_record == pytest.approx(3.0)


ALLOCATE = (
    "import sys, time; b = bytearray({mb} * 2**20); {after}; print('ready', flush=True); "
    "sys.stdin.readline()"
)


def _holding(mb: int, after: str = "pass") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", ALLOCATE.format(mb=mb, after=after)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=30)


def test_peak_memory_of_the_tree_counts_every_process() -> None:
    # A parent that starts a child holding ~150 MB: the parent alone stays small.
    code = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        "'import time; b = bytearray(150 * 2**20); time.sleep(1.5)'])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = memory.TreeSampler(proc.pid, interval_s=0.05, rescan_s=0.05)
    sampler.start()
    proc.wait(timeout=30)
    sampler.stop()
    assert sampler.peak_rss_mb > 150


def test_driver_memory_is_one_process_and_its_peak_can_be_restarted() -> None:
    # This process is the "driver": the 150 MB its child holds are not counted.
    before = memory.status_mb(os.getpid(), "VmHWM")
    child = _holding(150)
    try:
        assert before is not None
        assert memory.status_mb(os.getpid(), "VmRSS") < before + 50  # type: ignore[operator]
        assert memory.status_mb(child.pid, "VmRSS") > 150  # type: ignore[operator]
    finally:
        _release(child)
    # A process that held 200 MB and freed them: its peak says 200 until reset.
    freed = _holding(200, after="del b")
    try:
        assert memory.status_mb(freed.pid, "VmHWM") > 200  # type: ignore[operator]
        assert memory.status_mb(freed.pid, "VmRSS") < 100  # type: ignore[operator]
        if not memory.reset_peak(freed.pid):
            pytest.skip("this kernel refuses to reset VmHWM (/proc/<pid>/clear_refs)")
        assert memory.status_mb(freed.pid, "VmHWM") < 100  # type: ignore[operator]
    finally:
        _release(freed)
    assert memory.status_mb(freed.pid, "VmRSS") is None  # gone


def test_memory_drift_and_peak_ratio() -> None:
    moved = memory.drift([None, 200.0, 205.0, 210.0])
    assert moved is not None
    assert (moved.first_mb, moved.last_mb, moved.batches) == (200.0, 210.0, 3)
    assert moved.growth_pct == pytest.approx(5.0)
    assert memory.drift([200.0]) is None
    assert memory.peak_ratio({50_000: 400.0, 1_000_000: 440.0}) == pytest.approx(1.1)
    assert math.isnan(memory.peak_ratio({50_000: 400.0}))
    assert math.isnan(memory.peak_ratio({50_000: 400.0, 1_000_000: None}))


def test_startup_phases_come_from_the_log_lines() -> None:
    t0 = startup.log_time("2026-01-02 10:00:00,000")
    log = [
        "2026-01-02 10:00:05,500 INFO bench: spark session ready",
        "Some JVM warning without a time",
        "2026-01-02 10:00:07,000 INFO orders_stream.pipeline: no offsets of pipeline 'x'",
        "2026-01-02 10:00:13,250 INFO bench: stream started",
        "2026-01-02 10:00:20,000 INFO orders_stream.pipeline: batch=0 records=1500 "
        "records_per_s=300 delta_version=0",
        "2026-01-02 10:00:22,000 INFO orders_stream.pipeline: batch=1 records=1500",
    ]
    assert startup.phases(log, t0) == {
        "spark session": 5.5,
        "stream set-up": 7.75,
        "first batch": 6.75,
    }
    # A phase the log does not announce: its time counts in the next one found.
    assert startup.phases([log[0], log[4]], t0) == {"spark session": 5.5, "first batch": 14.5}
    # Lines that merely mention a phase announce nothing; another progress-line wording does.
    other = [
        "2026-01-02 10:00:01,000 INFO x.pipeline: stop requested before the query started: no",
        "2026-01-02 10:00:02,000 INFO x.pipeline: replayed batch 0: nothing written records_read=5",
        "2026-01-02 10:00:03,000 INFO x.pipeline: batch=1 records_read=5 rows_written=5",
    ]
    assert startup.phases(other, t0) == {"first batch": 3.0}
    assert startup.column("stream set-up") == "startup_stream_set_up_s"


def _results(args: list[str]) -> report.Results:
    results = report.Results(cli.parse_args(args))
    for number, rps in ((1, 400_000.0), (3, 150_000.0), (4, 90_000.0), (5, 92_000.0)):
        results.rows.append(
            rows.Row(number, f"row {number}", 20_000, 4_000, rps=rps, partitions=4, verified=True)
        )
    results.rows[2].startup_s = 12.34
    return results


def test_last_line_reports_every_figure_and_nan_for_what_was_not_measured() -> None:
    results = _results(["--records", "20000"])
    assert report.last_line(results) == (
        "bench: pipeline_rps=90000 simple_ingest_rps=150000 ratio_to_simple=0.6000 "
        "batch_fixed_s=nan us_per_record=nan startup_s=12.3 overhead_pct=2.17 "
        "driver_rss_ratio=nan delta_spark_rps=nan delta_spark_to_plain=nan "
        "avro_ratio_to_simple=nan pipeline_to_ceiling=nan startup_over_floor_s=nan "
        "fixed_over_floor_s=nan two_tables_to_two_pipelines=nan fixed_over_python_floor_s=nan "
        "delta_spark_to_stream=nan delta_spark_to_foreach_batch=nan cluster_to_stream=nan "
        "delta_spark_log_read_s=nan"
    )
    results.rows.append(rows.Row(6, "delta-spark", 20_000, skipped="skipped: no jars"))
    for size, fixed in ((10_000, 0.61), (100_000, 0.61)):
        results.sweep.append(
            rows.Row(
                0, "sweep", 1, size, partitions=4, verified=True,
                extra={"steady_records_per_batch": size,
                       "steady_s_per_batch": fixed + size * 2.8e-6},
            )
        )  # fmt: skip
    for size, peak in ((50_000, 400.0), (1_000_000, 420.0)):
        results.memory.append(rows.Row(0, "rss", 1, size, extra={"driver_peak_mb": peak}))
    assert report.last_line(results).endswith(
        "batch_fixed_s=0.610 us_per_record=2.80 startup_s=12.3 overhead_pct=2.17 "
        "driver_rss_ratio=1.050 delta_spark_rps=nan delta_spark_to_plain=nan "
        "avro_ratio_to_simple=nan pipeline_to_ceiling=nan startup_over_floor_s=nan "
        "fixed_over_floor_s=nan two_tables_to_two_pipelines=nan fixed_over_python_floor_s=nan "
        "delta_spark_to_stream=nan delta_spark_to_foreach_batch=nan cluster_to_stream=nan "
        "delta_spark_log_read_s=nan"
    )
    results.rows[-1] = rows.Row(6, "delta-spark", 20_000, rps=30_000.0, verified=True)
    assert "delta_spark_rps=30000 delta_spark_to_plain=nan avro_ratio_to_simple=nan " in (
        report.last_line(results)
    )
    results.rows.append(rows.Row(7, "plain foreachBatch", 20_000, rps=40_000.0, verified=True))
    assert "delta_spark_rps=30000 delta_spark_to_plain=0.7500 avro_ratio_to_simple=nan " in (
        report.last_line(results)
    )
    results.rows += [
        rows.Row(8, "avro pipeline", 20_000, rps=60_000.0, verified=True),
        rows.Row(9, "avro simple", 20_000, rps=80_000.0, verified=True),
    ]
    assert "avro_ratio_to_simple=0.7500 " in report.last_line(results)
    # Row 10 (the ceiling) and Spark's floor, taken in its process: the pipeline against them.
    floor = {
        "floor_first_batch_s": 10.04,
        "floor_batch_s": 0.3,
        "floor_batch_python_write_s": 0.45,
    }
    results.rows.append(rows.Row(10, "ceiling", 20_000, rps=120_000.0, verified=True, extra=floor))
    assert (
        "pipeline_to_ceiling=0.7500 startup_over_floor_s=2.3 fixed_over_floor_s=0.310 "
        "two_tables_to_two_pipelines=nan fixed_over_python_floor_s=0.160 "
    ) in report.last_line(results)
    # Row 11: a record's cost in one pipeline into two tables over its cost in the two
    # single-table pipelines that read it twice, (1/150k) / (1/200k + 1/400k) = 0.8889.
    pipelines = {"all_pipeline_rps": 200_000.0, "paid_pipeline_rps": 400_000.0}
    results.rows.append(rows.Row(11, "two tables", 20_000, rps=150_000.0, verified=True))
    results.rows[-1].extra.update(pipelines)
    assert " two_tables_to_two_pipelines=0.8889 fixed_over_python_floor_s=0.160 " in (
        report.last_line(results)
    )


def test_csv_and_chart_hold_the_main_rows_the_sweep_and_its_fits(tmp_path: Path) -> None:
    results = _results(["--records", "20000"])
    args = results.args
    for partitions in (1, 4, 16):
        for size in args.sweep_batch_sizes:
            results.sweep.append(
                rows.Row(
                    0, "sweep", 20_000, size, rps=size * 10.0, partitions=partitions,
                    verified=True,
                    extra={"steady_records_per_batch": size, "steady_s_per_batch": 0.1},
                )
            )  # fmt: skip
    results.rows.append(rows.Row(6, "delta-spark", 20_000, skipped="skipped: no jars"))

    chart = report.write_chart(results, tmp_path)
    table = report.write_csv(results, tmp_path)

    assert chart is not None and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(table, newline="") as f:
        lines = list(csv.DictReader(f))
    assert [r["section"] for r in lines].count("sweep") == 3 * len(args.sweep_batch_sizes)
    assert {r["partitions"] for r in lines if r["section"] == "sweep"} == {"1", "4", "16"}
    assert {r["partitions"] for r in lines if r["section"] == "fit"} == {"1", "4", "16"}
    skipped = next(r for r in lines if r["row"] == "6")
    assert (skipped["verified"], skipped["note"]) == ("skipped", "skipped: no jars")


def test_options_refuse_rows_that_do_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--rows", "4,17"])
    assert "no row [17]" in capsys.readouterr().err
    # Rows 15 (a standalone cluster) and 16 (freshness) run only when named.
    for opt_in in (15, 16):
        assert opt_in not in cli.parse_args([]).rows
        assert opt_in in cli.parse_args(["--rows", f"4,{opt_in}"]).rows
    with pytest.raises(SystemExit):
        cli.parse_args(["--floor-batches", "9"])
    assert "--floor-batches must be at least 10" in capsys.readouterr().err
    assert cli.parse_args(["--rss-batch-sizes", "1000000,50000"]).rss_batch_sizes == [
        50_000,
        1_000_000,
    ]


def test_delta_jars_default_honours_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.JARS_ENV, "/some/jars")
    assert cli.parse_args([]).delta_jars == "/some/jars"
    monkeypatch.delenv(cli.JARS_ENV)
    # Without it, the jars scripts/bootstrap fetched through Maven (none in an empty cache).
    from kafka_delta_dev.connector_jars import local_folder

    assert cli.default_delta_jars() == local_folder()[0]
    monkeypatch.setenv("KAFKA_DELTA_JAR_CACHE", "/nonexistent/cache")
    assert cli.default_delta_jars() is None


# -- row 16, freshness --------------------------------------------------------------------------

BATCH_TENTHS = ("batch_ms_first", "batch_ms_last")
FRESH_TINY = (
    "--rows 16 --no-sweep --no-memory --partitions 2 --freshness-rates 300 "
    "--freshness-sides A,C,D --freshness-seconds 3 --freshness-warmup 1 "
    "--freshness-compact-every 1"
).split()


def test_tiny_freshness_row_checks_each_window_record_once_on_each_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row 16's mechanics, CI-sized: a steady producer, a window after warm-up, every window
    record found once in the side's table with its freshness; sides C (Spark's own kafka source
    and Delta sink) and D (the same read, foreachBatch's idempotent appends) need the connector
    jars, and say so without them. B runs A's worker on the
    cluster engine: not repeated here."""
    monkeypatch.setenv("SPARK_CLASS_ARCHIVE", "off")  # no first run recording one: seconds
    result, figures = _bench(FRESH_TINY, tmp_path, timeout=600)
    assert math.isnan(figures["pipeline"])  # no main row ran
    assert "freshness: Kafka timestamp -> its commit visible in _delta_log" in result.stdout
    with open(tmp_path / "freshness.csv", newline="") as f:
        rows = {r["side"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"A", "C", "D"}
    jars = cli.default_delta_jars()
    for side, row in rows.items():
        if side in ("C", "D") and not jars:
            assert "no delta-spark jars" in row["note"], row
            continue
        records = int(row["records"])
        assert 600 <= records <= 1200, row  # 3 s at 300 records/s, give or take a tick
        assert int(row["lost"]) == int(row["doubled"]) == 0, row
        assert 0 < float(row["p50_s"]) <= float(row["p99_s"]) <= float(row["max_s"]), row
        assert int(row["batches"]) >= 1 and float(row["tail_s"]) >= 0, row
        assert float(row["triggerExecution"]) > 0, row  # Spark's timings of the window batches
        # The table's live files, counted through the window, and the batch's cost at the
        # window's start against its end.
        assert 0 < int(row["files_end"]) <= int(row["files_max"]), row
        assert int(row["files_on_disk"]) >= int(row["files_end"]), row
        # (A tenth of a 3 s window may hold no batch's end: then nan.)
        assert all(float(row[k]) > 0 or row[k] == "nan" for k in BATCH_TENTHS), row
    # A ran its own compaction (--freshness-compact-every); C and D, hand-written, have none.
    # D's appends carry its txn: Spark's floor with the pipeline's guarantee.
    if jars:
        d = DeltaTable(str(tmp_path / "tables" / "16-fresh-D-r300"))
        assert {c.get("operation") for c in d.history()} == {"WRITE"}, d.history()
        assert d.transaction_version("fresh-fresh-d-r300") is not None
    history = DeltaTable(str(tmp_path / "tables" / "16-fresh-A-r300")).history()
    assert "OPTIMIZE" in {str(c.get("operation")).upper() for c in history}, history
    # A's batch function, step by step (the engine's own steps, timed from outside).
    a = rows["A"]
    for step in ("fn_function", "fn_write", "fn_commit", "fn_report"):
        assert float(a[step]) > 0, a
    assert float(a["fn_function"]) >= float(a["fn_write"]) + float(a["fn_commit"]), a


def test_freshness_counts_each_window_record_once_and_takes_the_nearest_rank() -> None:
    np = pytest.importorskip("numpy")
    # ids 10..14 are the window; 12 is there twice, 13 is missing, 99 is outside.
    seen = visibility.Visible(
        ids=np.array([10, 11, 12, 12, 14, 99]),
        kafka_ts=np.array([1.0, 1.0, 2.0, 2.0, 3.0, 0.0]),
        visible_at=np.array([2.0, 3.0, 3.0, 4.0, 7.0, 9.0]),
        commit_times=np.array([2.0, 3.0, 4.0, 7.0, 9.0]),
    )
    r = visibility.freshness(seen, 10, 15)
    assert (r.records, r.seen, r.lost, r.doubled) == (5, 4, 1, 1)
    # Freshness of 10, 11, 12 (its first commit), 14: 1, 2, 1, 4 s.
    assert (r.p50_s, r.p99_s, r.max_s) == (1.0, 4.0, 4.0)
    assert r.batches == 4  # the commits at 2, 3, 4 and 7 hold window rows
    assert r.versions_per_hour == pytest.approx(3 / 5 * 3600)
    assert visibility.percentile(np.array([1.0, 2.0, 3.0, 4.0]), 50) == 2.0
    assert math.isnan(visibility.percentile(np.array([]), 99))


def test_the_window_is_committed_once_the_checkpoints_last_batch_covers_its_ends(
    tmp_path: Path,
) -> None:
    assert visibility.latest_committed_ends(tmp_path) is None
    for folder in ("offsets", "commits"):
        (tmp_path / folder).mkdir()
    metadata = '{"batchWatermarkMs":0,"batchTimestampMs":1}'
    (tmp_path / "offsets" / "0").write_text(f'v1\n{metadata}\n{{"t":{{"0":5,"1":7}}}}\n')
    (tmp_path / "offsets" / "1").write_text(f'v1\n{metadata}\n{{"t":{{"0":9,"1":7}}}}\n')
    (tmp_path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    # Batch 1 is planned, not committed: batch 0's ends are what the table is known to hold.
    assert visibility.latest_committed_ends(tmp_path) == {"t": {0: 5, 1: 7}}
    assert not visibility.covers({"t": {0: 5, 1: 7}}, {"t": {0: 6, 1: 7}})
    (tmp_path / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    assert visibility.covers(visibility.latest_committed_ends(tmp_path), {"t": {0: 6, 1: 7}})


def test_a_record_is_visible_from_the_commit_that_added_it_never_from_a_compaction(
    tmp_path: Path,
) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    actions = [
        [{"add": {"path": "a.parquet", "dataChange": True}}],
        [
            {"commitInfo": {"operation": "OPTIMIZE"}},
            {"add": {"path": "b%20c.parquet", "dataChange": False}},
        ],
        [{"add": {"path": "d.parquet", "dataChange": True}}, {"txn": {"appId": "x", "version": 1}}],
    ]
    for version, lines in enumerate(actions):
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in lines) + "\n")
    commits = visibility.data_commits(tmp_path)
    assert [(c.version, c.files) for c in commits] == [
        (0, (str(tmp_path / "a.parquet"),)),
        (2, (str(tmp_path / "d.parquet"),)),
    ]
