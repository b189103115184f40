"""Benchmark: the generated pipeline side by side with the machine's limits and a hand-written
ingest, on one Apache Kafka broker (KRaft, on 127.0.0.1; the stand-in Tansu only where Kafka's
jars cannot be had, which the table's heading says).

    scripts/bench [--records 1000000] [--partitions 4] [--batch-size B] [--no-sweep] \
[--no-memory] [--out .bench]
    scripts/bench --rows 4,5 --repeats 3 --no-sweep --no-memory   # while tuning the pipeline

Rows, each measured in its own process tree (records/s, wall seconds, start-up, RSS):

1. raw consume limit: confluent-kafka reading all partitions, one process per core;
2. raw Delta write limit: delta-rs appending the same rows, already parsed in Arrow;
3. simple ingest: one Python process, confluent-kafka -> pyarrow.json -> delta-rs, with the same
   exactly-once commit (a ``txn`` action and the end offsets in ``userMetadata``);
4. the generated pipeline on the delta-rs sink, exactly-once machinery on (txn, offsets in the
   commit, fencing, commit-back hook);
5. the same pipeline with that machinery off;
6. the pipeline on the delta-spark sink (engine {source: embedded, sink: delta_spark}),
   exactly-once on, with the connector jars of --delta-jars (default $KAFKA_DELTA_JARS, else the
   jars scripts/bootstrap resolved); without jars the row says so and is skipped;
7. the plain idempotent foreachBatch write on delta-spark (txnAppId/txnVersion), same jars;
8. row 4 on the same events as Confluent-framed Avro (development Schema Registry);
9. row 3 on those Avro events (fastavro);
10. the ceiling: the pipeline's read path (Kafka read, decoding, hand-off, transform) to Spark's
    noop sink, nothing written; its process first takes Spark's floor (scripts/spark_floor's
    queries, --floor-batches each), so one Spark start serves both;
11. the pipeline writing two tables from one read (``tables:``: ``all``, and ``paid`` by
    ``route: event_type = 'paid'``), exactly-once on, against the two single-table pipelines
    that fill the same tables by reading the topic twice (every event; the paid orders alone),
    all three last in the session's Spark session below (no Spark start of its own), on the
    main rows' events and batch size. Every table is checked (``paid``: each paid order once);
12. hand-written Structured Streaming, what a Databricks user writes: ``readStream`` of Spark's
    kafka source, ``from_json`` with the events' schema, ``writeStream`` of Delta's own sink;
13. the same read, each batch written by ``foreachBatch`` as Databricks documents an idempotent
    write (txnAppId/txnVersion);
14. the pipeline on the cluster engine (Spark's kafka source, delta-spark sink).
    Rows 12-14 need Spark's kafka source among the jars; they read with the Java client's own
    fetch.max.wait.ms (500) unless --jvm-fetch-max-wait-ms sets it (rows 4-11 read with
    conf/local.yaml's fetch.wait.max.ms 100: a fetch at a partition's live end waits that long
    for records). The delta-spark rows run
    in the order 12, 6, 7, 13, 14, so that drift touches the ratios of row 6 least.

records/s is steady state: from the end of the first batch (row 1: from creating the consumers)
to the end of the run, so JVM start, Python imports and warm-up are excluded; start-up is reported
on its own (process start to first committed batch), split into phases from the worker's log.
Every table is checked to hold exactly N rows with N distinct ids. The sweep runs the pipeline
over batch sizes (10k..500k records, scaled down for small --records) and partition counts
(1, 4, 16) and fits a line, batch seconds = fixed + marginal x records, per partition count. The
memory runs measure the driver's peak RSS with --rss-batch-sizes batches and its RSS batch by
batch over --memory-batches batches. Scale runs, off by default: --wide-topics 8 (a sweep
point over 8 topics, --wide-partitions 64 in all) and --many-batches 2000 (the cost of a steady
batch at the start of a long run against its end, as the table's versions grow: on the delta-rs
sink in the session; on the delta-spark sink, in a process of its own, with --many-batches-sink
delta_spark or both, where it also sets the sink's log reads at the start against the end).
Output in --out: bench.csv, bench.png, logs/.

Why per-step figures: reading the table's log through Spark (I14: ``DESCRIBE HISTORY``) is a
Spark job each time, and it must cost the same in batch 2,000 as in batch 2. Rows 6 and 14 print
what a steady batch spends reading the log (the check before the write, the read-back after it)
apart from the Delta write, from the engine's own step timings (each batch's progress record's
``steps``, kafka_delta.progress.batch.StepClock: clock reads around calls the batch makes
anyway, no Spark job); the CSV holds them as steady_check_s, steady_read_back_s,
steady_log_read_s, steady_write_s and steady_materialize_s.

The LAST line is machine-checkable (nan: not measured by this run, e.g. with --no-sweep):

    bench: pipeline_rps=<X> simple_ingest_rps=<Z> ratio_to_simple=<X/Z> batch_fixed_s=<F> \
us_per_record=<M> startup_s=<S> overhead_pct=<O> driver_rss_ratio=<R> delta_spark_rps=<D> \
delta_spark_to_plain=<D/P> avro_ratio_to_simple=<A> pipeline_to_ceiling=<X/C> \
startup_over_floor_s=<S-FF> fixed_over_floor_s=<F-FB> two_tables_to_two_pipelines=<T> \
fixed_over_python_floor_s=<F-FP> delta_spark_to_stream=<D/H> delta_spark_to_foreach_batch=<D/HF> \
cluster_to_stream=<K/H> delta_spark_log_read_s=<L>

X, Z, D, P, C, H, HF, K: rows 4, 3, 6, 7, 10, 12, 13, 14; L: row 6's steady batch's log reads
through Spark (check + read-back, seconds, from the engine's step timings); F, M: the sweep's
fit at 4 partitions; S: row 4's start-up;
O = (row 5 - row 4) / row 5 x 100; R = the Python driver's peak RSS with the largest
--rss-batch-sizes batches over that with the smallest; A = row 8 / row 9; FF, FB: Spark's floor
(first batch from process start, cost of a later batch), taken in row 10's process; FP: the
floor's later batch handed to Python tasks to be written (mapInArrow), as the delta-rs sink's
files are, writing nothing; T = a
record's steady cost in row 11 over its cost in the two single-table pipelines, 1/X11 /
(1/Xall + 1/Xpaid): below 1, writing two tables from one read costs less.
"""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib.cli import parse_args
from benchlib.procs import worker_main
from benchlib.runner import Bench


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # A crash inside a native library (librdkafka, delta-rs) prints the Python stack it hit.
    faulthandler.enable()
    if argv[:1] == ["_worker"]:
        return worker_main(argv[1])
    return Bench(parse_args(argv, description=__doc__)).run()


if __name__ == "__main__":
    from kafka_delta.runtime.process_exit import run_and_exit  # the real exit status, see there

    run_and_exit(main)
