#!/usr/bin/env bash
# Starts or stops the embedded Kafka-compatible broker (Tansu, memory storage) on 127.0.0.1.
#   scripts/broker.sh start [--port 9092]    prints the bootstrap address
#   scripts/broker.sh stop
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec python -m {{ cookiecutter.package_name }}.devtools.broker "$@" --state .broker.json
