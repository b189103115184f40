#!/usr/bin/env bash
# Starts or stops a development Kafka broker on 127.0.0.1 (Apache Kafka's own, one KRaft node, its
# state in .broker/, removed by stop; its jars are fetched once into ~/.cache/kafka-delta), and
# beside it the development Schema Registry (kafka_delta_dev/schema_registry_server.py; its URL
# in .broker.json). Where Kafka's jars cannot be fetched, the stand-in Tansu, saying so.
#   scripts/broker.sh start [--port 9092]    prints the bootstrap address, keeps it in .broker.json
#   scripts/broker.sh address                prints the running broker's address
#   scripts/broker.sh registry-url           prints the development Schema Registry's URL
#   scripts/broker.sh stop                   stops both
# scripts/produce.sh and scripts/run_local.sh read the address from .broker.json when no
# --bootstrap-servers is given: nothing needs the broker's port pasted in.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec python -m kafka_delta_dev.broker "$@" --state .broker.json
