#!/usr/bin/env bash
# Starts or stops a Spark standalone cluster on 127.0.0.1, from the installed pyspark's own jars:
# a master and two workers of one core and 1 GiB each (kafka_delta_dev/standalone_cluster.py, the
# dev extra), to try scripts/submit.sh on this machine as on a cluster of several.
#   scripts/spark_cluster.sh start [--workers 2] [--cores 1] [--memory 1g]
#                                    prints the master's URL, keeps it in .cluster.json
#   scripts/spark_cluster.sh address   prints the running master's URL
#   scripts/spark_cluster.sh stop      stops the workers and the master, each by its pid
# The workers' work folders (one per executor: its stdout, stderr and the files the application
# shipped) and the daemons' logs are in data/cluster/. The master's web UI (its URL is printed on
# stderr) lists the applications submitted to it. scripts/submit.sh reads the master's URL from
# .cluster.json when no --master is given.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m kafka_delta_dev.standalone_cluster "$@" --state .cluster.json
