#!/usr/bin/env bash
# Runs the pipeline on a Spark cluster: builds this project's wheel and the engine's, ships both
# to the executors, and submits to the master given, the driver on this machine (client mode).
#   scripts/submit.sh [--master URL] [--python PATH] [pipeline options: --env, --table, ...]
# --master: spark://HOST:PORT (standalone), yarn, k8s://https://HOST:PORT; else $SPARK_MASTER;
#   else the cluster scripts/spark_cluster.sh started (.cluster.json).
# --python: the Python the executors run, on every node (spark.pyspark.python); it must have the
#   engine's dependencies (pyspark, pyarrow, confluent-kafka, deltalake...; installing the
#   engine's wheel on the nodes' image brings them). Default: this interpreter for a cluster on
#   this machine (127.0.0.1), Spark's own default (python3) for any other. With a packed
#   environment: SPARK_SUBMIT_EXTRA="--archives env.tar.gz#environment" --python
#   ./environment/bin/python.
# Why wheels: the executors of a cluster import your package (the transform, the helpers its UDFs
# call) and the engine by name, on machines that do not have this folder. The two wheels are
# shipped with --py-files, which Spark puts first on the executors' Python path (as .zip files:
# Spark adds .zip, .egg and .jar files to that path, not .whl); the driver imports the same.
# Tables and the checkpoint must be on storage every node sees (HDFS, s3a://, abfss://, a shared
# mount): --table and --checkpoint, or a config of their own (--env NAME). On a cluster on this
# machine a local path is shared by all its executors.
# Everything else is scripts/run_local.sh's: the broker of .broker.json, KAFKA_DELTA_JARS for the
# cluster engine's connector jars (shipped with --jars), SPARK_SUBMIT_EXTRA for spark-submit.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="$(command -v python)"
MASTER="${SPARK_MASTER:-}"
NODES_PYTHON=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --master) MASTER="$2"; shift 2 ;;
    --master=*) MASTER="${1#--master=}"; shift ;;
    --python) NODES_PYTHON="$2"; shift 2 ;;
    --python=*) NODES_PYTHON="${1#--python=}"; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [ -z "$MASTER" ]; then
  if [ -f .cluster.json ]; then
    MASTER="$("$PYTHON" -m kafka_delta_dev.standalone_cluster address --state .cluster.json)"
    echo "submit.sh: submitting to the cluster scripts/spark_cluster.sh started, at $MASTER" >&2
  else
    echo "error: no master: pass --master URL (spark://HOST:PORT, yarn, k8s://...), set SPARK_MASTER, or start one here with scripts/spark_cluster.sh start" >&2
    exit 2
  fi
fi
case "$MASTER" in
  local*) echo "error: --master $MASTER is a local master: run scripts/run_local.sh instead" >&2; exit 2 ;;
  spark://127.0.0.1:*|spark://localhost:*)
    # A cluster on this machine: the driver listens on loopback too, where its executors are.
    export SPARK_LOCAL_IP=127.0.0.1
    NODES_PYTHON="${NODES_PYTHON:-$PYTHON}" ;;
esac
NODES_PYTHON="${NODES_PYTHON:-python3}"

# The wheels the bundle deploys to Databricks, built the same way (databricks.yml, artifacts).
OUT=dist/submit
rm -rf "$OUT" && mkdir -p "$OUT"
ISOLATION=""
"$PYTHON" -c 'import hatchling' 2>/dev/null && ISOLATION="--no-build-isolation"
# shellcheck disable=SC2086
"$PYTHON" -m pip wheel -q --no-deps $ISOLATION --wheel-dir "$OUT" . >&2
# The engine's wheel of the project's pin (pyproject.toml), as the bundle builds it.
"$PYTHON" scripts/engine_wheel.py "$OUT" >&2
SHIPPED=""
for wheel in "$OUT"/*.whl; do
  cp "$wheel" "${wheel%.whl}.zip"
  SHIPPED="${SHIPPED:+$SHIPPED,}$PWD/${wheel%.whl}.zip"
done
echo "submit.sh: shipping $(basename -a "$OUT"/*.zip | paste -sd' ' -) to the executors, which run $NODES_PYTHON" >&2

# The driver runs this interpreter (its launcher, kafka_delta/runtime/python_launcher.py); the
# executors the nodes' Python. Both as confs, which win over scripts/run_local.sh's environment.
DRIVER_PYTHON="$("$PYTHON" -m kafka_delta.runtime.python_launcher)" || DRIVER_PYTHON="$PYTHON"
# The embedded engine's Kafka source is a Python data source: Spark plans its batches in Python
# processes the driver's JVM starts, with the executors' interpreter, and Spark 4.2 does not hand
# those the --py-files (ModuleNotFoundError: No module named 'kafka_delta' as the stream starts).
# They inherit the JVM's PYTHONPATH: the shipped wheels go there too.
export PYTHONPATH="${SHIPPED//,/:}${PYTHONPATH:+:$PYTHONPATH}"
export SPARK_MASTER="$MASTER"
export SPARK_SUBMIT_EXTRA="--py-files $SHIPPED \
  --conf spark.pyspark.python=$NODES_PYTHON --conf spark.pyspark.driver.python=$DRIVER_PYTHON \
  ${SPARK_SUBMIT_EXTRA:-}"
exec scripts/run_local.sh "${ARGS[@]}"
