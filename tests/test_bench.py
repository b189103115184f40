"""scripts/bench stays runnable: a tiny benchmark end to end (so it never rots), and the pieces
its figures rest on: steady-state rates, process-tree memory, sweep sizes, CSV and chart."""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAST_LINE = re.compile(
    r"^bench: pipeline_rps=(?P<pipeline>\S+) raw_consume_rps=(?P<raw>\S+) "
    r"ratio_to_raw=(?P<ratio>\S+) overhead_pct=(?P<overhead>\S+) "
    r"simple_ingest_rps=(?P<simple>\S+)$"
)


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench", REPO / "scripts" / "bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench_module()


def test_tiny_benchmark_prints_the_summary_line_and_verifies_every_row(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH"}}
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench.py"),
            "--records",
            "3000",
            "--partitions",
            "2",
            "--batch-size",
            "1000",
            "--no-sweep",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    last = result.stdout.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, f"last line has the wrong form: {last!r}"
    figures = {k: float(v) for k, v in match.groupdict().items()}
    for key in ("pipeline", "raw", "ratio", "simple"):
        assert figures[key] > 0, last
    # The exactly-once overhead is a difference of two measurements: noise may make it negative.
    assert abs(figures["overhead"]) < 100, last
    assert figures["ratio"] == pytest.approx(
        figures["pipeline"] / figures["raw"], rel=0.01, abs=1e-4
    )

    with open(tmp_path / "bench.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["section"] == "main"]
    assert sorted(int(r["row"]) for r in rows) == [1, 2, 3, 4, 5]
    for row in rows:
        assert row["verified"] == "True", row
        assert int(row["records"]) == int(row["rows_out"]) == 3000, row
        assert float(row["records_per_s"]) > 0, row
        assert float(row["peak_rss_mb"]) > 0, row
    for row in rows:
        if int(row["row"]) >= 2:  # every Delta table holds each id exactly once
            assert int(row["distinct_ids"]) == 3000, row
    pipeline = next(r for r in rows if r["row"] == "4")
    assert float(pipeline["startup_s"]) > 0
    assert int(pipeline["batches"]) == 3  # 3000 records at 1000 per trigger
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Tables are removed once verified; the generated project and the logs stay for reading.
    assert not any((tmp_path / "tables").glob("*"))
    print(f"tiny benchmark took {elapsed:.0f}s")


def test_steady_rate_leaves_out_the_first_batch() -> None:
    # (commit time, rows): batch 0 took the start-up; 20 rows then took 4 seconds.
    rate, first_end = bench.steady([(10.0, 5), (12.0, 10), (14.0, 10)])
    assert first_end == 10.0
    assert rate == pytest.approx(5.0)
    assert bench.steady([]) == (0.0, None)


def test_repeated_pipeline_runs_are_summarised_by_their_medians() -> None:
    run = bench.Bench(bench.parse_args(["--repeats", "3"]))
    for repeat, (rps, startup) in enumerate(((50.0, 9.0), (70.0, 11.0), (60.0, 10.0))):
        run.rows.append(
            bench.Row(4, "pipeline", 1000, 100, rps=rps, startup_s=startup, repeat=repeat)
        )
    (row,) = run.summary_rows()
    assert (row.rps, row.startup_s) == (60.0, 10.0)
    assert "median of 3 runs" in row.note


def test_sweep_covers_10k_to_500k_at_full_size_and_shrinks_for_small_runs() -> None:
    assert bench.scaled_batch_sizes(1_000_000) == [10_000, 50_000, 100_000, 250_000, 500_000]
    small = bench.scaled_batch_sizes(20_000)
    assert small == sorted(set(small))
    assert min(small) >= 1_000  # at most ~20 batches a point
    assert max(small) <= 10_000  # at least two batches, so one is steady


def test_peak_memory_counts_the_whole_process_tree() -> None:
    # A parent that starts a child holding ~150 MB: the parent alone stays small.
    code = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        "'import time; b = bytearray(150 * 2**20); time.sleep(1.5)'])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = bench.TreeSampler(proc.pid, interval_s=0.05, rescan_s=0.05)
    sampler.start()
    proc.wait(timeout=30)
    sampler.stop()
    assert sampler.peak_rss_mb > 150


def test_csv_and_chart_hold_the_main_rows_and_the_sweep(tmp_path: Path) -> None:
    args = bench.parse_args(["--records", "20000", "--out", str(tmp_path)])
    run = bench.Bench(args)
    run.out = tmp_path
    for number, rps in ((1, 400_000.0), (3, 150_000.0), (4, 90_000.0), (5, 92_000.0)):
        run.rows.append(bench.Row(number, f"row {number}", 20_000, 4_000, rps=rps, partitions=4))
    for partitions in (1, 4, 16):
        for size in args.sweep_batch_sizes:
            run.sweep.append(
                bench.Row(0, "sweep", 20_000, size, rps=size * 10.0, partitions=partitions)
            )

    chart = run.write_chart()
    table = run.write_csv()

    assert chart is not None and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["section"] for r in rows].count("sweep") == 3 * len(args.sweep_batch_sizes)
    assert {r["partitions"] for r in rows if r["section"] == "sweep"} == {"1", "4", "16"}
    assert run.last_line() == (
        "bench: pipeline_rps=90000 raw_consume_rps=400000 ratio_to_raw=0.2250 "
        "overhead_pct=2.17 simple_ingest_rps=150000"
    )
