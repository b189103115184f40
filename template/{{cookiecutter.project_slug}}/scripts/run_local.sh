#!/usr/bin/env bash
# Runs the pipeline with spark-submit in local mode, from this project's folder.
#   scripts/run_local.sh [--env local] [--bootstrap-servers 127.0.0.1:9092] [--trigger processing-time]
# Without --bootstrap-servers: the broker scripts/broker.sh started (its address is in
# .broker.json) when there is one, else kafka.bootstrap_servers of the config.
# Spark's Python workers import the package by name: they get src/ through PYTHONPATH and run
# this same interpreter (PYSPARK_PYTHON), or they fail with "Python worker failed to connect back".
# SPARK_SUBMIT_EXTRA adds spark-submit options (scripts/run_cluster_local.sh passes --packages).
# KAFKA_DELTA_JARS=<folder> puts every jar of that folder on spark-submit --jars, with Delta's
# session extension and catalog: the delta-spark sink without Maven access. The config's engine
# still picks the sink: `engine: {source: embedded, sink: delta_spark}` reads with the embedded
# source (no kafka connector jars needed) and writes with delta-spark from that folder's jars.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYSPARK_PYTHON:-$(command -v python)}"
# A cluster's master (SPARK_MASTER, or --master in SPARK_SUBMIT_EXTRA: the last one given wins,
# as in spark-submit) needs this project and the engine shipped to its executors, which this
# script does not do: scripts/submit.sh does, then runs this script with --py-files. Without
# them, a UDF calling the project's module failed on the executors (ModuleNotFoundError).
MASTER="${SPARK_MASTER:-local[2]}"
read -ra EXTRA <<< "${SPARK_SUBMIT_EXTRA:-}"
NEXT=""
for WORD in "${EXTRA[@]}"; do
  [ -n "$NEXT" ] && MASTER="$WORD"
  NEXT=""
  case "$WORD" in
    --master) NEXT=1 ;;
    --master=*) MASTER="${WORD#--master=}" ;;
  esac
done
case "$MASTER" in
  local | local\[*) ;;
  *) case " ${EXTRA[*]:-} " in
       *" --py-files "*) ;;  # shipped (scripts/submit.sh)
       *) echo "error: master $MASTER is a cluster's, and scripts/run_local.sh ships nothing to its executors: run scripts/submit.sh --master $MASTER, which ships this project and the engine" >&2
          exit 2 ;;
     esac ;;
esac
if [ -n "${KAFKA_DELTA_JARS:-}" ]; then
  [ -d "$KAFKA_DELTA_JARS" ] || { echo "error: KAFKA_DELTA_JARS=$KAFKA_DELTA_JARS is not a folder" >&2; exit 2; }
  JARS="$(find "$KAFKA_DELTA_JARS" -maxdepth 1 -name '*.jar' | sort | paste -sd, -)"
  [ -n "$JARS" ] || { echo "error: KAFKA_DELTA_JARS=$KAFKA_DELTA_JARS holds no .jar file" >&2; exit 2; }
  echo "run_local.sh: connector jars from $KAFKA_DELTA_JARS on --jars, with Delta's session extension" >&2
  # Delta's extension and catalog are what delta-spark needs outside Databricks, over a Hive
  # metastore in data/ so that tables by name (default.orders) outlive the run
  # (kafka_delta/runtime/connectors.py, local_delta_confs).
  SPARK_SUBMIT_EXTRA="--jars $JARS \
    $(PYTHONPATH="$PWD/src" "$PYTHON" -m kafka_delta.runtime.connectors session-confs "$PWD/data") \
    ${SPARK_SUBMIT_EXTRA:-}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# Spark starts its Python processes with its source zip of pyspark first on PYTHONPATH, which
# Python compiles anew in each (~1 s apiece): the launcher runs the same interpreter with the
# installed, compiled pyspark instead (kafka_delta/runtime/python_launcher.py).
SPARK_PYTHON="$("$PYTHON" -m kafka_delta.runtime.python_launcher)" || SPARK_PYTHON="$PYTHON"
export PYSPARK_PYTHON="$SPARK_PYTHON" PYSPARK_DRIVER_PYTHON="$SPARK_PYTHON"
ARGS=("$@")
case " $* " in
  *" --bootstrap-servers"*) ;;
  *) if [ -f .broker.json ]; then
       ADDRESS="$("$PYTHON" -m kafka_delta_dev.broker address --state .broker.json)"
       echo "run_local.sh: using the broker scripts/broker.sh started, at $ADDRESS" >&2
       ARGS=("$@" --bootstrap-servers "$ADDRESS")
     fi ;;
esac
# The JVM maps Spark's classes from a class-data archive, which the first run records as its JVM
# exits (kafka_delta/runtime/jvm_archive.py): later starts are 2-3 s shorter.
# SPARK_CLASS_ARCHIVE=off turns it off. $$ is the JVM's pid: this script and spark-submit exec.
JVM_ARCHIVE="$("$PYTHON" -m kafka_delta.runtime.jvm_archive options --pid $$)" || JVM_ARCHIVE=""
SPARK_SUBMIT="$(dirname "$PYTHON")/spark-submit"
[ -x "$SPARK_SUBMIT" ] || SPARK_SUBMIT=spark-submit
# Spark's launcher always adds the JDK module jdk.incubator.vector, and the JDK then prints
# "WARNING: Using incubator modules: jdk.incubator.vector" at every start, with no switch to
# silence it: that one line is dropped from stderr. The filter ignores SIGINT and SIGTERM (Ctrl-C
# reaches the whole process group) so that it passes on the run's last lines; it ends with them.
# spark-submit is exec'd: `kill <pid>` of this script reaches Spark's JVM, which hands the
# signal to the Python driver (a clean stop after the current micro-batch).
# shellcheck disable=SC2086
exec "$SPARK_SUBMIT" --master "${SPARK_MASTER:-local[2]}" ${SPARK_SUBMIT_EXTRA:-} \
  --conf spark.ui.showConsoleProgress=false \
  --driver-java-options "-Dlog4j2.configurationFile=file:$PWD/conf/log4j2.properties $JVM_ARCHIVE" \
  src/{{ cookiecutter.package_name }}/main.py "${ARGS[@]}" \
  2> >(trap '' INT TERM; exec grep --line-buffered -v '^WARNING: Using incubator modules: jdk\.incubator\.vector$' >&2)
