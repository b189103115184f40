#!/usr/bin/env bash
# Runs the pipeline on the cluster engine locally: Spark's built-in kafka source and delta-spark.
# Their jars (delta-spark, Spark's kafka source, their dependencies), by the versions of the
# installed pyspark and delta-spark, come from Maven Central through the Ivy that pyspark ships
# (what spark-submit --packages uses; no Maven needed) into the user's cache
# (`python -m kafka_delta_dev.connector_jars resolve`: once, then reused by every run and by the
# tests). Where that fails, spark-submit is given the same coordinates with --packages, which
# says why. KAFKA_DELTA_JARS=<folder> passes every jar of a folder of one's own instead
# (an air-gapped machine): it must hold delta-spark's jars AND Spark's kafka source
# (spark-sql-kafka-0-10 with kafka-clients and spark-token-provider-kafka-0-10). With
# delta-spark's jars alone, use the embedded source: `engine: {source: embedded, sink:
# delta_spark}` in the config and KAFKA_DELTA_JARS=<folder> scripts/run_local.sh.
#   scripts/run_cluster_local.sh --bootstrap-servers 127.0.0.1:9092 [--trigger processing-time]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYSPARK_PYTHON:-$(command -v python)}"
if [ -z "${KAFKA_DELTA_JARS:-}" ]; then
  # The cached jars (kafka_delta_dev, the project's dev extra), fetched if new.
  KAFKA_DELTA_JARS="$("$PYTHON" -m kafka_delta_dev.connector_jars resolve 2>/dev/null)" || KAFKA_DELTA_JARS=""
  export KAFKA_DELTA_JARS
fi
if [ -n "${KAFKA_DELTA_JARS:-}" ]; then
  [ -d "$KAFKA_DELTA_JARS" ] || { echo "error: KAFKA_DELTA_JARS=$KAFKA_DELTA_JARS is not a folder" >&2; exit 2; }
  # This script forces Spark's kafka source (--engine cluster): without its jar the run would
  # only fail after Spark started, with a class-not-found trace.
  if [ -z "$(find "$KAFKA_DELTA_JARS" -maxdepth 1 -name 'spark-sql-kafka-0-10*.jar' -print -quit)" ]; then
    echo "error: the cluster engine reads with Spark's kafka source, whose jar (spark-sql-kafka-0-10, with kafka-clients) is not in KAFKA_DELTA_JARS=$KAFKA_DELTA_JARS; with delta-spark's jars alone, set engine: {source: embedded, sink: delta_spark} in the config and run KAFKA_DELTA_JARS=$KAFKA_DELTA_JARS scripts/run_local.sh" >&2
    exit 2
  fi
  exec scripts/run_local.sh --engine cluster "$@"  # it puts the folder's jars on --jars
fi
# Delta's extension and catalog over a Hive metastore in data/: tables by name outlive the run.
export SPARK_SUBMIT_EXTRA="--packages $(PYTHONPATH="$PWD/src" "$PYTHON" -m kafka_delta.runtime.connectors) \
  $(PYTHONPATH="$PWD/src" "$PYTHON" -m kafka_delta.runtime.connectors session-confs "$PWD/data") \
  ${SPARK_SUBMIT_EXTRA:-}"
exec scripts/run_local.sh --engine cluster "$@"
