"""What a run prints and writes: the table, the derived figures (fits, memory, start-up), the
CSV, the chart, and the machine-checkable last line."""

from __future__ import annotations

import argparse
import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import memory
from .rows import REPEATED, TIME_SPLIT, Row, step_split, summary_rows
from .startup import PHASES, column
from .sweep import FIT_PARTITIONS, Fit, fit_batch_cost

NAN = float("nan")
# The last line's figures, in order, with their formats (nan: not measured by this run).
HEADLINE = {
    "pipeline_rps": "{:.0f}",
    "simple_ingest_rps": "{:.0f}",
    "ratio_to_simple": "{:.4f}",
    "batch_fixed_s": "{:.3f}",
    "us_per_record": "{:.2f}",
    "startup_s": "{:.1f}",
    "overhead_pct": "{:.2f}",
    "driver_rss_ratio": "{:.3f}",
    "delta_spark_rps": "{:.0f}",
    "delta_spark_to_plain": "{:.4f}",
    "avro_ratio_to_simple": "{:.4f}",
    "pipeline_to_ceiling": "{:.4f}",
    "startup_over_floor_s": "{:.1f}",
    "fixed_over_floor_s": "{:.3f}",
    "two_tables_to_two_pipelines": "{:.4f}",
    "fixed_over_python_floor_s": "{:.3f}",
    "delta_spark_to_stream": "{:.4f}",
    "delta_spark_to_foreach_batch": "{:.4f}",
    "cluster_to_stream": "{:.4f}",
    "delta_spark_log_read_s": "{:.4f}",
}


def say(message: str) -> None:
    print(message, flush=True)


@dataclass
class Results:
    args: argparse.Namespace
    rows: list[Row] = field(default_factory=list)  # the main rows, repeats included
    sweep: list[Row] = field(default_factory=list)
    memory: list[Row] = field(default_factory=list)  # RSS points, then the many-batch run
    scale: list[Row] = field(default_factory=list)  # --many-batches
    problems: list[str] = field(default_factory=list)
    class_archive: str = ""  # the JVM class archive the Spark runs started from, if any
    broker: str = "Apache Kafka"  # what served the topics (the stand-in where Kafka's jars lack)


# -- derived figures ------------------------------------------------------------------------


def fits(results: Results) -> dict[int, Fit]:
    """Per partition count: the line through the sweep's (records per batch, s per batch)."""
    out = {}
    for partitions in sorted({r.partitions for r in results.sweep}):
        points = [
            (r.extra["steady_records_per_batch"], r.extra["steady_s_per_batch"])
            for r in results.sweep
            if r.partitions == partitions and "steady_s_per_batch" in r.extra and r.verified
        ]
        fit = fit_batch_cost(partitions, points)
        if fit is not None:
            out[partitions] = fit
    return out


def _rps(rows: dict[int, Row], number: int) -> float:
    row = rows.get(number)
    return row.rps if row is not None and not row.skipped and row.rps > 0 else NAN


def headline(results: Results) -> dict[str, float]:
    """The last line's figures; nan for what this run did not measure."""
    rows = {r.number: r for r in summary_rows(results.rows)}
    pipeline, simple, off = _rps(rows, 4), _rps(rows, 3), _rps(rows, 5)
    fit = fits(results).get(FIT_PARTITIONS)
    startup = rows[4].startup_s if 4 in rows and rows[4].startup_s is not None else NAN
    peaks = {
        r.batch_size: r.extra.get("driver_peak_mb")
        for r in results.memory
        if r.batch_size and "driver_peak_mb" in r.extra
    }
    floor = rows[10].extra if 10 in rows else {}
    fixed = fit.fixed_s if fit else NAN
    return {
        "pipeline_rps": pipeline,
        "simple_ingest_rps": simple,
        "ratio_to_simple": pipeline / simple,
        "batch_fixed_s": fixed,
        "us_per_record": fit.us_per_record if fit else NAN,
        "startup_s": startup,
        "overhead_pct": (off - pipeline) / off * 100,
        "driver_rss_ratio": memory.peak_ratio(peaks),
        "delta_spark_rps": _rps(rows, 6),
        "delta_spark_to_plain": _rps(rows, 6) / _rps(rows, 7),
        "avro_ratio_to_simple": _rps(rows, 8) / _rps(rows, 9),
        "pipeline_to_ceiling": pipeline / _rps(rows, 10),
        "startup_over_floor_s": startup - floor.get("floor_first_batch_s", NAN),
        "fixed_over_floor_s": fixed - floor.get("floor_batch_s", NAN),
        "two_tables_to_two_pipelines": two_tables_to_two_pipelines(rows),
        "fixed_over_python_floor_s": fixed - floor.get("floor_batch_python_write_s", NAN),
        "delta_spark_to_stream": _rps(rows, 6) / _rps(rows, 12),
        "delta_spark_to_foreach_batch": _rps(rows, 6) / _rps(rows, 13),
        "cluster_to_stream": _rps(rows, 14) / _rps(rows, 12),
        "delta_spark_log_read_s": _extra(rows, 6, "steady_log_read_s"),
    }


def _extra(rows: dict[int, Row], number: int, key: str) -> float:
    row = rows.get(number)
    value = row.extra.get(key) if row is not None and not row.skipped else None
    return float(value) if isinstance(value, int | float) else NAN


def two_tables_to_two_pipelines(rows: dict[int, Row]) -> float:
    """Row 11's ratio: what a record costs (steady seconds per record) in one pipeline writing
    two tables, over what it costs in the two single-table pipelines that fill the same tables,
    each reading it (every event; the paid orders alone), in the same session: below 1, the one
    read is cheaper."""
    fan_out = _rps(rows, 11)
    extra = rows[11].extra if 11 in rows else {}
    every, paid = extra.get("all_pipeline_rps") or NAN, extra.get("paid_pipeline_rps") or NAN
    if math.isnan(fan_out) or every <= 0 or paid <= 0:
        return NAN
    return (1 / fan_out) / (1 / every + 1 / paid)


def floor_text(row: Row) -> str:
    """Spark's floor as row 10's process measured it (see :func:`.spark_run.work_ceiling`)."""
    x = row.extra
    return (
        f"session {x['floor_session_s']:.1f}s, first batch {x['floor_first_batch_s']:.1f}s from "
        f"the process start, then {x['floor_batch_s']:.3f}s per batch "
        f"({x['floor_batch_no_job_s']:.3f}s with no job, "
        f"{x['floor_batch_python_write_s']:.3f}s handed to Python tasks)"
    )


def last_line(results: Results) -> str:
    figures = headline(results)
    return "bench: " + " ".join(
        f"{key}={'nan' if math.isnan(figures[key]) else form.format(figures[key])}"
        for key, form in HEADLINE.items()
    )


# -- the table ------------------------------------------------------------------------------


def print_table(results: Results) -> None:
    a = results.args
    rows = summary_rows(results.rows)
    simple = next((r.rps for r in rows if r.number == 3 and r.rps > 0), 0.0)
    say("")
    say(
        f"{a.records:,} JSON events (~75 bytes) over {a.partitions} partitions, batch "
        f"{a.batch_size:,} records, {os.cpu_count()} cores, Spark {a.spark_master}, "
        f"one {results.broker} broker on 127.0.0.1"
    )
    header = (
        f"{'#':>2}  {'run':<54}{'records/s':>11}{'x simple':>9}{'wall s':>8}{'start-up s':>11}"
        f"{'driver MB':>10}{'JVM MB':>8}{'tree MB':>9}{'batches':>8}  table / check"
    )
    say(header)
    say("-" * len(header))
    for r in rows:
        if r.skipped:
            say(f"{r.number:>2}  {r.name:<54}{'-':>11}  {r.skipped}")
            continue
        say(
            f"{r.number:>2}  {r.name:<54}{r.rps:>11,.0f}"
            f"{(f'{r.rps / simple:.2f}' if simple else '-'):>9}{r.wall_s:>8.1f}"
            f"{_fmt(r.startup_s, '{:.1f}'):>11}{_fmt(r.extra.get('driver_peak_mb'), '{:,.0f}'):>10}"
            f"{_fmt(r.extra.get('jvm_peak_mb'), '{:,.0f}'):>8}{r.peak_rss_mb:>9,.0f}"
            f"{(r.batches or '-'):>8}  {r.check}"
        )
    for r in rows:
        split = {k: r.extra.get(k) for k in TIME_SPLIT}
        total = sum(v for v in split.values() if v)
        if r.number >= min(REPEATED) and total > 0:
            say(
                f"row {r.number} steady batches, where the time goes: "
                + ", ".join(
                    f"{label} {(split[key] or 0) / total:.0%}" for key, label in TIME_SPLIT.items()
                )
                + f" (of {total:.1f}s)"
            )
        phases = {p: r.extra[column(p)] for p, _ in PHASES if column(p) in r.extra}
        if phases and r.startup_s is not None:
            say(
                f"row {r.number} start-up {r.startup_s:.1f}s: "
                + ", ".join(f"{p} {s:.1f}s" for p, s in phases.items())
            )
    for r in rows:
        if "steady_log_read_s" in r.extra:
            x = r.extra
            say(
                f"row {r.number} steady batch, the engine's own step timings: the sink's log "
                f"reads {x['steady_log_read_s']:.3f}s (check {x['steady_check_s']:.3f}s + "
                f"read-back {x['steady_read_back_s']:.3f}s), the Delta write "
                f"{x['steady_write_s']:.3f}s, materializing {x['steady_materialize_s']:.3f}s "
                f"(mean of {x['steady_timed_batches']:.0f})"
            )
    by_number = {r.number: r for r in rows}
    hand = {n: _rps(by_number, n) for n in (12, 13)}
    if any(not math.isnan(v) for v in hand.values()):
        said = [
            f"row {n} / row {h} {_rps(by_number, n) / hand[h]:.2f}"
            for n in (6, 14)
            for h in (12, 13)
            if not math.isnan(_rps(by_number, n) / hand[h])
        ]
        if said:
            say("against hand-written Structured Streaming (rows 12, 13): " + ", ".join(said))
    fan_out = by_number.get(11)
    if fan_out is not None and fan_out.measured:
        x = fan_out.extra
        say(
            f"row 11: two tables from one read {fan_out.rps:,.0f} records/s; two single-table "
            f"pipelines reading the topic twice: {x['all_pipeline_rps']:,.0f} (every event) and "
            f"{x['paid_pipeline_rps']:,.0f} (the paid orders alone) records/s; a record's cost, "
            f"one read over two: {two_tables_to_two_pipelines(by_number):.2f}"
        )
    for r in rows:
        if "floor_batch_s" in r.extra:
            where = f"scripts/spark_floor, first in row {r.number}'s process"
            say(f"Spark's floor ({where}): {floor_text(r)}")
    if results.class_archive:
        say(f"JVM class archive: {results.class_archive}")
    notes = [f"{r.number}: {r.note}" for r in rows if r.note]
    if notes:
        say("notes: " + "; ".join(notes))
    _print_fits(results)
    _print_scale(results)
    _print_memory(results)
    say(
        "records/s: steady state, from the first committed batch to the end (row 1: from "
        "creating the consumers); start-up: process start to first committed batch (row 2: "
        "from rows ready); driver MB: peak RSS (VmHWM) of the pipeline's Python driver process, "
        "JVM MB: of the JVM it started (in local mode it also runs the tasks); tree MB: sampled "
        "peak of the whole process tree."
    )


def many_batch_costs(batches: list[list[float]], window: int = 100) -> dict[str, float]:
    """A long run's steady batches at its start and at its end (``window`` each, fewer when
    the run is short): seconds per batch commit to commit, in the batch function, and of that
    in the Delta sink; where the engine timed its steps (:func:`.rows.step_split`), the sink's
    log reads (check + read-back) and the Delta write alone; and how much the last window's
    commit-to-commit cost exceeds the first's."""
    steady = len(batches) - 1
    if steady < 2:
        return {}
    n = max(1, min(window, steady // 2))
    out: dict[str, float] = {"window_batches": n}
    for name, part in (("first", batches[: n + 1]), ("last", batches[-(n + 1) :])):
        out[f"{name}_s_per_batch"] = round((part[-1][0] - part[0][0]) / n, 4)
        out[f"{name}_function_s"] = round(sum(b[2] for b in part[1:]) / n, 4)
        out[f"{name}_sink_s"] = round(sum(b[3] for b in part[1:]) / n, 4)
        # step_split leaves out the first batch of what it is given: here, the window's
        # batch before its first.
        steps = step_split(part)
        for key in ("check", "read_back", "log_read", "write"):
            if f"steady_{key}_s" in steps:
                out[f"{name}_{key}_s"] = steps[f"steady_{key}_s"]
    out["growth_pct"] = round((out["last_s_per_batch"] / out["first_s_per_batch"] - 1) * 100, 1)
    if "first_log_read_s" in out and "last_log_read_s" in out and out["first_log_read_s"] > 0:
        out["log_read_growth_pct"] = round(
            (out["last_log_read_s"] / out["first_log_read_s"] - 1) * 100, 1
        )
    return out


def many_batch_text(r: Row) -> str:
    x = r.extra
    if "first_s_per_batch" not in x:
        return f"{r.name}: too few batches to compare"
    reads = (
        f"; the sink's log reads {x['first_log_read_s']:.3f} -> {x['last_log_read_s']:.3f} s "
        f"({x['log_read_growth_pct']:+.1f}%: check {x['first_check_s']:.3f} -> "
        f"{x['last_check_s']:.3f}, read-back {x['first_read_back_s']:.3f} -> "
        f"{x['last_read_back_s']:.3f}), the Delta write {x['first_write_s']:.3f} -> "
        f"{x['last_write_s']:.3f} s"
        if "log_read_growth_pct" in x
        else ""
    )
    return (
        f"{r.name}: {x['first_s_per_batch']:.3f} s/batch over its first {x['window_batches']:.0f}"
        f" steady batches, {x['last_s_per_batch']:.3f} over its last ({x['growth_pct']:+.1f}%; "
        f"batch function {x['first_function_s']:.3f} -> {x['last_function_s']:.3f} s, of which "
        f"sink {x['first_sink_s']:.3f} -> {x['last_sink_s']:.3f} s{reads}); table versions "
        f"{_fmt(x.get('table_versions'), '{:,}')}"
    )


def _print_scale(results: Results) -> None:
    """The per-batch cost by partition count at the smallest sweep batch size (the wide point,
    over many topics, among them), and the long run's per-batch cost at its start and end."""
    if any(r.extra.get("topics", 1) > 1 for r in results.sweep):
        size = min(r.batch_size or 0 for r in results.sweep)
        costs = [
            f"p={r.partitions}"
            + (f" over {r.extra['topics']} topics" if r.extra.get("topics", 1) > 1 else "")
            + f": {r.extra['steady_s_per_batch']:.3f}s"
            for r in sorted(results.sweep, key=lambda r: r.partitions)
            if r.batch_size == size and "steady_s_per_batch" in r.extra
        ]
        say(f"per-batch cost at {size:,}-record batches, by partitions: " + ", ".join(costs))
    for r in results.scale:
        say(many_batch_text(r))


def _print_fits(results: Results) -> None:
    for partitions, fit in fits(results).items():
        marginal = (
            f"~{fit.marginal_rps:,.0f} records/s marginal"
            if fit.us_per_record > 0
            else "a slope that is not positive: the points are noise, not a cost"
        )
        say(
            f"sweep fit, {partitions} partition{'s' if partitions > 1 else ''}: batch fixed cost "
            f"{fit.fixed_s:.3f}s + {fit.us_per_record:.2f} us/record ({marginal}), least "
            f"squares over {fit.points} points"
        )


def _print_memory(results: Results) -> None:
    peaks = {
        r.batch_size: r.extra.get("driver_peak_mb")
        for r in results.memory
        if "driver_peak_mb" in r.extra
    }
    if peaks:
        say(
            "driver peak RSS (Python driver): "
            + ", ".join(
                f"{_fmt(v, '{:,.0f}')} MB at {s:,}-record batches" for s, v in peaks.items()
            )
            + f"; ratio {memory.peak_ratio(peaks):.3f}"
        )
    for r in results.memory:
        if "driver_rss_first_mb" in r.extra:
            say(
                f"driver RSS over {r.batches} batches of {r.batch_size:,}: Python "
                f"{r.extra['driver_rss_first_mb']:,.0f} -> {r.extra['driver_rss_last_mb']:,.0f} MB "
                f"({r.extra['driver_rss_growth_pct']:+.1f}%)"
                + (
                    f", JVM {r.extra['jvm_rss_first_mb']:,.0f} -> {r.extra['jvm_rss_last_mb']:,.0f}"
                    f" MB ({r.extra['jvm_rss_growth_pct']:+.1f}%)"
                    if "jvm_rss_first_mb" in r.extra
                    else ""
                )
                + " (after the first batch vs after the last)"
            )


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


# -- files ----------------------------------------------------------------------------------

CSV_COLUMNS = (
    "section",
    "row",
    "name",
    "repeat",
    "records",
    "partitions",
    "batch_size",
    "records_per_s",
    "busy_records_per_s",
    "wall_s",
    "startup_s",
    "peak_rss_mb",
    "batches",
    "rows_out",
    "distinct_ids",
    "verified",
    "note",
)


def write_csv(results: Results, out: Path) -> Path:
    """Every row of every section (main, sweep, memory), and one ``fit`` row per partition
    count; row-specific figures as extra columns."""
    fit_rows = [
        Row(
            0,
            f"fit p={p}",
            0,
            rps=f.marginal_rps,
            partitions=p,
            verified=True,
            extra={
                "batch_fixed_s": round(f.fixed_s, 4),
                "us_per_record": round(f.us_per_record, 3),
                "fit_points": f.points,
            },
        )
        for p, f in fits(results).items()
    ]
    sections = (
        ("main", results.rows),
        ("sweep", results.sweep),
        ("fit", fit_rows),
        ("memory", results.memory),
        ("scale", results.scale),
    )
    extra_keys = sorted({k for _, rows in sections for r in rows for k in r.extra})
    path = out / "bench.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*CSV_COLUMNS, *extra_keys])
        for section, rows in sections:
            for r in rows:
                writer.writerow(
                    [
                        section,
                        r.number or "",
                        r.name,
                        r.repeat,
                        r.records,
                        r.partitions,
                        r.batch_size or "",
                        round(r.rps, 1),
                        "" if r.busy_rps is None else round(r.busy_rps, 1),
                        round(r.wall_s, 3),
                        "" if r.startup_s is None else round(r.startup_s, 3),
                        round(r.peak_rss_mb, 1) if r.peak_rss_mb else "",
                        r.batches,
                        r.rows_out,
                        "" if r.distinct_ids is None else r.distinct_ids,
                        "skipped" if r.skipped else r.verified,
                        r.skipped or r.note,
                        *[r.extra.get(k, "") for k in extra_keys],
                    ]
                )
    return path


def write_chart(results: Results, out: Path) -> Path | None:
    if not results.sweep and not results.rows:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator
    except ImportError:
        say("    (matplotlib is not installed: no chart)")
        return None
    a = results.args
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for partitions in sorted({r.partitions for r in results.sweep}):
        points = sorted(
            (r.batch_size or 0, r.rps) for r in results.sweep if r.partitions == partitions
        )
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            label=f"pipeline, {partitions} partition{'s' if partitions > 1 else ''}",
        )
    summary = {r.number: r for r in summary_rows(results.rows) if r.rps > 0 and not r.skipped}
    styles = {1: ("raw consume limit", "k", "--"), 3: ("simple ingest", "tab:gray", ":")}
    for number, (label, color, style) in styles.items():
        if number in summary:
            ax.axhline(summary[number].rps, color=color, linestyle=style, label=label)
    for number, marker, color, label in (
        (4, "*", "tab:red", "pipeline row 4, delta-rs"),
        (6, "D", "tab:purple", "pipeline row 6, delta-spark"),
    ):
        if number in summary:
            ax.plot(
                [summary[number].batch_size],
                [summary[number].rps],
                marker=marker,
                markersize=14 if marker == "*" else 9,
                color=color,
                linestyle="none",
                label=f"{label} ({a.partitions} partitions)",
            )
    ax.set_xscale("log")
    sizes = sorted({r.batch_size for r in results.sweep if r.batch_size}) or [a.batch_size]
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
    ax.set_xlabel("batch size (max_records_per_trigger, records)")
    plotted = [r.rps for r in results.sweep if r.rps > 0] + [r.rps for r in summary.values()]
    if plotted and max(plotted) > 10 * min(plotted):
        # The limits sit far above the pipeline: a log scale keeps both readable.
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("records/s (steady state, log scale)")
    else:
        ax.set_ylim(bottom=0)
        ax.set_ylabel("records/s (steady state)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
    ax.set_title(f"Kafka -> Delta, {os.cpu_count()} cores, {a.sweep_records:,} records/point")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "bench.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _short(value: float) -> str:
    """10000 -> 10k, 1500000 -> 1.5M (chart ticks)."""
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:g}{suffix}"
    return f"{value:g}"
