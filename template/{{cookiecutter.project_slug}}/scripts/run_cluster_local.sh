#!/usr/bin/env bash
# Runs the pipeline on the cluster engine locally: Spark's built-in kafka source and delta-spark,
# whose jars spark-submit fetches with --packages (needs access to Maven Central, or a mirror set
# with spark.jars.repositories). The coordinates match the installed pyspark and delta-spark
# (io.delta:delta-spark_<spark major.minor>_2.13, delta-spark's own rule): see connector_packages().
# Without Maven access (air-gapped), KAFKA_DELTA_JARS=<folder> passes every jar of that folder
# with --jars instead: delta-spark's jars, and spark-sql-kafka's with kafka-clients.
#   scripts/run_cluster_local.sh --bootstrap-servers 127.0.0.1:9092 [--trigger processing-time]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYSPARK_PYTHON:-$(command -v python)}"
if [ -n "${KAFKA_DELTA_JARS:-}" ]; then
  [ -d "$KAFKA_DELTA_JARS" ] || { echo "error: KAFKA_DELTA_JARS=$KAFKA_DELTA_JARS is not a folder" >&2; exit 2; }
  JARS="$(find "$KAFKA_DELTA_JARS" -maxdepth 1 -name '*.jar' | sort | paste -sd, -)"
  [ -n "$JARS" ] || { echo "error: $KAFKA_DELTA_JARS holds no .jar file" >&2; exit 2; }
  CONNECTORS="--jars $JARS"
else
  CONNECTORS="--packages $(PYTHONPATH="$PWD/src" "$PYTHON" -m {{ cookiecutter.package_name }}.connectors)"
fi
export SPARK_SUBMIT_EXTRA="$CONNECTORS \
  --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
  --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"
exec scripts/run_local.sh --engine cluster "$@"
