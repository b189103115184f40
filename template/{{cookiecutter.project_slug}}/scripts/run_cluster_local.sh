#!/usr/bin/env bash
# Runs the pipeline on the cluster engine locally: Spark's built-in kafka source and delta-spark,
# whose jars spark-submit fetches with --packages (needs access to Maven Central, or a mirror set
# with spark.jars.repositories). The coordinates match the installed pyspark and delta-spark.
#   scripts/run_cluster_local.sh --bootstrap-servers 127.0.0.1:9092 [--trigger processing-time]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYSPARK_PYTHON:-$(command -v python)}"
PACKAGES="$(PYTHONPATH="$PWD/src" "$PYTHON" -m {{ cookiecutter.package_name }}.engine)"
export SPARK_SUBMIT_EXTRA="--packages $PACKAGES \
  --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
  --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"
exec scripts/run_local.sh --engine cluster "$@"
