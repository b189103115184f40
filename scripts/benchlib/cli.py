"""The benchmark's options, parsed once into the namespace every part reads."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .freshness import add_options as add_freshness_options
from .freshness import check_options as check_freshness_options
from .rows import OPT_IN, ROW_NAMES
from .sweep import FULL_RECORDS, SWEEP_PARTITIONS, scaled_batch_sizes

REPO = Path(__file__).resolve().parents[2]
JARS_ENV = "KAFKA_DELTA_JARS"
RSS_BATCH_SIZES = (50_000, 1_000_000)


def default_batch_size(records: int) -> int:
    """Five batches: four steady ones after the first, capped at the template's 500k."""
    return max(100, min(500_000, records // 5))


def default_delta_jars() -> str | None:
    """The connector jars' folder as the engine's pytest plugin finds it: $KAFKA_DELTA_JARS, else
    the jars scripts/bootstrap resolved into the user's cache
    (kafka_delta_dev.connector_jars.local_folder); None: the delta-spark rows report that they
    have no jars (:func:`delta_jars_why` says why)."""
    return _local_jars()[0]


def delta_jars_why() -> str | None:
    """Why this machine has no connector jars, in the words a skipped row reports."""
    return _local_jars()[1]


def _local_jars() -> tuple[str | None, str | None]:
    if os.environ.get(JARS_ENV):
        return os.environ[JARS_ENV], None
    try:
        from kafka_delta_dev.connector_jars import local_folder
    except ImportError:  # the dev tools are not installed: only the variable names a folder
        return None, None
    return local_folder()


def _int_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None, description: str = "") -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=FULL_RECORDS, help="N (default 1M)")
    parser.add_argument("--partitions", type=int, default=4, help="P (default 4)")
    parser.add_argument(
        "--batch-size",
        type=int,
        help="records per batch / max_records_per_trigger (default records/5, at most 500k)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of rows 4-5 (median shown)")
    parser.add_argument(
        "--rows",
        type=_int_list,
        default=sorted(set(ROW_NAMES) - set(OPT_IN)),
        help="rows to run, e.g. 4,5 while tuning the pipeline (default 1-14; row 15, the "
        "pipeline on a two-worker standalone cluster, and row 16, freshness, only when named; "
        "the last line shows nan for what was not measured)",
    )
    parser.add_argument(
        "--floor-batches",
        type=int,
        default=40,
        help="micro-batches of each of Spark's floor queries, run with row 10 (default 40, "
        "at least 10)",
    )
    parser.add_argument(
        "--delta-jars",
        default=default_delta_jars(),
        help=f"folder of connector jars (delta-spark; Spark's kafka source for rows 12-14) for "
        f"rows 6, 7 and 12-14 (default ${JARS_ENV}, else the jars scripts/bootstrap resolved)",
    )
    parser.add_argument(
        "--jvm-fetch-max-wait-ms",
        type=int,
        help="fetch.max.wait.ms of the Java Kafka client in rows 12-14 (Spark's kafka source); "
        "default: the client's own (500). A fetch at a partition's live end waits that long for "
        "records (the stand-in Tansu holds every fetch that long, even when records wait); rows "
        "4-11 read with conf/local.yaml's fetch.wait.max.ms 100: set 100 here for the same wait "
        "in the hand-written rows",
    )
    sweep = parser.add_argument_group("sweep (batch fixed cost and marginal cost per record)")
    sweep.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the batch-size x partitions sweep (default on)",
    )
    sweep.add_argument(
        "--sweep-batch-sizes", type=_int_list, help="default 10k..500k, scaled to --sweep-records"
    )
    sweep.add_argument(
        "--sweep-partitions", type=_int_list, default=list(SWEEP_PARTITIONS), help="default 1,4,16"
    )
    sweep.add_argument("--sweep-records", type=int, help="records per sweep point (default N)")
    mem = parser.add_argument_group("driver memory")
    mem.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the driver's peak RSS per batch size, and over many batches (default on)",
    )
    mem.add_argument(
        "--rss-batch-sizes",
        type=_int_list,
        default=list(RSS_BATCH_SIZES),
        help="batch sizes whose driver peak RSS is compared (default 50000,1000000; "
        "driver_rss_ratio = largest / smallest)",
    )
    mem.add_argument("--rss-batches", type=int, default=2, help="batches per RSS point (default 2)")
    mem.add_argument(
        "--memory-batches",
        type=int,
        default=50,
        help="batches of the run that checks the driver's memory stays flat (default 50, 0: off)",
    )
    mem.add_argument(
        "--memory-batch-size", type=int, default=10_000, help="its batch size (default 10000)"
    )
    scale = parser.add_argument_group(
        "scale (off by default; each runs in the session, after the sweep)"
    )
    scale.add_argument(
        "--wide-topics",
        type=int,
        default=0,
        help="a sweep point over this many topics (e.g. 8), --wide-partitions in all, at the "
        "smallest sweep batch size and --sweep-records (default 0: none)",
    )
    scale.add_argument(
        "--wide-partitions", type=int, default=64, help="their partitions in all (default 64)"
    )
    scale.add_argument(
        "--many-batches",
        type=int,
        default=0,
        help="a run of this many small batches (e.g. 2000): the per-batch cost at its start "
        "against its end, as the table's versions grow (default 0: none)",
    )
    scale.add_argument(
        "--many-batch-size", type=int, default=100, help="their records each (default 100)"
    )
    scale.add_argument(
        "--many-batches-sink",
        choices=("delta_rs", "delta_spark", "both"),
        default="delta_rs",
        help="the sink of the --many-batches run: delta_rs (row 4's pipeline, in the session), "
        "delta_spark (row 6's, in a process of its own, with the sink's log reads at the start "
        "against the end), or both (default delta_rs)",
    )
    add_freshness_options(parser)
    parser.add_argument(
        "--consumers", type=int, default=os.cpu_count() or 1, help="row 1 processes (cores)"
    )
    parser.add_argument("--spark-master", default="local[2]", help="default local[2]")
    parser.add_argument(
        "--out", type=Path, default=REPO / ".bench", help="bench.csv, bench.png, logs/ go here"
    )
    parser.add_argument("--keep-tables", action="store_true", help="keep the Delta tables")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    args = parser.parse_args(argv)
    if args.records < 2 or args.partitions < 1 or args.repeats < 1:
        parser.error("--records must be >= 2, --partitions and --repeats >= 1")
    if unknown := sorted(set(args.rows) - set(ROW_NAMES)):
        parser.error(f"--rows: no row {unknown}; rows are {min(ROW_NAMES)}-{max(ROW_NAMES)}")
    if args.wide_topics < 0 or args.many_batches < 0 or args.many_batch_size < 1:
        parser.error("--wide-topics and --many-batches must be >= 0, --many-batch-size >= 1")
    if args.wide_topics and args.wide_partitions % args.wide_topics:
        parser.error("--wide-partitions must be a multiple of --wide-topics")
    if args.many_batches == 1:
        parser.error("--many-batches must be 0 or at least 2 (the first batch is start-up)")
    if args.floor_batches < 10:
        parser.error("--floor-batches must be at least 10 (the first five are warm-up)")
    if args.rss_batches < 1 or args.memory_batches < 0 or args.memory_batch_size < 1:
        parser.error("--rss-batches and --memory-batch-size must be >= 1, --memory-batches >= 0")
    args.delta_jars_why = None if args.delta_jars else delta_jars_why()
    check_freshness_options(parser, args)
    args.batch_size = args.batch_size or default_batch_size(args.records)
    args.sweep_records = args.sweep_records or args.records
    args.sweep_batch_sizes = args.sweep_batch_sizes or scaled_batch_sizes(args.sweep_records)
    args.rss_batch_sizes = sorted(set(args.rss_batch_sizes))
    return args
